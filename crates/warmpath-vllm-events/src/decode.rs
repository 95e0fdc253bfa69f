//! Decoding vLLM's msgpack payloads into [`KvEventBatch`]: positional arrays
//! (<= 0.23, any length from the first five fields on) or `type`-tagged maps
//! (>= 0.24, unknown keys ignored), hashes as uint64, int64 or bin, and a batch
//! of 2 or 3 elements. Malformed input is a [`DecodeError`], never a panic.

use crate::event::{BlockRemoved, BlockStored, EngineBlockHash, KvEvent, KvEventBatch, Medium};
use rmpv::Value;
use thiserror::Error;

/// Caps applied while decoding, so that a hostile or corrupt payload cannot make
/// the agent allocate or work without bound.
#[derive(Clone, Debug)]
pub struct DecodeLimits {
    pub max_payload_bytes: usize,
    pub max_events: usize,
    pub max_hashes: usize,
    pub max_tokens: usize,
    pub max_hash_bytes: usize,
    pub max_depth: usize,
    /// Most msgpack values in one payload, counted before any is built (a
    /// built value takes tens of bytes for a one-byte `nil` on the wire).
    pub max_values: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_payload_bytes: 64 << 20,
            max_events: 1 << 20,
            max_hashes: 1 << 20,
            max_tokens: 1 << 22,
            max_hash_bytes: 64,
            max_depth: 32,
            max_values: 1 << 23,
        }
    }
}

/// Why a payload could not be decoded. Never worth retrying: the same bytes fail
/// the same way; the caller counts the message and skips it.
#[derive(Debug, Error)]
pub enum DecodeError {
    #[error("kv-event payload is not valid msgpack (garbage or truncated): {0}")]
    Msgpack(#[from] rmpv::decode::Error),
    #[error("kv-event payload has {0} trailing bytes after the batch")]
    TrailingBytes(usize),
    /// The payload (or a part of it) exceeds a [`DecodeLimits`] cap.
    #[error("kv-event payload: {what} is {len}, above the limit of {max}")]
    TooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
    /// The structure is not what vLLM sends.
    #[error("kv-event payload: {what} (got {got})")]
    Shape { what: &'static str, got: String },
    #[error("kv-event payload: unknown event type {0:?}")]
    UnknownTag(String),
    #[error("kv-event payload: {event} lacks field {field}")]
    MissingField {
        event: &'static str,
        field: &'static str,
    },
    /// A field has the wrong type or an out-of-range value.
    #[error("kv-event payload: {event}.{field} must be {expected} (got {got})")]
    BadField {
        event: &'static str,
        field: &'static str,
        expected: &'static str,
        got: String,
    },
}

impl DecodeError {
    /// A stable short label for metrics (`reason` label).
    pub fn kind(&self) -> &'static str {
        match self {
            DecodeError::Msgpack(_) => "msgpack",
            DecodeError::TrailingBytes(_) => "trailing_bytes",
            DecodeError::TooLarge { .. } => "too_large",
            DecodeError::Shape { .. } => "shape",
            DecodeError::UnknownTag(_) => "unknown_tag",
            DecodeError::MissingField { .. } => "missing_field",
            DecodeError::BadField { .. } => "bad_field",
        }
    }
}

/// Decodes one payload with the default limits.
pub fn decode_batch(payload: &[u8]) -> Result<KvEventBatch, DecodeError> {
    decode_batch_with(payload, &DecodeLimits::default())
}

/// Decodes one payload with explicit limits.
pub fn decode_batch_with(
    payload: &[u8],
    limits: &DecodeLimits,
) -> Result<KvEventBatch, DecodeError> {
    check_len("payload size", payload.len(), limits.max_payload_bytes)?;
    if let Err(n) = crate::count::values_in(payload, limits.max_values) {
        return Err(DecodeError::TooLarge {
            what: "the count of values (stopped at the cap)",
            len: n,
            max: limits.max_values,
        });
    }
    let mut rd = payload;
    let value = rmpv::decode::read_value_with_max_depth(&mut rd, limits.max_depth)?;
    if !rd.is_empty() {
        return Err(DecodeError::TrailingBytes(rd.len()));
    }
    let Value::Array(outer) = value else {
        return Err(shape("the batch must be an array", &value));
    };
    if !(2..=3).contains(&outer.len()) {
        return Err(DecodeError::Shape {
            what: "the batch must have 2 or 3 elements [ts, events, rank]",
            got: format!("{} elements", outer.len()),
        });
    }
    let mut it = outer.into_iter();
    let ts_v = it.next().unwrap_or(Value::Nil);
    let ts = ts_v
        .as_f64()
        .or_else(|| ts_v.as_i64().map(|v| v as f64))
        .or_else(|| ts_v.as_u64().map(|v| v as f64))
        .ok_or_else(|| shape("the batch timestamp must be a number", &ts_v))?;
    let events_v = it.next().unwrap_or(Value::Nil);
    let Value::Array(raw_events) = events_v else {
        return Err(shape("the batch events must be an array", &events_v));
    };
    check_len("events in a batch", raw_events.len(), limits.max_events)?;
    let dp_rank = match it.next() {
        None | Some(Value::Nil) => None,
        Some(v) => Some(
            v.as_i64()
                .ok_or_else(|| shape("the data-parallel rank must be an int or nil", &v))?,
        ),
    };
    let events = raw_events
        .into_iter()
        .map(|e| decode_event(e, limits))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(KvEventBatch {
        ts,
        events,
        dp_rank,
    })
}

const STORED: &str = "BlockStored";
const REMOVED: &str = "BlockRemoved";
const CLEARED: &str = "AllBlocksCleared";
/// The fields of the array form, in order (vLLM appended them over releases).
const STORED_FIELDS: [&str; 11] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
];
const REMOVED_FIELDS: [&str; 3] = ["block_hashes", "medium", "group_idx"];

/// An event's fields by name, whichever form they came in, and its type (for
/// errors).
struct Fields {
    event: &'static str,
    items: Vec<(String, Value)>,
}

impl Fields {
    fn take(&mut self, name: &str) -> Option<Value> {
        let (_, v) = self.items.iter_mut().find(|(k, _)| k == name)?;
        Some(std::mem::replace(v, Value::Nil))
    }

    fn req(&mut self, field: &'static str) -> Result<Value, DecodeError> {
        let event = self.event;
        self.take(field)
            .ok_or(DecodeError::MissingField { event, field })
    }

    fn opt(&mut self, name: &str) -> Value {
        self.take(name).unwrap_or(Value::Nil)
    }

    fn int(&mut self, field: &'static str) -> Result<Option<i64>, DecodeError> {
        match self.opt(field) {
            Value::Nil => Ok(None),
            v => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| bad(self.event, field, "an int or nil", &v)),
        }
    }

    fn string(&mut self, field: &'static str) -> Result<Option<String>, DecodeError> {
        match self.opt(field) {
            Value::Nil => Ok(None),
            Value::String(s) => s.into_str().map(Some).ok_or(DecodeError::BadField {
                event: self.event,
                field,
                expected: "UTF-8",
                got: "invalid UTF-8".into(),
            }),
            other => Err(bad(self.event, field, "a string or nil", &other)),
        }
    }

    fn medium(&mut self) -> Result<Option<Medium>, DecodeError> {
        Ok(self.string("medium")?.map(|s| Medium::parse(&s)))
    }
}

fn decode_event(v: Value, limits: &DecodeLimits) -> Result<KvEvent, DecodeError> {
    let (tag, items) = match v {
        Value::Array(items) => array_fields(items)?,
        Value::Map(entries) => map_fields(entries)?,
        other => return Err(shape("an event must be an array or a map", &other)),
    };
    let event = match tag.as_str() {
        STORED => STORED,
        REMOVED => REMOVED,
        CLEARED => return Ok(KvEvent::AllBlocksCleared),
        other => return Err(DecodeError::UnknownTag(truncate(other))),
    };
    let mut f = Fields { event, items };
    let block_hashes = f.req("block_hashes")?;
    if event == REMOVED {
        return Ok(KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes(REMOVED, "block_hashes", block_hashes, limits)?,
            medium: f.medium()?,
            group_idx: f.int("group_idx")?,
        }));
    }
    let tokens_v = f.req("token_ids")?;
    let bs = f.req("block_size")?;
    Ok(KvEvent::BlockStored(BlockStored {
        block_hashes: hashes(STORED, "block_hashes", block_hashes, limits)?,
        parent_block_hash: match f.opt("parent_block_hash") {
            Value::Nil => None,
            v => Some(hash(STORED, "parent_block_hash", v, limits)?),
        },
        token_ids: tokens(tokens_v, limits)?,
        block_size: (bs.as_u64().and_then(|b| u32::try_from(b).ok()))
            .ok_or_else(|| bad(STORED, "block_size", "a non-negative u32", &bs))?,
        lora_id: f.int("lora_id")?,
        medium: f.medium()?,
        lora_name: f.string("lora_name")?,
        extra_keys: match f.opt("extra_keys") {
            Value::Nil => None,
            Value::Array(items) => Some(items),
            other => return Err(bad(STORED, "extra_keys", "an array or nil", &other)),
        },
        group_idx: f.int("group_idx")?,
        kv_cache_spec_kind: f.string("kv_cache_spec_kind")?,
        kv_cache_spec_sliding_window: f.int("kv_cache_spec_sliding_window")?,
    }))
}

/// `[tag, fields...]`, named by position.
fn array_fields(items: Vec<Value>) -> Result<(String, Vec<(String, Value)>), DecodeError> {
    let mut it = items.into_iter();
    let tag = it.next().unwrap_or(Value::Nil);
    let Some(tag) = tag.as_str().map(str::to_owned) else {
        return Err(shape("an array event must start with its type name", &tag));
    };
    let values: Vec<Value> = it.collect();
    let names: &[&str] = match tag.as_str() {
        STORED if values.len() < 4 => {
            return Err(DecodeError::Shape {
                what: "an array BlockStored needs at least 5 elements",
                got: format!("{} elements", values.len() + 1),
            })
        }
        STORED => &STORED_FIELDS,
        // A nil there is as good as absent.
        REMOVED if values.first().is_none_or(Value::is_nil) => &[],
        REMOVED => &REMOVED_FIELDS,
        _ => &[],
    };
    let fields = names.iter().map(|n| (*n).to_owned()).zip(values).collect();
    Ok((tag, fields))
}

/// `{"type": tag, name: value...}`; unknown keys are ignored.
fn map_fields(entries: Vec<(Value, Value)>) -> Result<(String, Vec<(String, Value)>), DecodeError> {
    let mut tag = None;
    let mut fields = Vec::with_capacity(entries.len());
    for (k, v) in entries {
        let Value::String(k) = k else {
            return Err(shape("map event keys must be strings", &k));
        };
        let Some(k) = k.into_str() else {
            return Err(DecodeError::Shape {
                what: "map event keys must be UTF-8",
                got: "invalid UTF-8".into(),
            });
        };
        if k == "type" {
            tag = Some(v);
        } else {
            fields.push((k, v));
        }
    }
    let Some(tag) = tag else {
        return Err(DecodeError::Shape {
            what: "a map event needs a \"type\" key",
            got: "none".into(),
        });
    };
    let Some(tag) = tag.as_str().map(str::to_owned) else {
        return Err(shape("the \"type\" of an event must be a string", &tag));
    };
    Ok((tag, fields))
}

fn hash(
    event: &'static str,
    field: &'static str,
    v: Value,
    limits: &DecodeLimits,
) -> Result<EngineBlockHash, DecodeError> {
    match v {
        Value::Integer(i) => (i.as_u64().or(i.as_i64().map(|s| s as u64)))
            .map(EngineBlockHash::Int)
            .ok_or_else(|| bad(event, field, "a 64-bit hash", &Value::Integer(i))),
        Value::Binary(b) => {
            check_len("a byte-string block hash", b.len(), limits.max_hash_bytes)?;
            Ok(EngineBlockHash::Bytes(b))
        }
        other => Err(bad(event, field, "an int or bytes hash", &other)),
    }
}

fn hashes(
    event: &'static str,
    field: &'static str,
    v: Value,
    limits: &DecodeLimits,
) -> Result<Vec<EngineBlockHash>, DecodeError> {
    let Value::Array(items) = v else {
        return Err(bad(event, field, "an array of hashes", &v));
    };
    check_len("block hashes in an event", items.len(), limits.max_hashes)?;
    items
        .into_iter()
        .map(|h| hash(event, field, h, limits))
        .collect()
}

fn tokens(v: Value, limits: &DecodeLimits) -> Result<Vec<u32>, DecodeError> {
    let Value::Array(items) = v else {
        return Err(bad(STORED, "token_ids", "an array of token ids", &v));
    };
    check_len("token_ids in a BlockStored", items.len(), limits.max_tokens)?;
    items
        .iter()
        .map(|t| {
            t.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(|| bad(STORED, "token_ids", "u32 token ids", t))
        })
        .collect()
}

fn check_len(what: &'static str, len: usize, max: usize) -> Result<(), DecodeError> {
    if len > max {
        return Err(DecodeError::TooLarge { what, len, max });
    }
    Ok(())
}

/// A short, bounded description of a value for error messages.
fn describe(v: &Value) -> String {
    let s = match v {
        Value::Array(a) => format!("array of {}", a.len()),
        Value::Map(m) => format!("map of {}", m.len()),
        Value::Binary(b) => format!("{} bytes", b.len()),
        other => other.to_string(),
    };
    truncate(&s)
}

fn truncate(s: &str) -> String {
    const MAX: usize = 64;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

fn shape(what: &'static str, got: &Value) -> DecodeError {
    DecodeError::Shape {
        what,
        got: describe(got),
    }
}

fn bad(
    event: &'static str,
    field: &'static str,
    expected: &'static str,
    got: &Value,
) -> DecodeError {
    DecodeError::BadField {
        event,
        field,
        expected,
        got: describe(got),
    }
}
