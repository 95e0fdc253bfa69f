//! vLLM's KV-cache event model (`vllm/distributed/kv_events.py`), as the
//! decoder produces it and the encoder consumes it.

use rmpv::Value;
use std::fmt;

/// One engine-side block hash. vLLM sends a uint64 by default (the last 8 bytes
/// of its digest); with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0` raw bytes; old
/// releases signed ints, which are kept as their two's-complement bits.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum EngineBlockHash {
    Int(u64),
    /// A byte-string hash (16 or 32 bytes in practice).
    Bytes(Vec<u8>),
}

impl fmt::Debug for EngineBlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineBlockHash::Int(v) => write!(f, "Int({v:#x})"),
            EngineBlockHash::Bytes(b) => {
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                write!(f, "Bytes({hex})")
            }
        }
    }
}

/// Where vLLM stored a block (`medium`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Medium {
    /// `"GPU"`: the engine's own KV cache.
    Gpu,
    /// `"CPU"`: host memory through an offloading connector.
    Cpu,
    /// `"STORAGE"` (or `"DISK"`): a storage connector.
    Storage,
    /// Any other string, kept verbatim.
    Other(String),
}

impl Medium {
    /// Parses vLLM's string (exact upper-case names; anything else is `Other`).
    pub fn parse(s: &str) -> Self {
        match s {
            "GPU" => Medium::Gpu,
            "CPU" => Medium::Cpu,
            "STORAGE" | "DISK" => Medium::Storage,
            other => Medium::Other(other.to_owned()),
        }
    }

    /// The wire string.
    pub fn as_str(&self) -> &str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
            Medium::Storage => "STORAGE",
            Medium::Other(s) => s,
        }
    }
}

/// New full blocks of one request (one event may cover several consecutive blocks).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct BlockStored {
    /// One engine hash per block, in chain order.
    pub block_hashes: Vec<EngineBlockHash>,
    /// The block before the first one; `None` when they start at block 0 (or for
    /// offload stores, which carry no chain information).
    pub parent_block_hash: Option<EngineBlockHash>,
    /// All tokens of all the blocks (`block_size` per block); empty for offload stores.
    pub token_ids: Vec<u32>,
    /// Tokens per block (0 for offload stores).
    pub block_size: u32,
    pub lora_id: Option<i64>,
    /// Where the blocks were stored; `None` when the field is nil or absent
    /// (old releases: the GPU).
    pub medium: Option<Medium>,
    pub lora_name: Option<String>,
    /// Per-block extra hash keys (nil or a tuple each): LoRA name, multimodal
    /// ids, the `cache_salt` (block 0 only), a prompt-embeddings digest.
    pub extra_keys: Option<Vec<Value>>,
    /// KV-cache group index (hybrid models).
    pub group_idx: Option<i64>,
    /// KV-cache spec kind (e.g. `"full_attention"`).
    pub kv_cache_spec_kind: Option<String>,
    pub kv_cache_spec_sliding_window: Option<i64>,
}

/// Blocks evicted or reused.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct BlockRemoved {
    pub block_hashes: Vec<EngineBlockHash>,
    /// Where they were removed from (`None`: nil or absent, the GPU).
    pub medium: Option<Medium>,
    /// KV-cache group index (hybrid models).
    pub group_idx: Option<i64>,
}

/// One event of a batch.
#[derive(Clone, Debug, PartialEq)]
pub enum KvEvent {
    BlockStored(BlockStored),
    BlockRemoved(BlockRemoved),
    /// `AllBlocksCleared`: the prefix cache was reset.
    AllBlocksCleared,
}

/// One published message: `[ts, events, data_parallel_rank]`.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventBatch {
    /// Engine wall-clock time, seconds since the Unix epoch.
    pub ts: f64,
    pub events: Vec<KvEvent>,
    /// Data-parallel rank; `None` when nil or absent (2-element batches).
    pub dp_rank: Option<i64>,
}

/// Which payload layout an encoder writes (the decoder accepts both).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PayloadForm {
    /// `type`-tagged maps, vLLM >= 0.24 (the default).
    #[default]
    Map,
    /// Positional arrays, vLLM <= 0.23.
    Array,
}

impl BlockStored {
    /// The `cache_salt` vLLM put into block 0's extra keys, if any.
    ///
    /// vLLM builds block 0's extra keys as `lora_name?, multimodal ids..., cache_salt?,
    /// prompt_embeds_digest?`. The salt is the last *string* after skipping a leading
    /// LoRA name equal to [`Self::lora_name`]; bytes (embedding digests) and
    /// `(id, offset)` pairs are not strings and are skipped. Only meaningful when the
    /// event starts at block 0 (`parent_block_hash` is `None`).
    pub fn cache_salt(&self) -> Option<&str> {
        self.keys_after_lora(0)?
            .iter()
            .rev()
            .find_map(Value::as_str)
    }

    /// Block `i`'s extra keys without a leading LoRA name equal to
    /// [`Self::lora_name`]; `None` when the block has none.
    fn keys_after_lora(&self, i: usize) -> Option<&[Value]> {
        let keys = self.extra_keys.as_ref()?.get(i)?.as_array()?;
        let mut rest = keys.as_slice();
        if let (Some(lora), Some(first)) = (self.lora_name.as_deref(), rest.first()) {
            if first.as_str() == Some(lora) {
                rest = &rest[1..];
            }
        }
        Some(rest)
    }

    /// Whether block `i` of this event has extra keys a router cannot derive
    /// from a request's tokens: multimodal identifiers or `(id, offset)`
    /// pairs, a prompt-embedding digest. Only a leading LoRA name equal to
    /// [`Self::lora_name`] and, in block 0 of a chain, the salt
    /// ([`Self::cache_salt`]) are derivable. Two prompts whose images differ
    /// have equal placeholder tokens, so such a block hashed from its tokens
    /// alone would claim a hit the engine does not have.
    pub fn opaque_keys(&self, i: usize) -> bool {
        let Some(rest) = self.keys_after_lora(i) else {
            return false;
        };
        if i == 0 && self.parent_block_hash.is_none() {
            // The salt is the last string; what follows it (a digest) and
            // what precedes it (multimodal ids) are not derivable.
            if let Some(at) = rest.iter().rposition(|v| v.as_str().is_some()) {
                return at > 0 || rest.len() > at + 1;
            }
        }
        !rest.is_empty()
    }
}

impl From<&warmpath_core::prefix_cache::CacheEvent> for KvEvent {
    /// An engine-side prefix cache event (`warmpath_core::prefix_cache`) in
    /// vLLM's model, as vLLM would publish it: hashes as uint64, medium GPU,
    /// group 0, the `cache_salt` in block 0's `extra_keys`. The candle engine
    /// and the simulator both publish through this one conversion.
    fn from(ev: &warmpath_core::prefix_cache::CacheEvent) -> Self {
        use warmpath_core::prefix_cache::CacheEvent;
        let ints = |hs: &[warmpath_core::prefix_cache::EngineBlockHash]| -> Vec<EngineBlockHash> {
            hs.iter().map(|h| EngineBlockHash::Int(h.0)).collect()
        };
        match ev {
            CacheEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                ..
            } => KvEvent::BlockStored(BlockStored {
                block_hashes: ints(block_hashes),
                parent_block_hash: parent_block_hash.map(|h| EngineBlockHash::Int(h.0)),
                token_ids: token_ids.clone(),
                block_size: u32::try_from(*block_size).unwrap_or(u32::MAX),
                lora_id: None,
                medium: Some(Medium::Gpu),
                lora_name: None,
                // A block's keys as a tuple (an array), none as nil.
                extra_keys: ev.extra_keys().map(|keys| {
                    let tuple = |k: Option<Vec<String>>| k.map_or(Value::Nil, Value::from_iter);
                    keys.into_iter().map(tuple).collect()
                }),
                group_idx: Some(0),
                kv_cache_spec_kind: None,
                kv_cache_spec_sliding_window: None,
            }),
            CacheEvent::BlockRemoved { block_hashes } => KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: ints(block_hashes),
                medium: Some(Medium::Gpu),
                group_idx: Some(0),
            }),
            CacheEvent::AllBlocksCleared => KvEvent::AllBlocksCleared,
        }
    }
}
