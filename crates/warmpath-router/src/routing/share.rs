//! The seam between routing and the other router replicas (docs/replicas.md):
//! this router's decisions go out through a [`DecisionSink`], and the others'
//! come in through a [`DecisionSource`]. The ingest implements both
//! (`ingest::peers`) and relays them through the agents; routing sees no
//! streams. The other replicas' decisions also reach the pool's policy, as
//! they arrive, through the ingest (`PoolDirectory::observe_remote`).

/// One routing decision as the other replicas need it (by worker ids).
#[derive(Clone, Debug, Default)]
pub(crate) struct Fact {
    pub(crate) worker: String,
    pub(crate) prefix_key: u64,
    /// Full blocks of the request's chain.
    pub(crate) chain_blocks: u32,
    /// Blocks predicted uncached there.
    pub(crate) prefill_blocks: u64,
    /// The prefix's home after the pick ("" when the policy keeps none).
    pub(crate) home: String,
    /// Its deliberate copies.
    pub(crate) copies: Vec<String>,
}

/// Where routing's decisions go.
pub(crate) trait DecisionSink: Send + Sync {
    /// Tells the other replicas a request started; the handle tells the rest.
    fn start(&self, model: &str, fact: Fact) -> Option<Box<dyn SharedRequest>>;
}

/// The rest of one shared request.
pub(crate) trait SharedRequest: Send + Sync + std::fmt::Debug {
    /// Its first upstream byte arrived.
    fn prefilled(&mut self);
}

/// What the other replicas' decisions add to a backend's load.
pub(crate) trait DecisionSource: Send + Sync {
    /// Their requests in flight on `worker` of pool `model`, and their prefill blocks to come.
    fn remote_load(&self, model: &str, worker: &str) -> (u32, u64);
    /// Whether [`remote_load`](Self::remote_load) may answer anything but zeros.
    fn counts_remote(&self) -> bool;
}

/// The other replicas, while this router shares its decisions with them.
#[derive(Clone, Copy)]
pub(crate) struct Replicas<'a> {
    pub(crate) sink: &'a dyn DecisionSink,
    pub(crate) source: &'a dyn DecisionSource,
}
