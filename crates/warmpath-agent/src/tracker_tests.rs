#![allow(clippy::unwrap_used)]

use super::*;
use rmpv::Value;
use warmpath_core::hash_tokens;
use warmpath_vllm_events::BlockRemoved;

fn stored(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>, bs: u32) -> KvEvent {
    KvEvent::BlockStored(BlockStored {
        block_hashes: hashes.iter().map(|h| EngineBlockHash::Int(*h)).collect(),
        parent_block_hash: parent.map(EngineBlockHash::Int),
        token_ids: tokens,
        block_size: bs,
        medium: Some(Medium::Gpu),
        ..Default::default()
    })
}

fn batch(events: Vec<KvEvent>) -> KvEventBatch {
    KvEventBatch {
        ts: 0.0,
        events,
        dp_rank: Some(0),
    }
}

#[test]
fn rehashes_with_the_shared_hash_and_chains_from_the_parent() {
    let mut t = EngineTracker::new("m", 16);
    let toks: Vec<u32> = (0..32).collect();
    let want = hash_tokens(HashSeed::new("m", "", ""), 16, &toks);
    // Block 0 alone, then block 1 chained onto it in a later event.
    let o = t.apply_batch(&batch(vec![stored(&[10], None, toks[..16].to_vec(), 16)]));
    assert_eq!(o.block_size_learned, Some(16));
    let o2 = t.apply_batch(&batch(vec![stored(
        &[11],
        Some(10),
        toks[16..].to_vec(),
        16,
    )]));
    assert_eq!(
        o.changes,
        vec![Change::Stored {
            parent: None,
            hashes: vec![want[0]],
            tier: Tier::Gpu
        }]
    );
    assert_eq!(
        o2.changes,
        vec![Change::Stored {
            parent: Some(want[0]),
            hashes: vec![want[1]],
            tier: Tier::Gpu
        }]
    );
    assert_eq!(
        want[0].to_hex(),
        "d3034b7f684156db",
        "the pinned golden vector"
    );
    assert_eq!(t.len(), 2);
}

#[test]
fn tenant_from_cache_salt_and_lora_seed_the_chain() {
    let mut t = EngineTracker::new("m", 16);
    let toks: Vec<u32> = (0..32).collect();
    let ev = KvEvent::BlockStored(BlockStored {
        block_hashes: vec![EngineBlockHash::Int(1), EngineBlockHash::Int(2)],
        token_ids: toks.clone(),
        block_size: 16,
        extra_keys: Some(vec![Value::Array(vec![Value::from("acme")]), Value::Nil]),
        ..Default::default()
    });
    let o = t.apply_batch(&batch(vec![ev]));
    let Change::Stored { hashes, .. } = &o.changes[0] else {
        panic!()
    };
    assert_eq!(hashes[0].to_hex(), "846f32e51cf9b9c8");
    assert_eq!(hashes[1].to_hex(), "ca65ce98c2b0770a");

    let ev = KvEvent::BlockStored(BlockStored {
        block_hashes: vec![EngineBlockHash::Int(3), EngineBlockHash::Int(4)],
        token_ids: toks,
        block_size: 16,
        lora_name: Some("sql-adapter".into()),
        extra_keys: Some(vec![
            Value::Array(vec![Value::from("sql-adapter")]),
            Value::Nil,
        ]),
        ..Default::default()
    });
    let o = t.apply_batch(&batch(vec![ev]));
    let Change::Stored { hashes, .. } = &o.changes[0] else {
        panic!()
    };
    assert_eq!(hashes[0].to_hex(), "50e81dc032d5d4fc");
}

#[test]
fn unknown_parent_is_counted_never_guessed() {
    let mut t = EngineTracker::new("m", 16);
    let o = t.apply_batch(&batch(vec![stored(&[11], Some(999), vec![0; 16], 16)]));
    assert_eq!(o.unknown_parents, 1);
    assert!(o.changes.is_empty());
    assert!(t.is_empty());
}

#[test]
fn removed_and_tiers_and_offload_resolution() {
    let mut t = EngineTracker::new("m", 16);
    let o = t.apply_batch(&batch(vec![stored(&[1, 2], None, (0..32).collect(), 16)]));
    let Change::Stored { hashes: wp, .. } = o.changes[0].clone() else {
        panic!()
    };
    // Offload of block 1 and an unknown one to CPU: no tokens.
    let off = KvEvent::BlockStored(BlockStored {
        block_hashes: vec![EngineBlockHash::Int(2), EngineBlockHash::Int(77)],
        medium: Some(Medium::Cpu),
        ..Default::default()
    });
    let o = t.apply_batch(&batch(vec![off]));
    assert_eq!(o.unresolved, 1);
    assert_eq!(
        o.changes,
        vec![Change::Stored {
            parent: Some(wp[0]),
            hashes: vec![wp[1]],
            tier: Tier::Cpu
        }]
    );
    // GPU eviction of block 1: still on the CPU.
    let rm = KvEvent::BlockRemoved(BlockRemoved {
        block_hashes: vec![EngineBlockHash::Int(2)],
        medium: Some(Medium::Gpu),
        group_idx: None,
    });
    let o = t.apply_batch(&batch(vec![rm.clone()]));
    assert_eq!(
        o.changes,
        vec![Change::Removed {
            hashes: vec![wp[1]],
            tier: Tier::Gpu
        }]
    );
    assert_eq!(t.len(), 2);
    // Removing again is a no-op.
    assert!(t.apply_batch(&batch(vec![rm])).changes.is_empty());
    // Clear removes the rest, per tier.
    let o = t.apply_batch(&batch(vec![KvEvent::AllBlocksCleared]));
    assert_eq!(
        o.changes,
        vec![
            Change::Removed {
                hashes: vec![wp[0]],
                tier: Tier::Gpu
            },
            Change::Removed {
                hashes: vec![wp[1]],
                tier: Tier::Cpu
            },
        ]
    );
    assert!(t.is_empty());
}

#[test]
fn replaying_a_batch_changes_nothing() {
    let mut t = EngineTracker::new("m", 16);
    let b = batch(vec![stored(&[1, 2], None, (0..32).collect(), 16)]);
    assert_eq!(t.apply_batch(&b).changes.len(), 1);
    assert!(t.apply_batch(&b).changes.is_empty());
}

#[test]
fn a_removed_parent_still_chains_its_child() {
    let mut t = EngineTracker::new("m", 16);
    let toks: Vec<u32> = (0..32).collect();
    let want = hash_tokens(HashSeed::new("m", "", ""), 16, &toks);
    t.apply_batch(&batch(vec![stored(&[1], None, toks[..16].to_vec(), 16)]));
    t.apply_batch(&batch(vec![KvEvent::BlockRemoved(BlockRemoved {
        block_hashes: vec![EngineBlockHash::Int(1)],
        ..Default::default()
    })]));
    let o = t.apply_batch(&batch(vec![stored(&[2], Some(1), toks[16..].to_vec(), 16)]));
    assert_eq!(
        o.changes,
        vec![Change::Stored {
            parent: Some(want[0]),
            hashes: vec![want[1]],
            tier: Tier::Gpu
        }]
    );
}

#[test]
fn malformed_store_is_counted() {
    let mut t = EngineTracker::new("m", 16);
    let o = t.apply_batch(&batch(vec![stored(&[1, 2], None, (0..20).collect(), 16)]));
    assert_eq!(o.malformed, 1);
    let o = t.apply_batch(&batch(vec![stored(&[1], None, vec![1], 0)]));
    assert_eq!(o.malformed, 1, "block size 0 with tokens");
    assert!(t.is_empty());
}

#[test]
fn blocks_with_multimodal_keys_never_match_the_text_chain() {
    let toks: Vec<u32> = (0..32).collect();
    let plain = hash_tokens(HashSeed::new("m", "", ""), 16, &toks);
    let with = |image: &str, h: u64| {
        let mut t = EngineTracker::new("m", 16);
        let ev = KvEvent::BlockStored(BlockStored {
            block_hashes: vec![EngineBlockHash::Int(h), EngineBlockHash::Int(h + 1)],
            token_ids: toks.clone(),
            block_size: 16,
            extra_keys: Some(vec![Value::Nil, Value::Array(vec![Value::from(image)])]),
            ..Default::default()
        });
        let o = t.apply_batch(&batch(vec![ev]));
        let Change::Stored { hashes, .. } = &o.changes[0] else {
            panic!()
        };
        hashes.clone()
    };
    let (a, b) = (with("img-a", 10), with("img-b", 20));
    // Block 0 is text: it matches; block 1 holds an image: it does not, and
    // two images with equal placeholder tokens differ.
    assert_eq!((a[0], b[0]), (plain[0], plain[0]));
    assert_ne!(a[1], plain[1]);
    assert_ne!(b[1], plain[1]);
    assert_ne!(a[1], b[1]);
    // The same engine block agrees with itself.
    assert_eq!(with("img-a", 10), a);
}

#[test]
fn which_extra_keys_a_router_can_derive() {
    let ev = |keys: Vec<Value>, lora: Option<&str>, parent: bool| BlockStored {
        extra_keys: Some(vec![Value::Array(keys)]),
        lora_name: lora.map(str::to_owned),
        parent_block_hash: parent.then_some(EngineBlockHash::Int(1)),
        ..Default::default()
    };
    let s = Value::from;
    // A salt, a LoRA name, both: derivable.
    assert!(!ev(vec![s("salt")], None, false).opaque_keys(0));
    assert!(!ev(vec![s("lora")], Some("lora"), false).opaque_keys(0));
    assert!(!ev(vec![s("lora"), s("salt")], Some("lora"), false).opaque_keys(0));
    assert!(!ev(vec![s("lora")], Some("lora"), true).opaque_keys(0));
    // An image id before the salt, a digest after it, an image in a later
    // block, a (id, offset) pair: not.
    assert!(ev(vec![s("img"), s("salt")], None, false).opaque_keys(0));
    assert!(ev(vec![s("salt"), Value::Binary(vec![1; 8])], None, false).opaque_keys(0));
    assert!(ev(vec![s("img")], None, true).opaque_keys(0));
    assert!(ev(
        vec![Value::Array(vec![s("img"), Value::from(0)])],
        None,
        true
    )
    .opaque_keys(0));
    // No keys for the block, or nil.
    assert!(!BlockStored::default().opaque_keys(0));
    assert!(!ev(vec![], None, true).opaque_keys(3));
}

#[test]
fn an_engine_hash_stored_again_with_other_tokens_withdraws_the_old_block() {
    let mut t = EngineTracker::new("m", 16);
    let seed = HashSeed::new("m", "", "");
    let (old, new) = (
        hash_tokens(seed, 2, &[1, 2])[0],
        hash_tokens(seed, 2, &[3, 4])[0],
    );
    let o = t.apply_batch(&batch(vec![stored(&[7], None, vec![1, 2], 2)]));
    assert!(matches!(&o.changes[..], [Change::Stored { hashes, .. }] if hashes == &[old]));
    let o = t.apply_batch(&batch(vec![stored(&[7], None, vec![3, 4], 2)]));
    match &o.changes[..] {
        [Change::Removed {
            hashes: r,
            tier: Tier::Gpu,
        }, Change::Stored { hashes: s, .. }] => {
            assert_eq!((r.as_slice(), s.as_slice()), (&[old][..], &[new][..]));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(t.len(), 1);
    let o = t.apply_batch(&batch(vec![KvEvent::BlockRemoved(BlockRemoved {
        block_hashes: vec![EngineBlockHash::Int(7)],
        ..Default::default()
    })]));
    assert!(matches!(&o.changes[..], [Change::Removed { hashes, .. }] if hashes == &[new]));
    assert_eq!(t.len(), 0);
}

#[test]
fn new_blocks_beyond_the_bound_are_refused_and_removals_make_room() {
    let mut t = EngineTracker::new("m", 16).with_max_blocks(2);
    let o = t.apply_batch(&batch(vec![stored(&[1, 2, 3], None, (0..6).collect(), 2)]));
    assert_eq!(o.refused, 1);
    assert_eq!(t.len(), 2);
    // Known blocks in another tier are not new.
    let cpu = KvEvent::BlockStored(BlockStored {
        block_hashes: vec![EngineBlockHash::Int(1)],
        medium: Some(Medium::Cpu),
        ..Default::default()
    });
    assert_eq!(t.apply_batch(&batch(vec![cpu])).refused, 0);
    let o = t.apply_batch(&batch(vec![KvEvent::BlockRemoved(BlockRemoved {
        block_hashes: vec![EngineBlockHash::Int(2)],
        ..Default::default()
    })]));
    assert_eq!(o.refused, 0);
    let o = t.apply_batch(&batch(vec![stored(&[4], None, vec![9, 9], 2)]));
    assert_eq!((o.refused, t.len()), (0, 2));
}
