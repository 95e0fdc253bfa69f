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
