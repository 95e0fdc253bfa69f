//! The KV events the engine publishes over real ZMQ (127.0.0.1, port 0),
//! fetched back through the replay socket and decoded with the agent's
//! decoder, describe exactly what the engine's cache holds.

use bytes::Bytes;
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use std::collections::HashMap;
use warmpath_core::prefix_cache::{engine_block_hash, EngineBlockHash as Local};
use warmpath_engine::config::LlamaConfig;
use warmpath_engine::model::Llama;
use warmpath_engine::weights::random_weights;
use warmpath_engine::{events, Engine, EngineOptions};
use warmpath_vllm_events::decode::decode_batch;
use warmpath_vllm_events::wire::{parse_replay_reply, END_OF_REPLAY};
use warmpath_vllm_events::{EngineBlockHash, KvEvent, Medium};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

fn int(h: &EngineBlockHash) -> u64 {
    match h {
        EngineBlockHash::Int(v) => *v,
        EngineBlockHash::Bytes(_) => panic!("the engine sends integer hashes"),
    }
}

/// Replays every batch from seq 0 and applies it: hash -> block tokens.
async fn replay(endpoint: &str, bs: usize) -> (HashMap<u64, Vec<u32>>, usize) {
    let mut dealer = DealerSocket::new();
    dealer.connect(endpoint).await.unwrap();
    let req = vec![Bytes::new(), Bytes::from(0u64.to_be_bytes().to_vec())];
    dealer
        .send(ZmqMessage::try_from(req).unwrap())
        .await
        .unwrap();
    let mut mirror: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut batches = 0;
    loop {
        let frames = dealer.recv().await.unwrap().into_vec();
        let (seq, payload) = parse_replay_reply(&frames).unwrap();
        if seq == END_OF_REPLAY {
            return (mirror, batches);
        }
        assert_eq!(seq, batches as u64, "replayed in order from 0");
        batches += 1;
        let batch = decode_batch(&payload).unwrap();
        for ev in batch.events {
            match ev {
                KvEvent::BlockStored(s) => {
                    assert_eq!(s.block_size as usize, bs);
                    assert_eq!(s.medium, Some(Medium::Gpu));
                    let mut parent = s.parent_block_hash.as_ref().map(|h| Local(int(h)));
                    let salt = if parent.is_none() {
                        s.cache_salt()
                    } else {
                        None
                    };
                    for (i, (h, blk)) in s
                        .block_hashes
                        .iter()
                        .zip(s.token_ids.chunks_exact(bs))
                        .enumerate()
                    {
                        let salt = if i == 0 { salt } else { None };
                        // The hash really is the engine's chained hash of these tokens.
                        assert_eq!(int(h), engine_block_hash(parent, blk, salt).0);
                        mirror.insert(int(h), blk.to_vec());
                        parent = Some(Local(int(h)));
                    }
                }
                KvEvent::BlockRemoved(r) => {
                    for h in &r.block_hashes {
                        assert!(mirror.remove(&int(h)).is_some(), "removed an unknown block");
                    }
                }
                KvEvent::AllBlocksCleared => mirror.clear(),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_events_match_the_cache() {
    let bs = 4;
    let (sink, bound) = events::start(Some("tcp://127.0.0.1:0"), Some("tcp://127.0.0.1:0"), "kv")
        .await
        .unwrap();
    let bound = bound.unwrap();
    assert!(bound.events.starts_with("tcp://127.0.0.1:"));
    // The sink blocks when its queue is full, so the engine runs off the runtime.
    let engine = tokio::task::spawn_blocking(move || {
        let cfg = LlamaConfig::tiny(200);
        let w = random_weights(&cfg, 3, DType::F32, &Device::Cpu).unwrap();
        let model =
            Llama::load(VarBuilder::from_tensors(w, DType::F32, &Device::Cpu), &cfg).unwrap();
        let opts = EngineOptions {
            block_size: bs,
            cache_blocks: 8,
            prefill_chunk: 64,
        };
        let mut e = Engine::new(model, opts, sink).unwrap();
        let p =
            |seed: u32, n: u32| -> Vec<u32> { (0..n).map(|i| (seed * 31 + i * 7) % 200).collect() };
        e.prefill(&p(1, 14), None).unwrap();
        e.prefill(&p(1, 14), Some("acme")).unwrap();
        e.reset_cache().unwrap();
        e.prefill(&p(2, 21), Some("acme")).unwrap();
        e.prefill(&p(3, 17), None).unwrap();
        e.prefill(&p(2, 23), Some("acme")).unwrap();
        e
    })
    .await
    .unwrap();
    let mut want: Vec<u64> = engine.cache().hashes().map(|h| h.0).collect();
    want.sort();
    // The publisher task may lag behind the engine: replay until it caught up.
    for _ in 0..100 {
        let (mirror, batches) = replay(bound.replay.as_deref().unwrap(), bs).await;
        let mut got: Vec<u64> = mirror.keys().copied().collect();
        got.sort();
        if got == want {
            assert!(batches >= 6);
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("replayed events never matched the cache contents");
}
