//! Encoding [`KvEventBatch`] as vLLM does: the map form byte-exact with vLLM 0.33
//! (msgspec gives `BlockStored`, a struct of more than 15 fields, a map16 header
//! and omits unset optional fields after `lora_name`), the array form with vLLM
//! 0.23 (every field, nil when unset); shortest integers, float64 timestamps.

use crate::event::{
    BlockRemoved, BlockStored, EngineBlockHash, KvEvent, KvEventBatch, PayloadForm,
};
use rmpv::{Value, ValueRef};

pub fn encode_batch(batch: &KvEventBatch, form: PayloadForm) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(64 + batch.events.len() * 64));
    w.array_len(3);
    w.put(batch.ts);
    w.array_len(batch.events.len());
    for e in &batch.events {
        match form {
            PayloadForm::Map => map_event(&mut w, e),
            PayloadForm::Array => array_event(&mut w, e),
        }
    }
    w.opt(batch.dp_rank);
    w.0
}

fn map_event(w: &mut Writer, e: &KvEvent) {
    match e {
        KvEvent::BlockStored(s) => {
            let n = 8
                + usize::from(s.extra_keys.is_some())
                + usize::from(s.group_idx.is_some())
                + usize::from(s.kv_cache_spec_kind.is_some())
                + usize::from(s.kv_cache_spec_sliding_window.is_some());
            w.map16_len(n);
            w.put("type");
            w.put("BlockStored");
            w.put("block_hashes");
            w.hashes(&s.block_hashes);
            w.put("parent_block_hash");
            w.hash(s.parent_block_hash.as_ref());
            w.put("token_ids");
            w.tokens(&s.token_ids);
            w.put("block_size");
            w.put(s.block_size);
            w.put("lora_id");
            w.opt(s.lora_id);
            w.put("medium");
            w.opt(s.medium.as_ref().map(|m| m.as_str()));
            w.put("lora_name");
            w.opt(s.lora_name.as_deref());
            if let Some(k) = &s.extra_keys {
                w.put("extra_keys");
                w.values(k);
            }
            if let Some(g) = s.group_idx {
                w.put("group_idx");
                w.put(g);
            }
            if let Some(k) = &s.kv_cache_spec_kind {
                w.put("kv_cache_spec_kind");
                w.put(k.as_str());
            }
            if let Some(sw) = s.kv_cache_spec_sliding_window {
                w.put("kv_cache_spec_sliding_window");
                w.put(sw);
            }
        }
        KvEvent::BlockRemoved(r) => {
            w.map_len(3 + usize::from(r.group_idx.is_some()));
            w.put("type");
            w.put("BlockRemoved");
            w.put("block_hashes");
            w.hashes(&r.block_hashes);
            w.put("medium");
            w.opt(r.medium.as_ref().map(|m| m.as_str()));
            if let Some(g) = r.group_idx {
                w.put("group_idx");
                w.put(g);
            }
        }
        KvEvent::AllBlocksCleared => {
            w.map_len(1);
            w.put("type");
            w.put("AllBlocksCleared");
        }
    }
}

fn array_event(w: &mut Writer, e: &KvEvent) {
    match e {
        KvEvent::BlockStored(BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id,
            medium,
            lora_name,
            extra_keys,
            group_idx,
            kv_cache_spec_kind,
            kv_cache_spec_sliding_window,
        }) => {
            w.array_len(12);
            w.put("BlockStored");
            w.hashes(block_hashes);
            w.hash(parent_block_hash.as_ref());
            w.tokens(token_ids);
            w.put(*block_size);
            w.opt(*lora_id);
            w.opt(medium.as_ref().map(|m| m.as_str()));
            w.opt(lora_name.as_deref());
            match extra_keys {
                Some(k) => w.values(k),
                None => w.put(ValueRef::Nil),
            }
            w.opt(*group_idx);
            w.opt(kv_cache_spec_kind.as_deref());
            w.opt(*kv_cache_spec_sliding_window);
        }
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes,
            medium,
            group_idx,
        }) => {
            w.array_len(4);
            w.put("BlockRemoved");
            w.hashes(block_hashes);
            w.opt(medium.as_ref().map(|m| m.as_str()));
            w.opt(*group_idx);
        }
        KvEvent::AllBlocksCleared => {
            w.array_len(1);
            w.put("AllBlocksCleared");
        }
    }
}

/// A msgpack writer over a `Vec<u8>`: rmpv writes the values (shortest
/// encodings, as msgspec), the array and map headers are written here (rmpv
/// writes none alone, and msgspec gives big structs a map16).
struct Writer(Vec<u8>);

impl Writer {
    fn put<'a>(&mut self, v: impl Into<ValueRef<'a>>) {
        // Writing to a Vec cannot fail.
        let _ = rmpv::encode::write_value_ref(&mut self.0, &v.into());
    }

    fn opt<'a>(&mut self, v: Option<impl Into<ValueRef<'a>>>) {
        self.put(v.map_or(ValueRef::Nil, Into::into));
    }

    fn len_header(&mut self, n: usize, fix: u8, fix_max: usize, m16: u8, m32: u8) {
        match u16::try_from(n) {
            _ if n <= fix_max => self.0.push(fix | n as u8),
            Ok(n) => {
                self.0.push(m16);
                self.0.extend_from_slice(&n.to_be_bytes());
            }
            Err(_) => {
                self.0.push(m32);
                self.0.extend_from_slice(&(n as u32).to_be_bytes());
            }
        }
    }

    fn array_len(&mut self, n: usize) {
        self.len_header(n, 0x90, 15, 0xdc, 0xdd);
    }

    fn map_len(&mut self, n: usize) {
        self.len_header(n, 0x80, 15, 0xde, 0xdf);
    }

    /// A map header that is never a fixmap (msgspec's layout for big structs).
    fn map16_len(&mut self, n: usize) {
        self.len_header(n, 0x80, 0, 0xde, 0xdf);
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
            let _ = rmpv::encode::write_value(&mut self.0, v);
        }
    }
}
