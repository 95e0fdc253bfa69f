//! Unit tests of [`super`] (pools, membership changes, slot reuse).
#![allow(clippy::unwrap_used)]
use super::*;

fn cfg() -> PoolConfig {
    let mut p = PoolConfig::new("m");
    p.backends = vec![
        BackendConfig::new("http://127.0.0.1:1"),
        BackendConfig {
            url: "http://127.0.0.1:2".into(),
            worker_id: Some("b".into()),
            api_key: None,
        },
    ];
    p
}

#[test]
fn pools_register_backends_and_resolve_adapters() {
    let pools = Pools::build(&[cfg()]).unwrap();
    let p = pools.get("m").unwrap();
    assert_eq!(
        p.index.worker_slot("b"),
        Some(p.backends()[1].endpoint.slot)
    );
    assert_eq!(p.policy().strategy, Strategy::PrefixAware);
    // Adapters are learned from the engines' /v1/models.
    assert!(pools.target("sql").is_err());
    p.backends()[1]
        .endpoint
        .set_learned_adapters(["sql".to_owned()].into());
    let t = pools.target("sql").unwrap();
    assert_eq!(t.adapter.as_deref(), Some("sql"));
    assert_eq!(t.pool.model, "m");
    assert!(pools.target("m").unwrap().adapter.is_none());
    assert!(pools.target("other").is_err());
    assert!(
        pools.get("sql").is_none(),
        "an adapter has no pool of its own"
    );
}

#[test]
fn switching_swaps_the_policy_and_refuses_kv_without_tokenizer() {
    let pools = Pools::build(&[cfg()]).unwrap();
    let p = pools.get("m").unwrap();
    let before = p.policy();
    let prev = p.switch(Strategy::Random, PolicyConfig::default()).unwrap();
    assert_eq!(prev, Strategy::PrefixAware);
    assert_eq!(p.policy().strategy, Strategy::Random);
    assert_eq!(
        before.strategy,
        Strategy::PrefixAware,
        "old snapshot unchanged"
    );
    assert!(matches!(
        p.switch(Strategy::KvAware, PolicyConfig::default()),
        Err(SwitchError::NeedsTokenizer(_))
    ));
    assert_eq!(p.policy().strategy, Strategy::Random);
}

#[test]
fn members_are_added_removed_and_drained_keeping_the_others_index() {
    let pools = Pools::build(&[cfg()]).unwrap();
    let p = pools.get("m").unwrap();
    let b = p.backends()[1].clone();
    p.index
        .store(
            b.endpoint.slot,
            warmpath_core::Tier::Gpu,
            &[warmpath_core::BlockHash(7)],
        )
        .unwrap();
    let before = p.policy();
    let added = p
        .add_backend(&BackendConfig::new("http://127.0.0.1:3"), Origin::Admin)
        .unwrap();
    assert_eq!(p.backends().len(), 3);
    assert_eq!(
        before.backends.len(),
        2,
        "an old snapshot keeps its members"
    );
    assert_eq!(p.policy().strategy, Strategy::PrefixAware, "strategy kept");
    assert!(matches!(
        p.add_backend(&BackendConfig::new("http://127.0.0.1:3"), Origin::Admin),
        Err(MemberError::Duplicate { .. })
    ));
    assert!(matches!(
        p.add_backend(&BackendConfig::new("ftp://x"), Origin::Admin),
        Err(MemberError::Invalid(_))
    ));
    p.remove_backend("http://127.0.0.1:1", true).unwrap();
    assert_eq!(
        p.index.worker_slot("http://127.0.0.1:1"),
        None,
        "entries dropped"
    );
    assert_eq!(
        p.index.block_count(b.endpoint.slot),
        1,
        "the others keep theirs"
    );
    assert!(matches!(
        p.remove_backend("nope", true),
        Err(MemberError::Unknown { .. })
    ));
    p.drain_backend(added.endpoint.id()).unwrap();
    assert!(added.load.is_draining());
    assert!(
        matches!(p.drain_backend("b"), Err(MemberError::LastBackend(_))),
        "the last serving backend stays"
    );
    assert!(matches!(
        p.remove_backend("b", true),
        Err(MemberError::LastBackend(_))
    ));
    p.remove_backend(added.endpoint.id(), true).unwrap();
    assert_eq!(p.backends().len(), 1);
}

#[test]
fn a_membership_change_keeps_kv_aware_placements_by_worker_id() {
    let dir = tempfile::tempdir().unwrap();
    warmpath_core::tokenize::tiny::write_model_dir(dir.path()).unwrap();
    let mut c = cfg();
    c.tokenizer = Some(dir.path().to_owned());
    c.backends.push(BackendConfig::new("http://127.0.0.1:5"));
    let p = Pool::build(&c).unwrap();
    p.switch(Strategy::KvAware, PolicyConfig::default())
        .unwrap();
    let input = warmpath_core::RouteInput {
        prefix_key: 42,
        chain_blocks: 100,
        matches: None,
        ..Default::default()
    };
    let idle = |n| {
        vec![
            warmpath_core::BackendLoad {
                eligible: true,
                ..Default::default()
            };
            n
        ]
    };
    let before = p.policy();
    let d = before
        .policy
        .pick(
            &input,
            &warmpath_core::Loads::new(&idle(3)),
            &mut rand::rng(),
        )
        .unwrap();
    let home = before.backends[d.backend].endpoint.id().to_owned();
    // Remove a member that is not its home: its first request is still
    // prefilling there, and its next one follows it.
    let other = before
        .backends
        .iter()
        .find(|b| b.endpoint.id() != home)
        .unwrap();
    p.remove_backend(other.endpoint.id(), true).unwrap();
    let after = p.policy();
    assert_eq!(after.strategy, Strategy::KvAware);
    let mut loads = idle(2);
    let at = after
        .backends
        .iter()
        .position(|b| b.endpoint.id() == home)
        .unwrap();
    loads[at].pending_prefill_blocks = 1000;
    let again = after
        .policy
        .pick(&input, &warmpath_core::Loads::new(&loads), &mut rand::rng())
        .unwrap();
    assert_eq!(after.backends[again.backend].endpoint.id(), home);
}

#[test]
fn seventy_thousand_adds_and_removals_leave_room_to_join() {
    let pools = Pools::build(&[cfg()]).unwrap();
    let p = pools.get("m").unwrap();
    // The cheapest policy to rebuild: the slots are what is tested.
    p.switch(Strategy::Random, PolicyConfig::default()).unwrap();
    let held = [warmpath_core::BlockHash(7), warmpath_core::BlockHash(8)];
    for i in 0..70_000u32 {
        // Pod churn: a new name each time, as pods of a Deployment get.
        let id = format!("pod-{i}");
        let cfg = BackendConfig {
            url: "http://127.0.0.1:9".into(),
            worker_id: Some(id.clone()),
            api_key: None,
        };
        let b = p.add_backend(&cfg, Origin::Admin).unwrap();
        assert!(
            b.endpoint.slot <= 3,
            "slot {} at cycle {i}",
            b.endpoint.slot
        );
        if i % 7 == 0 {
            p.index
                .store(b.endpoint.slot, warmpath_core::Tier::Gpu, &held)
                .unwrap();
        }
        p.remove_backend(&id, true).unwrap();
        p.compact_removed();
    }
    assert_eq!(p.backends().len(), 2);
    assert_eq!(p.index.distinct_blocks(), 0);
}

#[test]
fn a_new_member_never_inherits_a_removed_ones_cache_claims() {
    let pools = Pools::build(&[cfg()]).unwrap();
    let p = pools.get("m").unwrap();
    let old = p
        .add_backend(&BackendConfig::new("http://127.0.0.1:3"), Origin::Admin)
        .unwrap();
    let chain = [warmpath_core::BlockHash(1), warmpath_core::BlockHash(2)];
    p.index
        .store(old.endpoint.slot, warmpath_core::Tier::Gpu, &chain)
        .unwrap();
    p.remove_backend(old.endpoint.id(), true).unwrap();
    // Its holders are still in the map: its slot is not taken.
    let new = p
        .add_backend(&BackendConfig::new("http://127.0.0.1:4"), Origin::Admin)
        .unwrap();
    assert_ne!(new.endpoint.slot, old.endpoint.slot);
    assert!(p.index.longest_match(&chain).workers.is_empty());
    // After the compaction the slot is reused, and claims nothing.
    p.compact_removed();
    let again = p
        .add_backend(&BackendConfig::new("http://127.0.0.1:5"), Origin::Admin)
        .unwrap();
    assert_eq!(again.endpoint.slot, old.endpoint.slot);
    assert_eq!(p.index.block_count(again.endpoint.slot), 0);
    assert!(p
        .index
        .longest_match(&chain)
        .of(again.endpoint.slot)
        .is_none());
}

#[test]
fn a_restored_member_keeps_its_slot_index_and_placements() {
    let pools = Pools::build(&[cfg()]).unwrap();
    let p = pools.get("m").unwrap();
    let b = p.backends()[1].clone();
    p.index
        .store(
            b.endpoint.slot,
            warmpath_core::Tier::Gpu,
            &[warmpath_core::BlockHash(7)],
        )
        .unwrap();
    b.endpoint
        .set_learned_adapters(["sql".to_owned(), "learned".to_owned()].into());
    p.drain_backend(b.endpoint.id()).unwrap();
    let back = p.restore_backend(&b).unwrap();
    assert!(!back.load.is_draining());
    assert!(!Arc::ptr_eq(&back, &b));
    assert_eq!(
        (back.endpoint.id(), back.endpoint.slot),
        ("b", b.endpoint.slot)
    );
    assert_eq!(p.index.block_count(back.endpoint.slot), 1, "index kept");
    assert!(back.endpoint.serves_adapter("sql") && back.endpoint.serves_adapter("learned"));
    assert!(Arc::ptr_eq(&p.backend("b").unwrap(), &back));
    assert!(
        matches!(p.restore_backend(&b), Err(MemberError::Unknown { .. })),
        "only the member that was set aside"
    );
}

#[test]
fn adding_a_backend_moves_about_a_quarter_of_the_ring_to_it() {
    let pools = Pools::build(&[cfg()]).unwrap();
    let p = pools.get("m").unwrap();
    p.add_backend(&BackendConfig::new("http://127.0.0.1:3"), Origin::Admin)
        .unwrap();
    let pick = |st: &PolicyState, key: u64| {
        let loads = vec![
            warmpath_core::BackendLoad {
                eligible: true,
                ..Default::default()
            };
            st.backends.len()
        ];
        let input = warmpath_core::RouteInput {
            prefix_key: key,
            ..Default::default()
        };
        let d = st
            .policy
            .pick(&input, &warmpath_core::Loads::new(&loads), &mut rand::rng())
            .unwrap();
        st.backends[d.backend].endpoint.id().to_owned()
    };
    let three = p.policy();
    p.add_backend(&BackendConfig::new("http://127.0.0.1:4"), Origin::Admin)
        .unwrap();
    let four = p.policy();
    let keys = 4000u64;
    let mut moved = 0;
    for k in 0..keys {
        let key = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let (a, b) = (pick(&three, key), pick(&four, key));
        if a != b {
            assert_eq!(b, "http://127.0.0.1:4", "keys only move to the new backend");
            moved += 1;
        }
    }
    let share = f64::from(moved) / keys as f64;
    assert!((0.15..0.35).contains(&share), "moved {share}");
}
