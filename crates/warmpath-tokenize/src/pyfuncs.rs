//! The Python helpers Hugging Face puts into the chat-template environment:
//! `raise_exception`, `strftime_now` and a `tojson` that formats like Python's
//! `json.dumps(ensure_ascii=False)` (minijinja's own escapes HTML characters,
//! which would change the rendered prompt and so its tokens).

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// `raise_exception(message)`: aborts rendering with the template's message.
pub(crate) fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current time (UTC) formatted like Python's
/// `strftime`; supports `%Y %y %m %d %e %j %H %I %M %S %p %a %A %b %h %B %%`.
pub(crate) fn strftime_now(format: String) -> Result<String, Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

const MONTHS: &str =
    "January February March April May June July August September October November December";
const DAYS: &str = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday";

/// Formats `secs` since the Unix epoch (UTC).
pub(crate) fn strftime(format: &str, secs: u64) -> Result<String, Error> {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (hour, minute, second) = (rem / 3600, rem / 60 % 60, rem % 60);
    let (year, month, day) = civil_from_days(days);
    let weekday = ((days + 3) % 7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let month_name = MONTHS.split(' ').nth((month - 1) as usize).unwrap_or("");
        let day_name = DAYS.split(' ').nth(weekday).unwrap_or("");
        // Writing to a String cannot fail.
        let _ = match chars.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year % 100),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('j') => write!(out, "{yday:03}"),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{:02}", (hour + 11) % 12 + 1),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('a') => write!(out, "{}", day_name.get(..3).unwrap_or("")),
            Some('A') => write!(out, "{day_name}"),
            Some('b') | Some('h') => write!(out, "{}", month_name.get(..3).unwrap_or("")),
            Some('B') => write!(out, "{month_name}"),
            Some('%') => write!(out, "%"),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{}",
                        other.unwrap_or(' ')
                    ),
                ))
            }
        };
    }
    Ok(out)
}

/// Days since 1970-01-01 to (year, month, day); Howard Hinnant's algorithm.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `tojson(value, indent=None, sort_keys=False)` as Hugging Face defines it:
/// `json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys)`.
pub(crate) fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value cannot be serialised",
        )
        .with_source(e)
    })?;
    let mut out = String::new();
    write_py_json(&mut out, &json, indent, sort_keys.unwrap_or(false), 0);
    Ok(Value::from_safe_string(out))
}

/// Writes `v` the way Python's `json.dumps` does (separators `", "`/`": "`, or
/// `","` plus newlines when indenting).
pub(crate) fn write_py_json(
    out: &mut String,
    v: &serde_json::Value,
    indent: Option<usize>,
    sort_keys: bool,
    depth: usize,
) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    };
    let (open, close, mut entries): (char, char, Vec<(Option<&String>, &J)>) = match v {
        J::Array(a) => ('[', ']', a.iter().map(|x| (None, x)).collect()),
        J::Object(o) => ('{', '}', o.iter().map(|(k, x)| (Some(k), x)).collect()),
        // Null, booleans, numbers and strings print as serde_json prints them.
        scalar => return out.push_str(&scalar.to_string()),
    };
    if sort_keys {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
    }
    out.push(open);
    if entries.is_empty() {
        out.push(close);
        return;
    }
    for (i, (key, x)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push_str(if indent.is_some() { "," } else { ", " });
        }
        newline(out, depth + 1);
        if let Some(k) = key {
            out.push_str(&J::String(k.clone()).to_string());
            out.push_str(": ");
        }
        write_py_json(out, x, indent, sort_keys, depth + 1);
    }
    newline(out, depth);
    out.push(close);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strftime_known_dates() {
        // 2024-07-23 13:05:09 UTC was a Tuesday, day 205 of a leap year.
        let t = 1_721_739_909;
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "23 Jul 2024");
        assert_eq!(
            strftime("%A %B %e %j %H:%M:%S %I%p %y %%", t).unwrap(),
            "Tuesday July 23 205 13:05:09 01PM 24 %"
        );
        assert_eq!(strftime("%Y-%m-%d %a", 0).unwrap(), "1970-01-01 Thu");
        assert_eq!(strftime("%Y-%m-%d", 951_782_400).unwrap(), "2000-02-29");
        assert!(strftime("%Q", 0).is_err());
    }

    #[test]
    fn py_json_matches_python_dumps() {
        let v = json!({"name": "get", "args": [1, "é\n\"", null, true], "e": {}});
        let mut s = String::new();
        write_py_json(&mut s, &v, None, true, 0);
        // json.dumps(v, ensure_ascii=False, sort_keys=True)
        assert_eq!(
            s,
            "{\"args\": [1, \"é\\n\\\"\", null, true], \"e\": {}, \"name\": \"get\"}"
        );
        let mut s = String::new();
        write_py_json(&mut s, &json!({"a": [1, 2], "b": "<x>"}), Some(2), false, 0);
        assert_eq!(s, "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": \"<x>\"\n}");
    }
}
