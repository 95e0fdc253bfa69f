//! Encoding [`KvEventBatch`] as vLLM does: the map form byte-exact with vLLM 0.33
//! (msgspec gives `BlockStored`, a struct of more than 15 fields, a map16 header
//! and omits unset optional fields after `lora_name`), the array form with vLLM
//! 0.23 (every field, nil when unset); shortest integers, float64 timestamps.

use crate::event::{
    BlockRemoved, BlockStored, EngineBlockHash, KvEvent, KvEventBatch, PayloadForm,
};
use rmpv::Value;

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

    /// `marker`, then the low `width` bytes of `v`, big-endian.
    fn marked(&mut self, marker: u8, v: u64, width: usize) {
        self.0.push(marker);
        self.0.extend_from_slice(&v.to_be_bytes()[8 - width..]);
    }

    fn f64(&mut self, v: f64) {
        self.marked(0xcb, v.to_bits(), 8);
    }

    fn uint(&mut self, v: u64) {
        match v {
            0..0x80 => self.0.push(v as u8),
            0x80..=0xff => self.marked(0xcc, v, 1),
            0x100..=0xffff => self.marked(0xcd, v, 2),
            0x1_0000..=0xffff_ffff => self.marked(0xce, v, 4),
            _ => self.marked(0xcf, v, 8),
        }
    }

    fn int(&mut self, v: i64) {
        // Two's complement: the low bytes of `v as u64` are `v` in that width.
        let u = v as u64;
        if v >= 0 {
            self.uint(u);
        } else if v >= -32 {
            self.0.push(v as i8 as u8);
        } else if v >= i64::from(i8::MIN) {
            self.marked(0xd0, u, 1);
        } else if v >= i64::from(i16::MIN) {
            self.marked(0xd1, u, 2);
        } else if v >= i64::from(i32::MIN) {
            self.marked(0xd2, u, 4);
        } else {
            self.marked(0xd3, u, 8);
        }
    }

    /// A length in 1, 2 or 4 bytes after `m8`, `m16` or `m32` (str, bin, ext).
    fn sized(&mut self, n: usize, m8: u8, m16: u8, m32: u8) {
        match n {
            0..=0xff => self.marked(m8, n as u64, 1),
            0x100..=0xffff => self.marked(m16, n as u64, 2),
            _ => self.marked(m32, n as u64, 4),
        }
    }

    fn opt_int(&mut self, v: Option<i64>) {
        match v {
            Some(v) => self.int(v),
            None => self.nil(),
        }
    }

    fn len_header(&mut self, n: usize, fix: u8, fix_max: usize, m16: u8, m32: u8) {
        match n {
            _ if n <= fix_max => self.0.push(fix | n as u8),
            0..=0xffff => self.marked(m16, n as u64, 2),
            _ => self.marked(m32, n as u64, 4),
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
        match s.len() {
            n @ 0..=31 => self.0.push(0xa0 | n as u8),
            n => self.sized(n, 0xd9, 0xda, 0xdb),
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
        self.sized(b.len(), 0xc4, 0xc5, 0xc6);
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
            Value::F32(f) => self.marked(0xca, u64::from(f.to_bits()), 4),
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
                    _ => self.sized(n, 0xc7, 0xc8, 0xc9),
                }
                self.0.push(*ty as u8);
                self.0.extend_from_slice(data);
            }
        }
    }
}
