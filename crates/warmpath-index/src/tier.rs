//! Where a cached block lives.

use serde::{Deserialize, Serialize};

/// Where a cached block lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// GPU memory: immediately usable.
    Gpu = 0,
    /// CPU memory (offloaded): must be copied back.
    Cpu = 1,
    /// Local disk or remote storage.
    Disk = 2,
}

impl Tier {
    /// All tiers, GPU first.
    pub const ALL: [Tier; 3] = [Tier::Gpu, Tier::Cpu, Tier::Disk];

    pub(crate) fn bit(self) -> u8 {
        1 << self as u8
    }
}
