//! Checks that need a tool from Debian's packages (kubectl, promtool,
//! chromium) skip loudly where it is missing, and fail instead when
//! `WARMPATH_REQUIRE_TOOLS=1` (which `.ci/run` sets, after installing them):
//! a check that CI believes ran must never pass by skipping.

/// Says that `tool` is missing, so `what` is not checked: a loud skip, or a
/// panic under `WARMPATH_REQUIRE_TOOLS=1`.
pub(crate) fn missing(tool: &str, what: &str) {
    let message = format!("{tool} is not installed: {what} NOT CHECKED");
    if std::env::var_os("WARMPATH_REQUIRE_TOOLS").is_some_and(|v| v == "1") {
        panic!("{message} (WARMPATH_REQUIRE_TOOLS=1: a required tool is missing)");
    }
    eprintln!("\n*** SKIPPED: {message} ***\n");
}
