//! Encoding [`KvEventBatch`] as vLLM does, in either layout.
//!
//! The map form reproduces vLLM 0.33's bytes exactly (msgspec: `BlockStored` —
//! a struct of more than 15 fields — always gets a map16 header; optional fields
//! `extra_keys`, `group_idx`, `kv_cache_spec_*` are omitted when unset); the
//! array form reproduces vLLM 0.23's (every field present, nil when unset).
//! Integers use the shortest msgpack encoding, the timestamp is always float64.
//! Writing into a `Vec<u8>` cannot fail, so the encoder is infallible.

use crate::event::{
    BlockRemoved, BlockStored, EngineBlockHash, KvEvent, KvEventBatch, PayloadForm,
};
use rmpv::Value;

/// Encodes `batch` in `form`.
pub fn encode_batch(batch: &KvEventBatch, form: PayloadForm) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(64 + batch.events.len() * 64));
    w.array_len(3);
    w.f64(batch.ts);
    w.array_len(batch.events.len());
    for e in &batch.events {
        match form {
            PayloadForm::Map => map_event(&mut w, e),
            PayloadForm::Array => array_event(&mut w, e),
        }
    }
    match batch.dp_rank {
        Some(r) => w.int(r),
        None => w.nil(),
    }
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
            w.str("type");
            w.str("BlockStored");
            w.str("block_hashes");
            w.hashes(&s.block_hashes);
            w.str("parent_block_hash");
            w.opt_hash(s.parent_block_hash.as_ref());
            w.str("token_ids");
            w.tokens(&s.token_ids);
            w.str("block_size");
            w.uint(u64::from(s.block_size));
            w.str("lora_id");
            w.opt_int(s.lora_id);
            w.str("medium");
            w.opt_str(s.medium.as_ref().map(|m| m.as_str()));
            w.str("lora_name");
            w.opt_str(s.lora_name.as_deref());
            if let Some(k) = &s.extra_keys {
                w.str("extra_keys");
                w.values(k);
            }
            if let Some(g) = s.group_idx {
                w.str("group_idx");
                w.int(g);
            }
            if let Some(k) = &s.kv_cache_spec_kind {
                w.str("kv_cache_spec_kind");
                w.str(k);
            }
            if let Some(sw) = s.kv_cache_spec_sliding_window {
                w.str("kv_cache_spec_sliding_window");
                w.int(sw);
            }
        }
        KvEvent::BlockRemoved(r) => {
            w.map_len(3 + usize::from(r.group_idx.is_some()));
            w.str("type");
            w.str("BlockRemoved");
            w.str("block_hashes");
            w.hashes(&r.block_hashes);
            w.str("medium");
            w.opt_str(r.medium.as_ref().map(|m| m.as_str()));
            if let Some(g) = r.group_idx {
                w.str("group_idx");
                w.int(g);
            }
        }
        KvEvent::AllBlocksCleared => {
            w.map_len(1);
            w.str("type");
            w.str("AllBlocksCleared");
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
            w.str("BlockStored");
            w.hashes(block_hashes);
            w.opt_hash(parent_block_hash.as_ref());
            w.tokens(token_ids);
            w.uint(u64::from(*block_size));
            w.opt_int(*lora_id);
            w.opt_str(medium.as_ref().map(|m| m.as_str()));
            w.opt_str(lora_name.as_deref());
            match extra_keys {
                Some(k) => w.values(k),
                None => w.nil(),
            }
            w.opt_int(*group_idx);
            w.opt_str(kv_cache_spec_kind.as_deref());
            w.opt_int(*kv_cache_spec_sliding_window);
        }
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes,
            medium,
            group_idx,
        }) => {
            w.array_len(4);
            w.str("BlockRemoved");
            w.hashes(block_hashes);
            w.opt_str(medium.as_ref().map(|m| m.as_str()));
            w.opt_int(*group_idx);
        }
        KvEvent::AllBlocksCleared => {
            w.array_len(1);
            w.str("AllBlocksCleared");
        }
    }
}

/// A minimal msgpack writer over a `Vec<u8>` (shortest encodings, as msgspec).
struct Writer(Vec<u8>);

impl Writer {
    fn nil(&mut self) {
        self.0.push(0xc0);
    }

    fn f64(&mut self, v: f64) {
        self.0.push(0xcb);
        self.0.extend_from_slice(&v.to_bits().to_be_bytes());
    }

    fn uint(&mut self, v: u64) {
        let b = &mut self.0;
        if v < 0x80 {
            b.push(v as u8);
        } else if v <= 0xff {
            b.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= 0xffff {
            b.push(0xcd);
            b.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= 0xffff_ffff {
            b.push(0xce);
            b.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            b.push(0xcf);
            b.extend_from_slice(&v.to_be_bytes());
        }
    }

    fn int(&mut self, v: i64) {
        if v >= 0 {
            return self.uint(v as u64);
        }
        let b = &mut self.0;
        if v >= -32 {
            b.push(v as i8 as u8);
        } else if v >= i64::from(i8::MIN) {
            b.extend_from_slice(&[0xd0, v as i8 as u8]);
        } else if v >= i64::from(i16::MIN) {
            b.push(0xd1);
            b.extend_from_slice(&(v as i16).to_be_bytes());
        } else if v >= i64::from(i32::MIN) {
            b.push(0xd2);
            b.extend_from_slice(&(v as i32).to_be_bytes());
        } else {
            b.push(0xd3);
            b.extend_from_slice(&v.to_be_bytes());
        }
    }

    fn opt_int(&mut self, v: Option<i64>) {
        match v {
            Some(v) => self.int(v),
            None => self.nil(),
        }
    }

    fn len_header(&mut self, n: usize, fix: u8, fix_max: usize, m16: u8, m32: u8) {
        if n <= fix_max {
            self.0.push(fix | n as u8);
        } else if n <= 0xffff {
            self.0.push(m16);
            self.0.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.0.push(m32);
            self.0.extend_from_slice(&(n as u32).to_be_bytes());
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

    fn str(&mut self, s: &str) {
        let n = s.len();
        if n <= 31 {
            self.0.push(0xa0 | n as u8);
        } else if n <= 0xff {
            self.0.extend_from_slice(&[0xd9, n as u8]);
        } else if n <= 0xffff {
            self.0.push(0xda);
            self.0.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.0.push(0xdb);
            self.0.extend_from_slice(&(n as u32).to_be_bytes());
        }
        self.0.extend_from_slice(s.as_bytes());
    }

    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.str(s),
            None => self.nil(),
        }
    }

    fn bin(&mut self, b: &[u8]) {
        let n = b.len();
        if n <= 0xff {
            self.0.extend_from_slice(&[0xc4, n as u8]);
        } else if n <= 0xffff {
            self.0.push(0xc5);
            self.0.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.0.push(0xc6);
            self.0.extend_from_slice(&(n as u32).to_be_bytes());
        }
        self.0.extend_from_slice(b);
    }

    fn hash(&mut self, h: &EngineBlockHash) {
        match h {
            EngineBlockHash::Int(v) => self.uint(*v),
            EngineBlockHash::Bytes(b) => self.bin(b),
        }
    }

    fn opt_hash(&mut self, h: Option<&EngineBlockHash>) {
        match h {
            Some(h) => self.hash(h),
            None => self.nil(),
        }
    }

    fn hashes(&mut self, hs: &[EngineBlockHash]) {
        self.array_len(hs.len());
        for h in hs {
            self.hash(h);
        }
    }

    fn tokens(&mut self, ts: &[u32]) {
        self.array_len(ts.len());
        for t in ts {
            self.uint(u64::from(*t));
        }
    }

    fn values(&mut self, vs: &[Value]) {
        self.array_len(vs.len());
        for v in vs {
            self.value(v);
        }
    }

    fn value(&mut self, v: &Value) {
        match v {
            Value::Nil => self.nil(),
            Value::Boolean(b) => self.0.push(if *b { 0xc3 } else { 0xc2 }),
            Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
                (Some(u), _) => self.uint(u),
                (None, Some(s)) => self.int(s),
                (None, None) => self.nil(),
            },
            Value::F32(f) => {
                self.0.push(0xca);
                self.0.extend_from_slice(&f.to_bits().to_be_bytes());
            }
            Value::F64(f) => self.f64(*f),
            Value::String(s) => match s.as_str() {
                Some(s) => self.str(s),
                None => self.bin(s.as_bytes()),
            },
            Value::Binary(b) => self.bin(b),
            Value::Array(a) => self.values(a),
            Value::Map(m) => {
                self.map_len(m.len());
                for (k, v) in m {
                    self.value(k);
                    self.value(v);
                }
            }
            Value::Ext(ty, data) => {
                let n = data.len();
                match n {
                    1 => self.0.push(0xd4),
                    2 => self.0.push(0xd5),
                    4 => self.0.push(0xd6),
                    8 => self.0.push(0xd7),
                    16 => self.0.push(0xd8),
                    _ if n <= 0xff => self.0.extend_from_slice(&[0xc7, n as u8]),
                    _ if n <= 0xffff => {
                        self.0.push(0xc8);
                        self.0.extend_from_slice(&(n as u16).to_be_bytes());
                    }
                    _ => {
                        self.0.push(0xc9);
                        self.0.extend_from_slice(&(n as u32).to_be_bytes());
                    }
                }
                self.0.push(*ty as u8);
                self.0.extend_from_slice(data);
            }
        }
    }
}
