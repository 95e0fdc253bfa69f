//! warmpath-agent: runs beside one engine instance and tells every router which
//! KV-cache blocks that instance holds. The flow: [`follow`] (one per engine
//! rank) → [`tracker`] → [`hub`] → [`link`] (one per router, listed by
//! [`replicas`]); [`agent`] wires them. docs/agent.md describes each part.

pub mod agent;
pub mod cli;
mod closure;
mod error;
pub mod follow;
pub mod hub;
pub mod link;
pub mod load;
pub mod ready;
pub mod replay;
pub mod replicas;
mod series;
pub mod serve;
pub mod stats;
pub mod tls;
pub mod tracker;
pub mod zmtp_guard;

pub use agent::Agent;
pub use cli::AgentConfig;
pub use error::AgentError;
