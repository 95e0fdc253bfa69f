//! How both binaries log: to stderr (stdout carries only the lines scripts
//! read, such as the bound address), as text or one JSON object per line
//! (`--log-format`), with ANSI colour only when stderr is a terminal, and the
//! level from `RUST_LOG` (default `info`).

use std::io::IsTerminal;
use std::str::FromStr;
use tracing_subscriber::EnvFilter;

/// `--log-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, with the current span's fields (the
    /// router's `request_id`) under `span`.
    Json,
}

/// A `--log-format` value that is neither `text` nor `json`.
#[derive(Debug, thiserror::Error)]
#[error("unknown log format `{0}`: expected text or json")]
pub struct UnknownLogFormat(String);

impl FromStr for LogFormat {
    type Err = UnknownLogFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(UnknownLogFormat(other.to_owned())),
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

/// The filter: `RUST_LOG` (default `info`), with each of `quiet`'s targets
/// off unless it names that target.
fn filter_spec(rust_log: Option<&str>, quiet: &[&str]) -> String {
    let mut spec = rust_log
        .filter(|s| !s.trim().is_empty())
        .unwrap_or("info")
        .to_owned();
    for t in quiet {
        if !spec.contains(t) {
            spec.push_str(&format!(",{t}=off"));
        }
    }
    spec
}

/// Installs the process's log subscriber (once, first thing in `main`), the
/// `quiet` targets off unless `RUST_LOG` names them (the router's access log:
/// `RUST_LOG=info,warmpath_router::access=info`).
pub fn init_logging(format: LogFormat, quiet: &[&str]) {
    let env = std::env::var("RUST_LOG").ok();
    let filter = EnvFilter::try_new(filter_spec(env.as_deref(), quiet))
        .unwrap_or_else(|_| EnvFilter::new(filter_spec(None, quiet)));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        // Colour codes in a file or a pipe are noise to every reader.
        LogFormat::Text => fmt.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => fmt
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_print_back() {
        for f in [LogFormat::Text, LogFormat::Json] {
            assert_eq!(f.to_string().parse::<LogFormat>().unwrap(), f);
        }
        let e = "yaml".parse::<LogFormat>().unwrap_err().to_string();
        assert!(e.contains("yaml") && e.contains("text or json"), "{e}");
    }

    #[test]
    fn quiet_targets_stay_off_unless_the_filter_names_them() {
        let q = ["app::access"];
        assert_eq!(filter_spec(None, &q), "info,app::access=off");
        assert_eq!(filter_spec(Some(" "), &[]), "info");
        assert_eq!(filter_spec(Some("debug"), &q), "debug,app::access=off");
        let named = "warn,app::access=info";
        assert_eq!(filter_spec(Some(named), &q), named);
    }
}
