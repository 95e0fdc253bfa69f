//! Child processes of a comparison (router replicas, candle engines): each
//! prints its bound addresses on stdout, which [`spawn_ready`] reads; its
//! stderr goes to a file quoted when it fails to start; `kill_on_drop`, so
//! an error or a panic on the way out leaves no orphan.

use crate::error::{ensure, io, BenchError};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The `name` binary: `given`, else the one beside the running executable
/// (where cargo builds it, same profile); an error quoting `build` (how to
/// build it) when it is not there.
pub(crate) fn binary(name: &str, given: Option<&Path>, build: &str) -> Result<PathBuf, BenchError> {
    let binary = match given {
        Some(b) => b.to_path_buf(),
        None => std::env::current_exe()
            .map_err(io(Path::new("current executable")))?
            .with_file_name(format!("{name}{}", std::env::consts::EXE_SUFFIX)),
    };
    let why = format!("{} not found; {build}", binary.display());
    ensure(binary.is_file(), "binary", &why)?;
    Ok(binary)
}

/// Starts `cmd` (`what` names it in errors: `router 2`), its stderr into
/// `log`, and reads the value after each of `keys` from its stdout lines
/// until `keys[ready]` has one, within `timeout`. An error quotes the log's tail.
pub(crate) async fn spawn_ready<const N: usize>(
    mut cmd: Command,
    what: &str,
    log: &Path,
    timeout: Duration,
    (keys, ready): ([&str; N], usize),
) -> Result<(Child, [Option<String>; N]), BenchError> {
    let failed = |reason: String| BenchError::Component {
        what: what.to_owned(),
        reason: format!("{reason}; log: {}", log_tail(log)),
    };
    let stderr = std::fs::File::create(log).map_err(io(log))?;
    let program = cmd.as_std().get_program().to_owned();
    let mut child = cmd
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .map_err(io(Path::new(&program)))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| failed("no stdout pipe".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let mut found: [Option<String>; N] = std::array::from_fn(|_| None);
    let read = async {
        while found[ready].is_none() {
            let l = lines
                .next_line()
                .await
                .map_err(|e| failed(format!("reading its output: {e}")))?
                .ok_or_else(|| failed("exited before listening".into()))?;
            for (key, value) in keys.iter().zip(&mut found) {
                if let Some(v) = l.strip_prefix(key) {
                    *value = Some(v.trim().to_owned());
                }
            }
        }
        Ok::<(), BenchError>(())
    };
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| failed(format!("not listening after {timeout:?}")))??;
    // Nothing else is printed on stdout; keep draining it so a stray line
    // can never block the child. The task ends with the pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, found))
}

/// The last lines of a log file, for error messages.
pub(crate) fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(5)..].join(" | ");
    if tail.is_empty() {
        format!("{} (empty)", path.display())
    } else {
        tail
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let p = std::env::temp_dir().join(format!("warmpath-bench-log-{}", std::process::id()));
        std::fs::write(&p, "a\nb\nc\nd\ne\nf\ng\n").unwrap();
        assert_eq!(log_tail(&p), "c | d | e | f | g");
        std::fs::remove_file(&p).unwrap();
        assert!(log_tail(&p).ends_with("(empty)"));
    }

    #[tokio::test]
    async fn ready_lines_are_read_and_a_silent_exit_is_a_clear_error() {
        let log = std::env::temp_dir().join(format!("warmpath-bench-child-{}", std::process::id()));
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo hello; echo events on tcp://y; echo listening on http://x; sleep 5",
        ]);
        let keys = (["listening on ", "events on ", "replay on "], 0);
        let (mut child, found) = spawn_ready(cmd, "shell", &log, Duration::from_secs(5), keys)
            .await
            .unwrap();
        assert_eq!(
            found,
            [Some("http://x".into()), Some("tcp://y".into()), None]
        );
        child.kill().await.unwrap();

        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo oops >&2; exit 3"]);
        let err = spawn_ready(cmd, "shell", &log, Duration::from_secs(5), (["x"], 0))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("exited before listening"), "{err}");
        assert!(err.contains("oops"), "{err}");

        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 5"]);
        let err = spawn_ready(cmd, "shell", &log, Duration::from_millis(200), (["x"], 0))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("not listening after"), "{err}");
        std::fs::remove_file(&log).unwrap();
    }
}
