//! The seam through which routing tells the other replicas what it decided
//! ([`DecisionSink`], implemented by the ingest); routing sees no streams.

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
