//! Stage timings of the router's kv_aware work (parse, render, encode, block
//! hashes) for an ~8000-token chat request with a new question each time,
//! one request after a pause of `pause_us` (default 5000: how a router core
//! at 200 req/s finds each request, caches and predictors cold) or back to
//! back (`0`). `ONLY=question` / `ONLY=system` encode only the question's
//! piece / only the text before it, to see which one pays. `SHAPE=rag` puts
//! the document and the question in one user message (RAG; no system
//! message), so the document repeats with a new tail inside one piece.
//! `SPIN=1` busy-waits through the pause instead of sleeping: the thread
//! keeps its core, so what remains cold is only what the passing time itself
//! evicts.
//!
//! `cargo run --release -p warmpath-core --features tokenizer --example cold_stages -- [pause_us]`
#![allow(clippy::unwrap_used)]
use std::time::{Duration, Instant};
use warmpath_core::request::{Expect, Request, RequestBody};
use warmpath_core::tokenize::{tiny, CacheConfig, ChatTokenizer};
use warmpath_core::{ChainHasher, HashSeed};

fn main() {
    let pause: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5000);
    let files = tiny::files().unwrap();
    let tok = ChatTokenizer::new(&files, CacheConfig::default()).unwrap();
    let mut system = String::new();
    let mut at = 0;
    while tok.encode_text_uncached(&system, false).unwrap().len() < 8000 {
        system.push_str(&tiny::corpus_slice(at, 512));
        at += 509;
    }
    let rag = std::env::var("SHAPE").as_deref() == Ok("rag");
    let body = if rag {
        serde_json::json!({"model": "m", "max_tokens": 1, "messages": [
            {"role": "user", "content": format!("{system}\n\nSLOT")}]})
    } else {
        serde_json::json!({"model": "m", "max_tokens": 1, "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "SLOT"}]})
    }
    .to_string();
    let at = body.find("SLOT").unwrap();
    let (head, tail) = (&body[..at], &body[at + 4..]);
    let spin = std::env::var("SPIN").is_ok();
    let n = 1500;
    let mut t = vec![[0f64; 5]; n];
    for i in 0..n + 50 {
        let b = format!(
            "{head}Question {i}: what does the document above say about topic {}?{tail}",
            i * 7919 % 1000
        )
        .into_bytes();
        if pause > 0 && spin {
            let until = Instant::now() + Duration::from_micros(pause);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        } else if pause > 0 {
            std::thread::sleep(Duration::from_micros(pause));
        }
        let t0 = Instant::now();
        let req = Request::parse(&b, Expect::Chat).unwrap();
        let t1 = Instant::now();
        let RequestBody::Chat(chat) = &req.body else {
            unreachable!()
        };
        let text = tok.render_chat(chat).unwrap();
        let t2 = Instant::now();
        let ids = match std::env::var("ONLY").as_deref() {
            Ok("question") => tok
                .encode_text(
                    &format!(
                        "\n\nQuestion {i}: what does the document above say about topic {}?",
                        i * 7919 % 1000
                    ),
                    false,
                )
                .unwrap(),
            Ok("system") => tok
                .encode_text(
                    &text[..text.find("<|start_header_id|>user").unwrap()],
                    false,
                )
                .unwrap(),
            _ => tok.encode_text(&text, false).unwrap(),
        };
        let t3 = Instant::now();
        let mut hashes = Vec::new();
        ChainHasher::new(HashSeed::new("m", "", ""), 16).extend(&ids, &mut hashes);
        let t4 = Instant::now();
        drop((req, text, ids, hashes));
        let t5 = Instant::now();
        if i >= 50 {
            let d = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e6;
            t[i - 50] = [d(t0, t1), d(t1, t2), d(t2, t3), d(t3, t4), d(t4, t5)];
        }
    }
    let names = ["parse", "render", "encode", "hash", "drop"];
    let mut tot: Vec<f64> = t.iter().map(|r| r.iter().sum()).collect();
    for (k, name) in names.iter().enumerate() {
        let mut v: Vec<f64> = t.iter().map(|r| r[k]).collect();
        v.sort_by(f64::total_cmp);
        println!(
            "{name:>8}: p50 {:7.1} us  p90 {:7.1} us",
            v[n / 2],
            v[n * 9 / 10]
        );
    }
    tot.sort_by(f64::total_cmp);
    println!(
        "{:>8}: p50 {:7.1} us  p90 {:7.1} us",
        "total",
        tot[n / 2],
        tot[n * 9 / 10]
    );
}
