//! The credential files both binaries read at start-up or connect: bounded
//! before they are read, so a wrong path (a log, a device) fails fast.

use std::path::Path;

/// The file at `path`, refused past `max` bytes; the error says why.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let len = std::fs::metadata(path)
        .map_err(|e| format!("cannot read: {e}"))?
        .len();
    if len > max {
        return Err(format!("{len} bytes is too large (at most {max})"));
    }
    std::fs::read(path).map_err(|e| format!("cannot read: {e}"))
}

/// The PEM file at `path` (at most 1 MiB), checked to hold a `kind` block
/// (`CERTIFICATE`, `PRIVATE KEY`).
pub fn read_pem(path: &Path, kind: &str) -> Result<Vec<u8>, String> {
    let bytes = read_bounded(path, 1 << 20)?;
    let found = String::from_utf8_lossy(&bytes).lines().any(|l| {
        l.trim()
            .strip_prefix("-----BEGIN ")
            .is_some_and(|rest| rest.trim_end_matches('-').ends_with(kind))
    });
    if !found {
        return Err(format!("no PEM \"{kind}\" block in the file"));
    }
    Ok(bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn files_are_bounded_and_pem_blocks_found_by_kind() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.pem");
        assert!(read_bounded(&p, 10).unwrap_err().contains("cannot read"));
        std::fs::write(&p, "-----BEGIN EC PRIVATE KEY-----\nx\n").unwrap();
        assert!(read_bounded(&p, 10).unwrap_err().contains("too large"));
        assert!(read_pem(&p, "PRIVATE KEY").is_ok());
        let e = read_pem(&p, "CERTIFICATE").unwrap_err();
        assert!(e.contains("no PEM \"CERTIFICATE\""), "{e}");
    }
}
