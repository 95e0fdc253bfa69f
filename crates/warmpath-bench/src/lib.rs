//! warmpath-bench: what warmpath is worth, measured (docs/bench.md).

pub mod compare;
pub mod dist;
pub mod error;
pub mod lru_refs;
pub mod offline;
pub mod optimum;
pub mod scale;
pub mod sim;
pub mod stats;
pub mod timing;
pub mod words;
pub mod workload;

pub use error::BenchError;

/// The defaults of the flag group `T`: what parsing no flags gives.
pub(crate) fn flag_defaults<T: clap::Args>() -> T {
    let matches = T::augment_args(clap::Command::new("defaults")).get_matches_from(["defaults"]);
    T::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}
