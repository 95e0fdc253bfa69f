//! How agents prove who they are.

/// How agents prove who they are.
#[derive(Clone, Default)]
pub enum AgentAuth {
    /// Anyone who reaches the port may publish for any worker.
    #[default]
    Open,
    /// Each agent presents its worker's credential derived from this secret.
    PerWorker(String),
}

impl AgentAuth {
    /// From the config's per-worker `secret`.
    pub fn new(secret: Option<String>) -> Self {
        secret.map_or(AgentAuth::Open, AgentAuth::PerWorker)
    }

    pub(super) fn name(&self) -> &'static str {
        match self {
            AgentAuth::Open => "open",
            AgentAuth::PerWorker(_) => "per-worker credentials",
        }
    }
}

impl std::fmt::Debug for AgentAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
