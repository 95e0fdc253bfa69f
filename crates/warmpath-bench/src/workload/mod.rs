//! Workloads: seeded, reproducible request traces with Poisson arrivals.
//!
//! A workload is a list of [`TraceRequest`]s, each with an arrival time in
//! seconds from the start. The same record is what a user's own JSONL trace
//! holds ([`trace`]), so generated and replayed traces take the same path.
//!
//! Arrival gaps are unit exponential samples divided by the rate, and the text
//! of every request is drawn from the same RNG stream independently of the
//! rate, so changing `rate` (the rate search of `compare`) only stretches the
//! time axis: the requests themselves stay identical.
//!
//! | kind | shape |
//! |---|---|
//! | `long` | one of `docs` ~8000-token documents (Zipf popularity) + a distinct ~50-token question |
//! | `short` | multi-turn chats; each turn resends the history, which grows from ~200 to ~2000 tokens; replayed closed loop per conversation (see [`CONVERSATION_PREFIX`]) |
//! | `rag` | shared system prompt + 3 retrieved chunks (the first one Zipf-popular) + a question |
//! | `code` | completion API: a source file (Zipf) as prefix + a short instruction |
//! | `tenants` | one shared system prompt, `tenants` tenants via `prompt_cache_key` or `X-Prefix-Aware-Id` |

mod gen;
mod spec;
pub mod trace;

pub use gen::generate;
pub use spec::{
    rescale, BadRecord, ChatMessage, TenantVia, TraceRequest, WorkloadKind, WorkloadSpec,
    CONVERSATION_PREFIX,
};
