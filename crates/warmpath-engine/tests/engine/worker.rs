//! The documented concurrency model: one worker thread runs requests one at a
//! time from a bounded FIFO queue (no batching); a full queue answers Busy at
//! once (HTTP 503); a client that leaves stops its request and the next runs.

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use warmpath_engine::config::LlamaConfig;
use warmpath_engine::model::Llama;
use warmpath_engine::weights::random_weights;
use warmpath_engine::worker::{self, GenerateRequest, StreamItem};
use warmpath_engine::{Engine, EngineError, EngineOptions, Finish, NoEvents};

fn engine() -> Engine {
    let cfg = LlamaConfig::tiny(300);
    let w = random_weights(&cfg, 1, DType::F32, &Device::Cpu).unwrap();
    let model = Llama::load(VarBuilder::from_tensors(w, DType::F32, &Device::Cpu), &cfg).unwrap();
    let opts = EngineOptions {
        block_size: 4,
        cache_blocks: 64,
        prefill_chunk: 64,
    };
    Engine::new(model, opts, Box::new(NoEvents)).unwrap()
}

fn request(first: u32, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        tokens: (first..first + 12).collect(),
        salt: None,
        max_tokens,
        stop_ids: vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_at_a_time_from_a_bounded_fifo_queue() {
    let (handle, thread) = worker::spawn(engine(), 1).unwrap();
    // A runs; it produces more tokens than its stream buffers, and nobody
    // reads them, so the worker stays busy with it.
    let mut a = handle.generate(request(1, 500)).unwrap();
    assert!(matches!(a.recv().await, Some(StreamItem::Token(_))));
    // B waits in the one queue slot; C finds the queue full.
    let mut b = handle.generate(request(40, 3)).unwrap();
    let c = handle.generate(request(80, 3)).unwrap_err();
    assert!(matches!(c, EngineError::Busy(1)), "{c}");
    assert!(c.is_retryable());
    let s = handle.stats();
    assert_eq!((s.running, s.waiting), (1, 1));
    // A's client leaves: A stops, then B runs to completion.
    drop(a);
    let mut tokens = 0;
    loop {
        match b.recv().await.unwrap() {
            StreamItem::Token(_) => tokens += 1,
            StreamItem::Done(g) => {
                assert_eq!((g.finish, g.tokens.len(), tokens), (Finish::Length, 3, 3));
                break;
            }
            StreamItem::Failed(e) => panic!("{e}"),
        }
    }
    // Nothing is left running and the worker ends once every handle is gone.
    handle.reset_prefix_cache().await.unwrap();
    assert_eq!(handle.stats().waiting, 0);
    drop(handle);
    tokio::task::spawn_blocking(move || thread.join())
        .await
        .unwrap();
}
