//! Golden tests on the bytes captured from vLLM 0.33 and 0.23, round trips, and
//! bad input.
#![allow(clippy::unwrap_used)]

use super::*;
use rmpv::Value;

const V033: &str = "93cb3ff800000000000093de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573917bb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473920102aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b6579739191a473616c74a967726f75705f6964780083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573917ba66d656469756da347505581a474797065b0416c6c426c6f636b73436c656172656400";
const V023: &str = "93cb3ff8000000000000939cab426c6f636b53746f726564917bc092010202c0a3475055c09191a473616c7400c0c094ac426c6f636b52656d6f766564917ba3475055c091b0416c6c426c6f636b73436c656172656400";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The batch both captures hold, field by field as vLLM 0.33 reports it.
fn captured_033() -> KvEventBatch {
    KvEventBatch {
        ts: 1.5,
        events: vec![
            KvEvent::BlockStored(BlockStored {
                block_hashes: vec![EngineBlockHash::Int(123)],
                parent_block_hash: None,
                token_ids: vec![1, 2],
                block_size: 2,
                lora_id: None,
                medium: Some(Medium::Gpu),
                lora_name: None,
                extra_keys: Some(vec![Value::Array(vec![Value::from("salt")])]),
                group_idx: Some(0),
                kv_cache_spec_kind: None,
                kv_cache_spec_sliding_window: None,
            }),
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![EngineBlockHash::Int(123)],
                medium: Some(Medium::Gpu),
                group_idx: None,
            }),
            KvEvent::AllBlocksCleared,
        ],
        dp_rank: Some(0),
    }
}

#[test]
fn golden_decode_vllm_0_33_map_form() {
    let b = decode_batch(&unhex(V033)).unwrap();
    assert_eq!(b, captured_033());
    let KvEvent::BlockStored(s) = &b.events[0] else {
        panic!("first event is BlockStored")
    };
    assert_eq!(s.cache_salt(), Some("salt"));
}

#[test]
fn golden_decode_vllm_0_23_array_form() {
    let b = decode_batch(&unhex(V023)).unwrap();
    assert_eq!(b, captured_033(), "both releases describe the same batch");
}

#[test]
fn golden_encode_reproduces_captured_bytes() {
    let batch = captured_033();
    assert_eq!(encode_batch(&batch, PayloadForm::Map), unhex(V033));
    assert_eq!(encode_batch(&batch, PayloadForm::Array), unhex(V023));
}

fn rich_batch() -> KvEventBatch {
    KvEventBatch {
        ts: 1_700_000_000.25,
        events: vec![
            KvEvent::BlockStored(BlockStored {
                block_hashes: vec![
                    EngineBlockHash::Int(u64::MAX),
                    EngineBlockHash::Bytes(vec![7; 32]),
                ],
                parent_block_hash: Some(EngineBlockHash::Int(1 << 40)),
                token_ids: (0..32).map(|i| i * 70_001).collect(),
                block_size: 16,
                lora_id: Some(-3),
                medium: Some(Medium::Cpu),
                lora_name: Some("sql-adapter".into()),
                extra_keys: Some(vec![
                    Value::Array(vec![Value::from("sql-adapter"), Value::from("tenant-a")]),
                    Value::Nil,
                ]),
                group_idx: Some(1),
                kv_cache_spec_kind: Some("sliding_window".into()),
                kv_cache_spec_sliding_window: Some(4096),
            }),
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![EngineBlockHash::Int(5)],
                medium: Some(Medium::Other("NVME".into())),
                group_idx: Some(2),
            }),
            KvEvent::AllBlocksCleared,
        ],
        dp_rank: None,
    }
}

#[test]
fn round_trip_both_forms() {
    let b = rich_batch();
    for form in [PayloadForm::Map, PayloadForm::Array] {
        assert_eq!(
            decode_batch(&encode_batch(&b, form)).unwrap(),
            b,
            "{form:?}"
        );
    }
}

#[test]
fn cache_salt_skips_the_lora_name() {
    let KvEvent::BlockStored(s) = &rich_batch().events[0] else {
        panic!()
    };
    assert_eq!(s.cache_salt(), Some("tenant-a"));
    let only_lora = BlockStored {
        lora_name: Some("l".into()),
        extra_keys: Some(vec![Value::Array(vec![Value::from("l")])]),
        ..Default::default()
    };
    assert_eq!(only_lora.cache_salt(), None);
}

#[test]
fn old_two_element_batch_and_short_array_event() {
    // [ts, [["BlockStored", [-1], nil, [1, 2], 2]]] — a pre-0.9.1 batch, 5 fields,
    // a signed hash.
    let bytes = [
        0x92, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x91, 0x95, 0xab, b'B', b'l', b'o', b'c', b'k',
        b'S', b't', b'o', b'r', b'e', b'd', 0x91, 0xff, 0xc0, 0x92, 0x01, 0x02, 0x02,
    ];
    let b = decode_batch(&bytes).unwrap();
    assert_eq!(b.dp_rank, None);
    let KvEvent::BlockStored(s) = &b.events[0] else {
        panic!()
    };
    assert_eq!(s.block_hashes, vec![EngineBlockHash::Int(u64::MAX)]);
    assert_eq!(s.medium, None);
    assert_eq!(s.token_ids, vec![1, 2]);
}

#[test]
fn unknown_map_keys_are_ignored() {
    let mut m = captured_033();
    m.events.truncate(1);
    let mut bytes = encode_batch(&m, PayloadForm::Map);
    // Bump the map16 length and append `"session_id": "abc"` before the rank.
    let pos = bytes.iter().position(|b| *b == 0xde).unwrap();
    bytes[pos + 2] += 1;
    let rank = bytes.pop().unwrap();
    bytes.extend_from_slice(&[0xaa]);
    bytes.extend_from_slice(b"session_id");
    bytes.extend_from_slice(&[0xa3, b'a', b'b', b'c', rank]);
    assert_eq!(decode_batch(&bytes).unwrap(), m);
}

#[test]
fn bad_input_gets_typed_errors() {
    let good = unhex(V033);
    let kind = |bytes: &[u8]| decode_batch(bytes).unwrap_err().kind();
    assert_eq!(kind(&[]), "msgpack");
    // 0xc1 is msgpack's reserved marker: one bogus value, then trailing junk.
    assert!(matches!(kind(b"\xc1garbage"), "msgpack" | "trailing_bytes"));
    assert_eq!(
        kind(b"\xdb\xff\xff\xff\xffabc"),
        "msgpack",
        "string longer than the payload"
    );
    for cut in [1, 10, good.len() / 2, good.len() - 1] {
        assert_eq!(kind(&good[..cut]), "msgpack", "truncated at {cut}");
    }
    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(kind(&trailing), "trailing_bytes");
    assert_eq!(kind(&[0x91, 0x01]), "shape", "1-element batch");
    assert_eq!(kind(&[0x01]), "shape", "not an array");
    // ["Bogus"] as the only event.
    let bogus = [
        0x93, 0x00, 0x91, 0x91, 0xa5, b'B', b'o', b'g', b'u', b's', 0xc0,
    ];
    assert_eq!(kind(&bogus), "unknown_tag");
    // {"type": "BlockStored"} without fields.
    let mut missing = vec![0x93, 0x00, 0x91, 0x81, 0xa4];
    missing.extend_from_slice(b"type");
    missing.push(0xab);
    missing.extend_from_slice(b"BlockStored");
    missing.push(0xc0);
    assert_eq!(kind(&missing), "missing_field");
    // A token id that does not fit u32.
    let mut b = captured_033();
    b.events.truncate(1);
    let mut bytes = encode_batch(&b, PayloadForm::Array);
    let tok = bytes
        .windows(3)
        .position(|w| w == [0x92, 0x01, 0x02])
        .unwrap();
    bytes.splice(tok + 1..tok + 2, [0xcf, 1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(kind(&bytes), "bad_field");
}

#[test]
fn absurd_sizes_are_capped() {
    let limits = DecodeLimits {
        max_tokens: 8,
        ..DecodeLimits::default()
    };
    let mut b = captured_033();
    b.events.truncate(1);
    if let KvEvent::BlockStored(s) = &mut b.events[0] {
        s.token_ids = vec![1; 9];
    }
    let bytes = encode_batch(&b, PayloadForm::Map);
    let err = decode_batch_with(&bytes, &limits).unwrap_err();
    assert_eq!(err.kind(), "too_large");
    // A declared array of 4 billion elements with no data is truncated, not allocated.
    let huge = [0x93, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff];
    assert_eq!(decode_batch(&huge).unwrap_err().kind(), "msgpack");
    // Nesting deeper than the cap.
    let deep: Vec<u8> = std::iter::repeat_n(0x91, 100).chain([0x00]).collect();
    assert_eq!(decode_batch(&deep).unwrap_err().kind(), "msgpack");
    // One-byte values beyond the count cap are refused before any is built.
    let mut nils = vec![0x92, 0x00, 0xdd, 0x03, 0xff, 0xff, 0xf0];
    nils.extend(std::iter::repeat_n(0xc0, 1000));
    let few = DecodeLimits {
        max_values: 100,
        ..DecodeLimits::default()
    };
    let err = decode_batch_with(&nils, &few).unwrap_err();
    assert_eq!(err.kind(), "too_large", "{err}");
    // The captured batches are far under the default.
    assert!(decode_batch(&encode_batch(&captured_033(), PayloadForm::Map)).is_ok());
}
