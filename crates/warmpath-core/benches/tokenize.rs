//! Tokenizing an ~8000-token chat request with the tiny tokenizer: without the
//! chunk memo (cold) and with it warm (the system prompt's chunks kept), and
//! the RAG shape (document and a new question in one user message).
//!
//! `cargo bench -p warmpath-core --features tokenizer --bench tokenize`

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::{json, Value};
use std::hint::black_box;
use warmpath_core::request::{Expect, Request, RequestBody};
use warmpath_core::tokenize::{tiny, CacheConfig, ChatTokenizer};

fn system_prompt(tok: &ChatTokenizer, tokens: usize) -> String {
    let mut s = String::new();
    let mut at = 0;
    while tok
        .encode_text_uncached(&s, false)
        .map_or(0, |ids| ids.len())
        < tokens
    {
        s.push_str(&tiny::corpus_slice(at, 4000));
        at += 4000;
    }
    s
}

fn body(system: &str, question: &str) -> Value {
    json!({"model": "tiny", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": question}]})
}

fn bench(c: &mut Criterion) {
    let files = tiny::files().expect("tiny tokenizer");
    let cold = ChatTokenizer::new(
        &files,
        CacheConfig {
            capacity_tokens: 0,
            ..CacheConfig::default()
        },
    )
    .expect("tokenizer");
    let warm = ChatTokenizer::new(&files, CacheConfig::default()).expect("tokenizer");
    let system = system_prompt(&cold, 8000);
    let v = body(
        &system,
        "What does the document say about the cache? Answer briefly.",
    );
    let req = Request::from_value(&v, Expect::Chat).expect("request");
    let RequestBody::Chat(chat) = &req.body else {
        unreachable!()
    };
    let n = cold.encode_request(&req).expect("encode").len();
    warm.encode_request(&req).expect("encode"); // fill the caches
    eprintln!(
        "request: {n} tokens, {} bytes of system prompt",
        system.len()
    );

    let mut g = c.benchmark_group("tokenize_8k_chat");
    g.bench_function("render_only", |b| {
        b.iter(|| warm.render_chat(black_box(chat)))
    });
    g.bench_function("cold_no_cache", |b| {
        b.iter(|| cold.encode_request(black_box(&req)))
    });
    // A system prompt never seen before (the first request of a new
    // document): the long segment misses the cache and is encoded piece by
    // piece, then cached. The counter lives outside the closure, which
    // criterion calls once per sample.
    let mut i = 0u64;
    g.bench_function("first_sight_memo_on", |b| {
        b.iter_batched(
            || {
                i += 1;
                let fresh = body(&format!("Document {i}. {system}"), "What is in it?");
                Request::from_value(&fresh, Expect::Chat)
                    .expect("request")
                    .into_owned()
            },
            |r| warm.encode_request(black_box(&r)),
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function("warm_memo", |b| {
        b.iter(|| warm.encode_request(black_box(&req)))
    });
    // RAG: the document and a new question in one user message; the
    // document's chunks come from the memo, the tail is encoded.
    let mut k = 0u64;
    g.bench_function("rag_new_question", |b| {
        b.iter_batched(
            || {
                k += 1;
                let v = json!({"model": "tiny", "messages": [{"role": "user",
                    "content": format!("{system}\n\nQuestion {k}: what about topic {}?", k % 997)}]});
                Request::from_value(&v, Expect::Chat)
                    .expect("request")
                    .into_owned()
            },
            |r| warm.encode_request(black_box(&r)),
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function("parse_render_encode_warm", |b| {
        let bytes = serde_json::to_vec(&v).expect("json");
        b.iter(|| {
            let r = Request::from_slice(black_box(&bytes), Expect::Chat).expect("request");
            warm.encode_request(&r)
        })
    });
    // The counter outlives the closure, which criterion calls once per sample.
    let mut q = 0u64;
    g.bench_function("parse_render_encode_warm_distinct_questions", |b| {
        // Every request asks a question of its own (the system prompt stays).
        const SLOT: &str = "What does the document say about the cache? Answer briefly.";
        let text = serde_json::to_string(&v).expect("json");
        let at = text.find(SLOT).expect("slot");
        let (head, tail) = (&text[..at], &text[at + SLOT.len()..]);
        b.iter_batched(
            || {
                q += 1;
                let i = q;
                format!("{head}Question {i}: what about topic {}?{tail}", i % 997).into_bytes()
            },
            |bytes| {
                let r = Request::from_slice(black_box(&bytes), Expect::Chat).expect("request");
                warm.encode_request(&r)
            },
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
