//! The built-in generators. Two RNG streams per trace: one for arrival gaps,
//! one for content, so the rate never changes the requests.

use super::spec::{
    ChatMessage, TenantVia, TraceRequest, WorkloadKind, WorkloadSpec, CONVERSATION_PREFIX,
};
use crate::dist::{unit_exp, Zipf};
use crate::error::BenchError;
use crate::words::WordGen;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Tokens of a request's distinct question.
const QUESTION_TOKENS: usize = 50;
/// Tenants of the `tenants` workload.
const TENANTS: usize = 4;

/// Generates the trace `spec` describes.
pub fn generate(spec: &WorkloadSpec) -> Result<Vec<TraceRequest>, BenchError> {
    spec.validate()?;
    let words = WordGen::default();
    let mut arrivals = SmallRng::seed_from_u64(spec.seed ^ 0xa771_7a15);
    let mut rng = SmallRng::seed_from_u64(spec.seed);
    let mut t = 0.0;
    let mut times = Vec::with_capacity(spec.requests);
    for _ in 0..spec.requests {
        t += unit_exp(&mut arrivals) / spec.rate;
        times.push(t);
    }
    let mut g = Gen {
        spec,
        words: &words,
        rng: &mut rng,
    };
    let bodies = match spec.kind {
        WorkloadKind::Long => g.long(),
        WorkloadKind::Short => g.short(),
        WorkloadKind::Rag => g.rag(),
        WorkloadKind::Code => g.code(),
        WorkloadKind::Tenants => g.tenants(),
    };
    Ok(bodies
        .into_iter()
        .zip(times)
        .map(|(mut r, at)| {
            r.arrival = at;
            r
        })
        .collect())
}

struct Gen<'a> {
    spec: &'a WorkloadSpec,
    words: &'a WordGen,
    rng: &'a mut SmallRng,
}

impl Gen<'_> {
    fn request(&self, group: String) -> TraceRequest {
        TraceRequest {
            model: self.spec.model.clone(),
            max_tokens: self.spec.max_tokens,
            group: Some(group),
            ..TraceRequest::default()
        }
    }

    fn chat(&self, group: String, system: &str, user: String) -> TraceRequest {
        let mut r = self.request(group);
        let system = ChatMessage::new("system", system);
        r.messages = Some(vec![system, ChatMessage::new("user", user)]);
        r
    }

    fn question(&mut self) -> String {
        let q = self.words.text_tokens(self.rng, QUESTION_TOKENS);
        format!("Question: {}?", q.trim_end_matches('.'))
    }

    fn long(&mut self) -> Vec<TraceRequest> {
        let docs: Vec<String> = (0..self.spec.docs)
            .map(|i| {
                format!(
                    "You answer questions about document {i}.\n\n{}",
                    self.words.text_tokens(self.rng, self.spec.prefix_tokens)
                )
            })
            .collect();
        let zipf = Zipf::new(docs.len(), self.spec.zipf);
        (0..self.spec.requests)
            .map(|_| {
                let d = zipf.sample(self.rng);
                let q = self.question();
                self.chat(format!("doc-{d}"), &docs[d], q)
            })
            .collect()
    }

    fn short(&mut self) -> Vec<TraceRequest> {
        struct Conv {
            id: usize,
            history: Vec<ChatMessage>,
            tokens: usize,
        }
        let start = self.spec.prefix_tokens.max(1);
        let mut next_id = 0usize;
        let mut new_conv = |g: &mut Self| {
            next_id += 1;
            Conv {
                id: next_id - 1,
                history: vec![ChatMessage::new(
                    "system",
                    format!(
                        "You are assistant number {}. {}",
                        next_id - 1,
                        g.words.text_tokens(g.rng, start)
                    ),
                )],
                tokens: start,
            }
        };
        let mut convs: Vec<Conv> = (0..self.spec.docs).map(|_| new_conv(self)).collect();
        let mut out = Vec::with_capacity(self.spec.requests);
        for _ in 0..self.spec.requests {
            let c = self.rng.random_range(0..convs.len());
            if convs[c].tokens > 2000 {
                convs[c] = new_conv(self);
            }
            let user_tokens = self.rng.random_range(30..=120);
            let user = self.words.text_tokens(self.rng, user_tokens);
            let reply_tokens = self.rng.random_range(80..=300);
            let reply = self.words.text_tokens(self.rng, reply_tokens);
            let conv = &mut convs[c];
            conv.history.push(ChatMessage::new("user", user));
            let mut r = self.request(format!("{CONVERSATION_PREFIX}{}", conv.id));
            r.messages = Some(conv.history.clone());
            // Replayed closed loop, the next turn carries the real answer.
            r.max_tokens = reply_tokens as u32;
            out.push(r);
            // The next turn resends this one plus the assistant's answer.
            conv.history.push(ChatMessage::new("assistant", reply));
            conv.tokens += user_tokens + reply_tokens;
        }
        out
    }

    fn rag(&mut self) -> Vec<TraceRequest> {
        let system = format!(
            "Answer from the retrieved passages only. {}",
            self.words.text_tokens(self.rng, self.spec.prefix_tokens)
        );
        let chunks: Vec<String> = (0..self.spec.docs)
            .map(|i| format!("[passage {i}] {}", self.words.text_tokens(self.rng, 500)))
            .collect();
        let zipf = Zipf::new(chunks.len(), self.spec.zipf);
        (0..self.spec.requests)
            .map(|_| {
                let first = zipf.sample(self.rng);
                let mut picked = vec![first];
                while picked.len() < 3.min(chunks.len()) {
                    let c = self.rng.random_range(0..chunks.len());
                    if !picked.contains(&c) {
                        picked.push(c);
                    }
                }
                let context: Vec<&str> = picked.iter().map(|&i| chunks[i].as_str()).collect();
                let q = self.question();
                let user = format!("{}\n\n{q}", context.join("\n\n"));
                self.chat(format!("chunk-{first}"), &system, user)
            })
            .collect()
    }

    fn code(&mut self) -> Vec<TraceRequest> {
        let files: Vec<String> = (0..self.spec.docs)
            .map(|i| {
                let mut f = format!("// file {i}\n");
                // A line is ~12 tokens.
                for _ in 0..(self.spec.prefix_tokens / 12).max(1) {
                    f.push_str(&self.words.code_line(self.rng));
                    f.push('\n');
                }
                f
            })
            .collect();
        let zipf = Zipf::new(files.len(), self.spec.zipf);
        (0..self.spec.requests)
            .map(|_| {
                let f = zipf.sample(self.rng);
                let ask = self.words.text_tokens(self.rng, QUESTION_TOKENS);
                let mut r = self.request(format!("file-{f}"));
                r.prompt = Some(format!("{}\n// TODO: {ask}\n", files[f]));
                r
            })
            .collect()
    }

    fn tenants(&mut self) -> Vec<TraceRequest> {
        let system = format!(
            "You are the support assistant. {}",
            self.words.text_tokens(self.rng, self.spec.prefix_tokens)
        );
        (0..self.spec.requests)
            .map(|_| {
                let t = self.rng.random_range(0..TENANTS);
                let q = self.question();
                let mut r = self.chat(format!("tenant-{t}"), &system, q);
                r.tenant = Some(format!("tenant-{t}"));
                r.tenant_via = Some(if self.rng.random_bool(0.5) {
                    TenantVia::Header
                } else {
                    TenantVia::Body
                });
                r
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::workload::rescale;

    fn spec(kind: WorkloadKind) -> WorkloadSpec {
        WorkloadSpec {
            requests: 60,
            prefix_tokens: 400,
            ..WorkloadSpec::new(kind)
        }
    }

    #[test]
    fn every_kind_generates_valid_ordered_requests() {
        for kind in [
            WorkloadKind::Long,
            WorkloadKind::Short,
            WorkloadKind::Rag,
            WorkloadKind::Code,
            WorkloadKind::Tenants,
        ] {
            let trace = generate(&spec(kind)).unwrap();
            assert_eq!(trace.len(), 60, "{kind:?}");
            for r in &trace {
                r.validate().unwrap();
            }
            assert!(trace.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        }
    }

    #[test]
    fn same_seed_same_trace_and_rate_only_stretches_time() {
        let a = generate(&spec(WorkloadKind::Long)).unwrap();
        let b = generate(&spec(WorkloadKind::Long)).unwrap();
        assert_eq!(a, b);
        let fast = generate(&WorkloadSpec {
            rate: 40.0,
            ..spec(WorkloadKind::Long)
        })
        .unwrap();
        for (x, y) in a.iter().zip(&fast) {
            assert_eq!(x.messages, y.messages);
            assert!((x.arrival / 4.0 - y.arrival).abs() < 1e-9);
        }
        let stretched = rescale(&a, 10.0, 40.0);
        assert!((stretched[5].arrival - fast[5].arrival).abs() < 1e-9);
        let other = generate(&WorkloadSpec {
            seed: 7,
            ..spec(WorkloadKind::Long)
        })
        .unwrap();
        assert_ne!(a, other);
    }

    #[test]
    fn long_requests_share_documents() {
        let trace = generate(&spec(WorkloadKind::Long)).unwrap();
        let groups: std::collections::HashSet<_> = trace.iter().map(|r| &r.group).collect();
        assert!(groups.len() < trace.len());
        // Two requests of one document share the system message but not the question.
        // Some document is asked about at least twice (fewer groups than requests).
        let (i, twin) = trace
            .iter()
            .enumerate()
            .find_map(|(i, r)| {
                trace[i + 1..]
                    .iter()
                    .find(|t| t.group == r.group)
                    .map(|t| (i, t))
            })
            .unwrap();
        let first = &trace[i];
        let (m1, m2) = (
            first.messages.as_ref().unwrap(),
            twin.messages.as_ref().unwrap(),
        );
        assert_eq!(m1[0], m2[0]);
        assert_ne!(m1[1], m2[1]);
    }

    #[test]
    fn short_history_grows_turn_by_turn() {
        let trace = generate(&spec(WorkloadKind::Short)).unwrap();
        assert!(trace.iter().all(|r| r.conversation().is_some()));
        assert!(trace.iter().all(|r| (80..=300).contains(&r.max_tokens)));
        let long = generate(&spec(WorkloadKind::Long)).unwrap();
        assert!(long.iter().all(|r| r.conversation().is_none()));
        let group = trace[0].group.clone();
        let turns: Vec<_> = trace.iter().filter(|r| r.group == group).collect();
        if turns.len() >= 2 {
            let (a, b) = (
                turns[0].messages.as_ref().unwrap(),
                turns[1].messages.as_ref().unwrap(),
            );
            assert_eq!(&b[..a.len()], &a[..]);
            assert_eq!(b.len(), a.len() + 2);
        }
    }

    #[test]
    fn tenants_use_both_carriers() {
        let trace = generate(&spec(WorkloadKind::Tenants)).unwrap();
        assert!(trace.iter().any(|r| r.header_tenant().is_some()));
        let body_side = trace
            .iter()
            .find(|r| r.tenant_via == Some(TenantVia::Body))
            .unwrap();
        assert!(body_side.body(false)["prompt_cache_key"].is_string());
        assert!(trace.iter().all(|r| r.tenant.is_some()));
    }

    #[test]
    fn bad_specs_are_refused() {
        let bad = WorkloadSpec {
            rate: 0.0,
            ..spec(WorkloadKind::Long)
        };
        assert!(generate(&bad).is_err());
        let bad = WorkloadSpec {
            docs: 0,
            ..spec(WorkloadKind::Long)
        };
        assert!(generate(&bad).is_err());
    }
}
