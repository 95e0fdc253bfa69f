//! Encoding [`KvEventBatch`] as vLLM does: the map form byte-exact with vLLM 0.33
//! (msgspec gives `BlockStored`, a struct of more than 15 fields, a map16 header
//! and omits unset optional fields after `lora_name`), the array form with vLLM
//! 0.23 (every field, nil when unset); shortest integers, float64 timestamps.

use crate::event::{EngineBlockHash, KvEvent, KvEventBatch, PayloadForm};
use rmpv::{Value, ValueRef};

pub fn encode_batch(batch: &KvEventBatch, form: PayloadForm) -> Vec<u8> {
    let mut w = Writer {
        out: Vec::with_capacity(64 + batch.events.len() * 64),
        map: form == PayloadForm::Map,
    };
    w.array_len(3);
    w.put(batch.ts);
    w.array_len(batch.events.len());
    for e in &batch.events {
        w.event(e);
    }
    w.opt(batch.dp_rank);
    w.out
}

/// A msgpack writer over a `Vec<u8>`: rmpv writes the values (shortest
/// encodings, as msgspec), the array and map headers are written here (rmpv
/// writes none alone, and msgspec gives big structs a map16).
struct Writer {
    out: Vec<u8>,
    /// The map form: each value after its field's name.
    map: bool,
}

impl Writer {
    /// One event, its fields in vLLM's order. The map form leaves out the
    /// optional fields (`opt_tail`) when unset; the array form writes nil.
    fn event(&mut self, e: &KvEvent) {
        match e {
            KvEvent::BlockStored(s) => {
                let tail = [
                    s.extra_keys.is_some(),
                    s.group_idx.is_some(),
                    s.kv_cache_spec_kind.is_some(),
                    s.kv_cache_spec_sliding_window.is_some(),
                ];
                self.header(8, &tail, 0);
                self.field("type", "BlockStored");
                self.key("block_hashes");
                self.hashes(&s.block_hashes);
                self.key("parent_block_hash");
                self.hash(s.parent_block_hash.as_ref());
                self.key("token_ids");
                self.tokens(&s.token_ids);
                self.field("block_size", s.block_size);
                self.opt_field("lora_id", s.lora_id);
                self.opt_field("medium", s.medium.as_ref().map(|m| m.as_str()));
                self.opt_field("lora_name", s.lora_name.as_deref());
                match &s.extra_keys {
                    Some(k) => {
                        self.key("extra_keys");
                        self.values(k);
                    }
                    None => self.opt_tail("extra_keys", None::<i64>),
                }
                self.opt_tail("group_idx", s.group_idx);
                self.opt_tail("kv_cache_spec_kind", s.kv_cache_spec_kind.as_deref());
                self.opt_tail(
                    "kv_cache_spec_sliding_window",
                    s.kv_cache_spec_sliding_window,
                );
            }
            KvEvent::BlockRemoved(r) => {
                self.header(3, &[r.group_idx.is_some()], 15);
                self.field("type", "BlockRemoved");
                self.key("block_hashes");
                self.hashes(&r.block_hashes);
                self.opt_field("medium", r.medium.as_ref().map(|m| m.as_str()));
                self.opt_tail("group_idx", r.group_idx);
            }
            KvEvent::AllBlocksCleared => {
                self.header(1, &[], 15);
                self.field("type", "AllBlocksCleared");
            }
        }
    }

    /// An event's header: `fixed` fields and the optional ones (`tail`: which
    /// are set); a map of at most `fix_max` entries is a fixmap.
    fn header(&mut self, fixed: usize, tail: &[bool], fix_max: usize) {
        match self.map {
            false => self.array_len(fixed + tail.len()),
            true => {
                let n = fixed + tail.iter().filter(|&&set| set).count();
                self.len_header(n, 0x80, fix_max, 0xde, 0xdf);
            }
        }
    }

    /// The field's name, in the map form.
    fn key(&mut self, name: &str) {
        if self.map {
            self.put(name);
        }
    }

    fn field<'a>(&mut self, name: &str, v: impl Into<ValueRef<'a>>) {
        self.key(name);
        self.put(v);
    }

    fn opt_field<'a>(&mut self, name: &str, v: Option<impl Into<ValueRef<'a>>>) {
        self.key(name);
        self.opt(v);
    }

    /// An optional field at the end: left out of the map form when unset.
    fn opt_tail<'a>(&mut self, name: &str, v: Option<impl Into<ValueRef<'a>>>) {
        if !self.map || v.is_some() {
            self.opt_field(name, v);
        }
    }

    fn put<'a>(&mut self, v: impl Into<ValueRef<'a>>) {
        // Writing to a Vec cannot fail.
        let _ = rmpv::encode::write_value_ref(&mut self.out, &v.into());
    }

    fn opt<'a>(&mut self, v: Option<impl Into<ValueRef<'a>>>) {
        self.put(v.map_or(ValueRef::Nil, Into::into));
    }

    fn len_header(&mut self, n: usize, fix: u8, fix_max: usize, m16: u8, m32: u8) {
        match u16::try_from(n) {
            _ if n <= fix_max => self.out.push(fix | n as u8),
            Ok(n) => {
                self.out.push(m16);
                self.out.extend_from_slice(&n.to_be_bytes());
            }
            Err(_) => {
                self.out.push(m32);
                self.out.extend_from_slice(&(n as u32).to_be_bytes());
            }
        }
    }

    fn array_len(&mut self, n: usize) {
        self.len_header(n, 0x90, 15, 0xdc, 0xdd);
    }

    fn hash(&mut self, h: Option<&EngineBlockHash>) {
        match h {
            Some(EngineBlockHash::Int(v)) => self.put(*v),
            Some(EngineBlockHash::Bytes(b)) => self.put(b.as_slice()),
            None => self.put(ValueRef::Nil),
        }
    }

    fn hashes(&mut self, hs: &[EngineBlockHash]) {
        self.array_len(hs.len());
        for h in hs {
            self.hash(Some(h));
        }
    }

    fn tokens(&mut self, ts: &[u32]) {
        self.array_len(ts.len());
        for t in ts {
            self.put(*t);
        }
    }

    fn values(&mut self, vs: &[Value]) {
        self.array_len(vs.len());
        for v in vs {
            let _ = rmpv::encode::write_value(&mut self.out, v);
        }
    }
}
