//! JSONL traces: one [`TraceRequest`] per line (blank lines and lines starting
//! with `#` are skipped). Arrivals need not be sorted; reading sorts them.

use super::spec::TraceRequest;
use crate::error::{io, BenchError};
use std::io::BufRead;
use std::path::Path;

/// Parses a JSONL trace from a reader; `origin` names it in errors.
pub fn read_from(reader: impl BufRead, origin: &str) -> Result<Vec<TraceRequest>, BenchError> {
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(io(Path::new(origin)))?;
        let text = line.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let bad = |reason: String| BenchError::Trace {
            origin: origin.to_owned(),
            line: i + 1,
            reason,
        };
        let r: TraceRequest = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        r.validate().map_err(bad)?;
        out.push(r);
    }
    if out.is_empty() {
        return Err(BenchError::Trace {
            origin: origin.to_owned(),
            line: 0,
            reason: "the trace holds no request".into(),
        });
    }
    out.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
    Ok(out)
}

pub fn read(path: &Path) -> Result<Vec<TraceRequest>, BenchError> {
    let f = std::fs::File::open(path).map_err(io(path))?;
    read_from(std::io::BufReader::new(f), &path.display().to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::workload::{generate, WorkloadKind, WorkloadSpec};

    #[test]
    fn generated_traces_read_back_from_a_file() {
        let spec = WorkloadSpec {
            requests: 20,
            prefix_tokens: 100,
            ..WorkloadSpec::new(WorkloadKind::Tenants)
        };
        let trace = generate(&spec).unwrap();
        let dir = std::env::temp_dir().join(format!("warmpath-bench-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.jsonl");
        let lines: Vec<String> = trace
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        std::fs::write(&path, lines.join("\n")).unwrap();
        let back = read(&path).unwrap();
        assert_eq!(back.len(), trace.len());
        for (a, b) in back.iter().zip(&trace) {
            // JSON floats round-trip to within an ulp or so.
            assert!((a.arrival - b.arrival).abs() < 1e-12);
            assert!(a.messages == b.messages && a.tenant == b.tenant && a.group == b.group);
            assert!(a.tenant_via == b.tenant_via && a.max_tokens == b.max_tokens);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn user_trace_lines_parse_with_defaults_and_sort() {
        let text = "# my trace\n\
            {\"arrival\": 1.5, \"model\": \"m\", \"prompt\": \"hello\"}\n\
            \n\
            {\"arrival\": 0.5, \"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 4, \"tenant\": \"acme\"}\n";
        let t = read_from(text.as_bytes(), "mem").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].arrival, 0.5);
        assert_eq!(t[0].max_tokens, 4);
        assert_eq!(t[1].max_tokens, 32);
        assert_eq!(t[1].path(), "/v1/completions");
        assert_eq!(t[0].body(false)["prompt_cache_key"], "acme");
    }

    #[test]
    fn bad_lines_name_their_line() {
        let cases = [
            "{\"arrival\": 1, \"model\": \"m\"}",
            "{\"arrival\": -1, \"model\": \"m\", \"prompt\": \"x\"}",
            "{\"arrival\": 1, \"model\": \"m\", \"prompt\": \"x\", \"messages\": [{\"role\":\"user\",\"content\":\"y\"}]}",
            "not json",
            "{\"arrival\": 1, \"model\": \"m\", \"prompt\": \"x\", \"surprise\": 1}",
        ];
        for c in cases {
            let text = format!("{{\"arrival\": 0, \"model\": \"m\", \"prompt\": \"ok\"}}\n{c}\n");
            match read_from(text.as_bytes(), "mem") {
                Err(BenchError::Trace { line, .. }) => assert_eq!(line, 2, "{c}"),
                other => panic!("{c}: {other:?}"),
            }
        }
        assert!(read_from("".as_bytes(), "mem").is_err());
    }
}
