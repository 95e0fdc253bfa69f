//! The load driver: replays a trace against an OpenAI endpoint (streaming, so
//! TTFT is the first content chunk), open loop except conversations, replayed
//! closed loop like a chat client ([`crate::workload::CONVERSATION_PREFIX`]);
//! with several router replicas each request goes to a seeded-random one.

use crate::workload::{ChatMessage, TraceRequest};
use futures::StreamExt;
use indicatif::ProgressBar;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The answers of a conversation's turns so far, in turn order (`None`:
/// the turn failed, the trace's own text stays).
type Answers = Vec<Option<String>>;

/// What happened to one request.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    /// Scheduled arrival, seconds from the start.
    pub arrival_s: f64,
    /// Time to the first content chunk, ms (None on failure).
    pub ttft_ms: Option<f64>,
    /// Time to the end of the stream, ms.
    pub e2e_ms: Option<f64>,
    /// Completion time, seconds from the start.
    pub done_s: f64,
    /// Prompt tokens (engine usage).
    pub prompt_tokens: u64,
    /// Cached prompt tokens (engine usage).
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// `x-warmpath-backend`.
    pub backend: Option<String>,
    /// `x-warmpath-decision`.
    pub decision: Option<String>,
    /// Which of [`DriveConfig::urls`] it was sent to.
    pub replica: usize,
    /// Blocks the router's index said the chosen backend holds (sampled).
    pub predicted_blocks: Option<u64>,
    pub error: Option<String>,
}

#[derive(Clone, Debug)]
pub struct DriveConfig {
    /// The base URLs of the router replicas (or one router, or an engine);
    /// each request goes to one at random.
    pub urls: Vec<String>,
    pub spread_seed: u64,
    /// Ask `POST /cache-index/query` before every n-th request (0: never).
    pub fidelity_every: usize,
    pub timeout: Duration,
    /// Bearer token of `/cache-index/query` (the router's admin token).
    pub inspect_token: Option<String>,
}

/// Replays `trace`; returns the samples in trace order, keeping what
/// finished when `cancel` fires.
pub async fn drive(
    client: &reqwest::Client,
    cfg: &DriveConfig,
    trace: &[TraceRequest],
    progress: &ProgressBar,
    cancel: &CancellationToken,
) -> Vec<Sample> {
    let start = Instant::now();
    let mut set = JoinSet::new();
    let cfg = Arc::new(cfg.clone());
    // Per conversation: where its next turn gets the answers so far.
    let mut chains: HashMap<String, oneshot::Receiver<Answers>> = HashMap::new();
    let mut spread = SmallRng::seed_from_u64(cfg.spread_seed);
    for (i, r) in trace.iter().enumerate() {
        let replica = match cfg.urls.len() {
            0 | 1 => 0,
            n => spread.random_range(0..n),
        };
        let at = start + Duration::from_secs_f64(r.arrival);
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep_until(at.into()) => {}
        }
        let turn = r.conversation().map(|c| {
            let (tx, rx) = oneshot::channel();
            (chains.insert(c.to_owned(), rx), tx)
        });
        let (client, cfg, r) = (client.clone(), cfg.clone(), r.clone());
        let query = cfg.fidelity_every > 0 && i % cfg.fidelity_every == 0;
        let pb = progress.clone();
        set.spawn(async move {
            let s = match turn {
                None => one(&client, &cfg, replica, &r, query, start).await.0,
                Some((previous, next)) => {
                    let to = (replica, query);
                    next_turn(&client, &cfg, r.clone(), to, start, previous, next).await
                }
            };
            let s = Sample {
                arrival_s: r.arrival,
                replica,
                ..s
            };
            pb.inc(1);
            (i, s)
        });
    }
    let mut out = vec![Sample::default(); trace.len()];
    loop {
        tokio::select! {
            _ = cancel.cancelled() => {
                // Aborting keeps the answers of the tasks already done.
                set.abort_all();
                while let Some(next) = set.join_next().await {
                    if let Ok((i, s)) = next {
                        out[i] = s;
                    }
                }
                break;
            }
            next = set.join_next() => match next {
                None => break,
                Some(Ok((i, s))) => out[i] = s,
                Some(Err(e)) => tracing::warn!(error = %e, "a driver task failed"),
            }
        }
    }
    out
}

fn request(
    client: &reqwest::Client,
    url: &str,
    r: &TraceRequest,
    body: &serde_json::Value,
) -> reqwest::RequestBuilder {
    let mut b = client.post(url).json(body);
    if let Some(t) = r.header_tenant() {
        b = b.header("x-prefix-aware-id", t);
    }
    b
}

/// A conversation's turn: waits for the previous turn's answers (none if
/// it was cancelled), puts them in place of the trace's, sends, and hands
/// them on, its own added.
async fn next_turn(
    client: &reqwest::Client,
    cfg: &DriveConfig,
    mut r: TraceRequest,
    (replica, query): (usize, bool),
    origin: Instant,
    previous: Option<oneshot::Receiver<Answers>>,
    next: oneshot::Sender<Answers>,
) -> Sample {
    let waited = Instant::now();
    let mut answers = match previous {
        Some(rx) => rx.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let waited_ms = waited.elapsed().as_secs_f64() * 1e3;
    if let Some(m) = r.messages.as_mut() {
        substitute_answers(m, &answers);
    }
    let (s, answer) = one(client, cfg, replica, &r, query, origin).await;
    let conversation = r.conversation().unwrap_or_default();
    let (turn, cached) = (answers.len(), s.cached_tokens);
    tracing::debug!(
        conversation,
        turn,
        waited_ms,
        cached,
        failed = s.error.is_some(),
        "turn"
    );
    answers.push(answer.filter(|_| s.error.is_none()));
    // The next turn may not exist, or may have been cancelled.
    let _ = next.send(answers);
    s
}

/// Replaces the content of the `k`-th `assistant` message by `answers[k]`
/// where that turn was answered.
pub fn substitute_answers(messages: &mut [ChatMessage], answers: &[Option<String>]) {
    let assistant = messages.iter_mut().filter(|m| m.role == "assistant");
    for (m, a) in assistant.zip(answers) {
        if let Some(a) = a {
            m.content.clone_from(a);
        }
    }
}

/// Sends one request to `cfg.urls[replica]` and reads its stream: the
/// sample and the answer's text.
async fn one(
    client: &reqwest::Client,
    cfg: &DriveConfig,
    replica: usize,
    r: &TraceRequest,
    query: bool,
    origin: Instant,
) -> (Sample, Option<String>) {
    let mut s = Sample::default();
    let mut text = String::new();
    let body = r.body(true);
    let mut predicted = None;
    let base = cfg.urls.get(replica).map_or("", String::as_str);
    if query {
        let mut q = request(client, &format!("{base}/cache-index/query"), r, &body);
        if let Some(t) = &cfg.inspect_token {
            q = q.bearer_auth(t);
        }
        if let Ok(resp) = q.send().await {
            predicted = resp.json::<serde_json::Value>().await.ok();
        }
    }
    let t0 = Instant::now();
    let url = format!("{base}{}", r.path());
    let fut = async {
        let resp = request(client, &url, r, &body)
            .send()
            .await
            .map_err(|e| format!("send: {e}"))?;
        let header = |n: &str| {
            resp.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        s.backend = header("x-warmpath-backend");
        s.decision = header("x-warmpath-decision");
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            return Err(format!(
                "HTTP {status}: {}",
                text.chars().take(200).collect::<String>()
            ));
        }
        let mut stream = resp.bytes_stream();
        let mut buf = String::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| format!("stream: {e}"))?;
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                for line in event.lines() {
                    let Some(data) = line.strip_prefix("data:") else {
                        continue;
                    };
                    let data = data.trim();
                    if data == "[DONE]" {
                        continue;
                    }
                    let v: serde_json::Value =
                        serde_json::from_str(data).map_err(|e| format!("bad chunk: {e}"))?;
                    if let Some(err) = v.get("error") {
                        return Err(format!("stream error: {err}"));
                    }
                    let piece = ["/choices/0/delta/content", "/choices/0/text"]
                        .iter()
                        .find_map(|p| v.pointer(p)?.as_str())
                        .unwrap_or("");
                    // vLLM opens a chat stream with an empty `content` delta
                    // before any compute: only a non-empty text is the first token.
                    if !piece.is_empty() && s.ttft_ms.is_none() {
                        s.ttft_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
                    }
                    text.push_str(piece);
                    if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                        let n = |p: &str| u.pointer(p).and_then(|x| x.as_u64()).unwrap_or(0);
                        s.prompt_tokens = n("/prompt_tokens");
                        s.completion_tokens = n("/completion_tokens");
                        s.cached_tokens = n("/prompt_tokens_details/cached_tokens");
                    }
                }
            }
        }
        Ok(())
    };
    s.error = match tokio::time::timeout(cfg.timeout, fut).await {
        Ok(Ok(())) if s.ttft_ms.is_some() => None,
        Ok(Ok(())) => Some("the stream ended without output".into()),
        Ok(Err(e)) => Some(e),
        Err(_) => Some(format!("timed out after {:?}", cfg.timeout)),
    };
    match s.error {
        Some(_) => s.ttft_ms = None,
        None => s.e2e_ms = Some(t0.elapsed().as_secs_f64() * 1e3),
    }
    s.done_s = origin.elapsed().as_secs_f64();
    if let (Some(v), Some(b)) = (predicted, &s.backend) {
        s.predicted_blocks = v["workers"]
            .as_array()
            .and_then(|ws| ws.iter().find(|w| w["worker_id"] == b.as_str()))
            .and_then(|w| w["matched_blocks"].as_u64());
    }
    let answer = s.e2e_ms.is_some().then_some(text);
    (s, answer)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::sim::{tiny_tokenizer, Fleet, SimConfig};
    use crate::timing::TimeModel;
    use crate::workload::CONVERSATION_PREFIX;

    fn turn(arrival: f64, group: &str, messages: &[(&str, &str)], max_tokens: u32) -> TraceRequest {
        TraceRequest {
            arrival,
            model: "warmpath-tiny".into(),
            messages: Some(
                messages
                    .iter()
                    .map(|(r, c)| ChatMessage::new(r, *c))
                    .collect(),
            ),
            prompt: None,
            max_tokens,
            tenant: None,
            tenant_via: None,
            group: Some(group.into()),
        }
    }

    #[test]
    fn answers_replace_the_assistant_messages_in_order() {
        let mut m = vec![
            ChatMessage::new("system", "s"),
            ChatMessage::new("user", "u1"),
            ChatMessage::new("assistant", "made up 1"),
            ChatMessage::new("user", "u2"),
            ChatMessage::new("assistant", "made up 2"),
            ChatMessage::new("user", "u3"),
        ];
        substitute_answers(&mut m, &[Some("real 1".into()), None]);
        assert_eq!(m[2].content, "real 1");
        assert_eq!(m[4].content, "made up 2");
        assert_eq!(m[5].content, "u3");
    }

    /// Ctrl-C mid-run: the answered request's sample is kept, the one not
    /// yet due stays empty, on whichever replica it was drawn for.
    #[tokio::test]
    async fn a_cancelled_run_keeps_what_was_answered() {
        let token = CancellationToken::new();
        let cfg = SimConfig {
            time: TimeModel::default().scaled(20.0),
            ..Default::default()
        };
        let fleet = Fleet::start(1, &cfg, tiny_tokenizer().unwrap(), token.clone());
        let inst = fleet.await.unwrap().instances.remove(0);
        let msgs = [("user", "Tell me about the sea.")];
        let trace = vec![
            turn(0.0, "a", &msgs, 4),
            turn(0.0, "b", &msgs, 4),
            turn(60.0, "c", &msgs, 4),
        ];
        let dc = DriveConfig {
            urls: vec![inst.url.clone(), inst.url.clone()],
            spread_seed: 3,
            fidelity_every: 0,
            timeout: Duration::from_secs(30),
            inspect_token: None,
        };
        let pb = ProgressBar::hidden();
        let stop = CancellationToken::new();
        let (p, c) = (pb.clone(), stop.clone());
        tokio::spawn(async move {
            while p.position() < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            c.cancel();
        });
        let client = reqwest::Client::new();
        let s = drive(&client, &dc, &trace, &pb, &stop).await;
        assert!(s[0].e2e_ms.is_some() && s[1].e2e_ms.is_some(), "{s:?}");
        assert!(s[2].e2e_ms.is_none() && s[2].error.is_none(), "{s:?}");
        // Seeded: the same draw every time.
        let again = drive(&client, &dc, &trace[..2], &pb, &token).await;
        assert_eq!(
            (s[0].replica, s[1].replica),
            (again[0].replica, again[1].replica)
        );
        token.cancel();
    }

    /// Two turns of one conversation, both due at once: the second waits for
    /// the first's answer, carries it, and hits every block the first one's
    /// prompt and answer filled (the answer's last token is never computed).
    #[tokio::test]
    async fn conversation_turns_are_closed_loop_and_hit_the_answer() {
        let token = CancellationToken::new();
        let cfg = SimConfig {
            time: TimeModel::default().scaled(20.0),
            cache_blocks: 1024,
            ..Default::default()
        };
        let fleet = Fleet::start(1, &cfg, tiny_tokenizer().unwrap(), token.clone());
        let inst = fleet.await.unwrap().instances.remove(0);
        let conv = format!("{CONVERSATION_PREFIX}7");
        let first = [
            ("system", "You are a helpful assistant."),
            ("user", "Tell me about the sea."),
        ];
        let second = [
            first[0],
            first[1],
            ("assistant", "A placeholder the engine never said."),
            ("user", "And then?"),
        ];
        let trace = vec![turn(0.0, &conv, &first, 40), turn(0.0, &conv, &second, 5)];
        let dc = DriveConfig {
            urls: vec![inst.url.clone()],
            spread_seed: 0,
            fidelity_every: 0,
            timeout: Duration::from_secs(30),
            inspect_token: None,
        };
        let client = reqwest::Client::new();
        let pb = ProgressBar::hidden();
        let s = drive(&client, &dc, &trace, &pb, &token).await;
        assert!(s.iter().all(|s| s.error.is_none()), "{s:?}");
        let (a, b) = (&s[0], &s[1]);
        assert_eq!(a.completion_tokens, 40);
        // Sent only after the first turn was complete.
        let b_sent = b.done_s - b.e2e_ms.unwrap() / 1e3;
        assert!(b_sent >= a.done_s, "{a:?} {b:?}");
        let bs = 16;
        assert_eq!(
            b.cached_tokens,
            (a.prompt_tokens + a.completion_tokens - 1) / bs * bs,
            "{a:?} {b:?}"
        );
        // The same turns open loop (no conversation group) carry the made-up
        // text: nothing of the answer can hit, only the first prompt's blocks.
        let open: Vec<TraceRequest> = trace
            .iter()
            .map(|r| TraceRequest {
                group: Some("other".into()),
                arrival: 0.5,
                ..r.clone()
            })
            .collect();
        let s = drive(&client, &dc, &open, &pb, &token).await;
        assert!(s[1].cached_tokens <= a.prompt_tokens / bs * bs, "{s:?}");
        token.cancel();
    }
}
