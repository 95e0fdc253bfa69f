//! The trace as [`crate::optimum`] sees it in `compare`: each request's full
//! prompt blocks, tokenized as the simulated engines tokenize it (the tiny
//! tokenizer and chat template), hashed as the router hashes them (the tenant
//! seeds the chain, as the router salts with `cache_salt`).

use super::driver::Sample;
use crate::optimum::{self, Fleet, OptRequest, Optimum};
use crate::workload::TraceRequest;
use warmpath_core::request::{Expect, Request};
use warmpath_core::tokenize::ChatTokenizer;
use warmpath_core::{hash_tokens, HashSeed};

/// One request's prompt: its token count and its chain of full blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Chain {
    /// Prompt tokens as tokenized here.
    pub tokens: u64,
    /// Chained hashes of its full blocks.
    pub blocks: Vec<u64>,
}

/// The chains of `trace`; `None` for conversations (their next turns carry
/// the answers the engines gave, unknown before the run) or when a request
/// cannot be tokenized.
pub(super) fn chains(
    trace: &[TraceRequest],
    tok: &ChatTokenizer,
    block_size: usize,
) -> Option<Vec<Chain>> {
    if trace.iter().any(|t| t.conversation().is_some()) {
        return None;
    }
    let bs = block_size.max(1);
    trace
        .iter()
        .map(|t| {
            let body = t.body(false).to_string();
            let expect = if t.messages.is_some() {
                Expect::Chat
            } else {
                Expect::Completion
            };
            let req = Request::parse(body.as_bytes(), expect).ok()?;
            let ids = tok.encode_request(&req).ok()?;
            let seed = HashSeed::new("", "", t.tenant.as_deref().unwrap_or(""));
            let blocks = hash_tokens(seed, bs, &ids).iter().map(|h| h.0).collect();
            Some(Chain {
                tokens: ids.len() as u64,
                blocks,
            })
        })
        .collect()
}

/// Both references for one run: the requests that succeeded, in arrival
/// order, in flight from arrival to their measured completion. `None` when
/// the engines counted the prompts differently from here for more than 1% of
/// the requests (another tokenizer: the chains would not be theirs).
pub(super) fn optimum(chains: &[Chain], samples: &[Sample], fleet: Fleet) -> Option<Optimum> {
    let mut order: Vec<usize> = (0..chains.len().min(samples.len()))
        .filter(|&i| samples[i].error.is_none() && samples[i].prompt_tokens > 0)
        .collect();
    order.sort_by(|&a, &b| samples[a].arrival_s.total_cmp(&samples[b].arrival_s));
    let differ = order
        .iter()
        .filter(|&&i| chains[i].tokens != samples[i].prompt_tokens)
        .count();
    if differ * 100 > order.len() {
        return None;
    }
    let trace: Vec<OptRequest> = order
        .iter()
        .map(|&i| OptRequest {
            arrival: samples[i].arrival_s,
            done: samples[i].done_s,
            items: chains[i].blocks.iter().map(|&b| (b, 1)).collect(),
            prompt_tokens: samples[i].prompt_tokens,
        })
        .collect();
    optimum::optimum(&trace, fleet)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::workload::ChatMessage;

    fn chat(doc: &str, q: &str, tenant: Option<&str>) -> TraceRequest {
        TraceRequest {
            arrival: 0.0,
            model: "warmpath-tiny".into(),
            messages: Some(vec![
                ChatMessage::new("system", doc),
                ChatMessage::new("user", q),
            ]),
            prompt: None,
            max_tokens: 4,
            tenant: tenant.map(str::to_owned),
            tenant_via: None,
            group: None,
        }
    }

    #[test]
    fn shared_documents_share_blocks_and_tenants_do_not() {
        let tok = crate::sim::tiny_tokenizer().unwrap();
        let doc = warmpath_core::tokenize::tiny::corpus_slice(0, 400);
        let trace = [
            chat(&doc, "first?", None),
            chat(&doc, "second question?", None),
            chat(&doc, "first?", Some("t1")),
        ];
        let c = chains(&trace, &tok, 16).unwrap();
        let common = c[0]
            .blocks
            .iter()
            .zip(&c[1].blocks)
            .take_while(|(a, b)| a == b)
            .count();
        assert!(common >= 5, "{common} blocks shared");
        assert_ne!(c[0].blocks[0], c[2].blocks[0]);
        let samples: Vec<Sample> = c
            .iter()
            .enumerate()
            .map(|(i, ch)| Sample {
                arrival_s: i as f64,
                done_s: i as f64 + 0.5,
                prompt_tokens: ch.tokens,
                ..Sample::default()
            })
            .collect();
        let fleet = Fleet {
            backends: 2,
            cache_blocks: 1000,
            block_size: 16,
            max_in_flight: 8,
        };
        let o = optimum(&c, &samples, fleet).unwrap();
        let prompt: u64 = c.iter().map(|x| x.tokens).sum();
        assert!(o.bound >= (common as f64 * 16.0) / prompt as f64 - 1e-9);
        let mut other = samples.clone();
        other[0].prompt_tokens += 1;
        assert_eq!(optimum(&c, &other, fleet), None);
    }
}
