//! Workloads: seeded, reproducible request traces with Poisson arrivals
//! (the kinds are in docs/bench.md). A user's JSONL trace holds the same
//! records ([`trace`]), so generated and replayed traces take the same path.

mod gen;
mod spec;
pub mod trace;

pub use gen::generate;
pub use spec::{
    rescale, ChatMessage, TenantVia, TraceRequest, WorkloadKind, WorkloadSpec, CONVERSATION_PREFIX,
};
