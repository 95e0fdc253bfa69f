//! Runs one agent stream after its Hello: feeds its messages to the worker's
//! [`WorkerStream`], pacing replacements and running long work off the async threads.

use super::agents::Agents;
use super::directory::PoolDirectory;
use super::guard::shown;
use super::pace::{self, Gates, Work};
use super::stream::{Refusal, WorkerStream};
use crate::http::clock::monotonic_ms;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};
use warmpath_edge::LogEvery;
use warmpath_proto::v1::{self, agent_message::Msg, AgentMessage, RouterMessage};

/// How often a stream checks that it still owns its worker (closing one taken over).
const OWNER_CHECK: Duration = Duration::from_secs(1);

/// What every stream of one service shares.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) dir: Arc<dyn PoolDirectory>,
    pub(super) agents: Arc<Agents>,
    pub(super) gates: Arc<Gates>,
    /// Refusals a peer can cause at will: one line every 10 s.
    pub(super) refusals: Arc<LogEvery>,
    pub(super) shutdown: CancellationToken,
}

/// Logs a refusal of a stream that was never opened, at most every 10 s.
fn log_refusal(refusals: &LogEvery, r: &Refusal) {
    if let Some(suppressed) = refusals.ready() {
        tracing::error!(reason = %r.reason, suppressed, "agent refused (refusals are logged at most every 10 s)");
    }
}

/// Runs one stream after its Hello until it ends.
pub(super) async fn drive(
    sh: Shared,
    hello: v1::Hello,
    mut inbound: Streaming<AgentMessage>,
    tx: mpsc::Sender<Result<RouterMessage, Status>>,
) {
    let Some(pool) = sh.dir.pool(&hello.model) else {
        let r = Refusal::fatal(format!("no pool serves model {}", shown(&hello.model)));
        log_refusal(&sh.refusals, &r);
        metrics::counter!("warmpath_ingest_refused_total", "reason" => "model").increment(1);
        let _ = tx.send(Ok(r.answer())).await;
        return;
    };
    let mut ws = match WorkerStream::open(pool, Arc::clone(&sh.agents), &hello, monotonic_ms()) {
        Ok(ws) => ws,
        Err(r) => {
            log_refusal(&sh.refusals, &r);
            let _ = tx.send(Ok(r.answer())).await;
            return;
        }
    };
    tracing::info!(block_size = hello.block_size, "agent connected");
    let peers = Arc::clone(&sh.agents.peers);
    let stream_id = ws.stream_id;
    peers.attach(&hello.model, &hello.worker_id, stream_id, tx.clone());
    let gate = sh.gates.of(&hello.model);
    let throttled_log = LogEvery::default();
    let mut owner_check = tokio::time::interval(OWNER_CHECK);
    owner_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    'stream: loop {
        let next = tokio::select! {
            m = inbound.next() => m,
            () = sh.shutdown.cancelled() => break,
            () = tx.closed() => break,
            _ = owner_check.tick() => {
                if ws.owns() {
                    continue;
                }
                // Answered as its next message would be: refused, and closed.
                Some(Ok(AgentMessage { msg: None }))
            }
        };
        let msg = match next {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                tracing::info!(error = %e, "agent stream broke");
                break;
            }
            None => break,
        };
        // Another replica's decision for this worker, for the pool's policy.
        let decision = match &msg.msg {
            Some(Msg::Decision(b)) => Some(b.clone()),
            _ => None,
        };
        if let Some(b) = decision.filter(|_| ws.owns()) {
            if let Some(d) = peers.receive(&hello.model, &hello.worker_id, stream_id, &b) {
                sh.dir.observe_remote(&hello.model, &hello.worker_id, &d);
            }
        }
        let work = pace::work(&msg);
        if let Work::Replace(kind) = work {
            // Past its burst, a replacement waits its turn (later messages too).
            if let Some(wait) = pace::wait_for(ws.live.replaced_at(), monotonic_ms()) {
                metrics::counter!("warmpath_ingest_throttled_total", "kind" => kind).increment(1);
                if let Some(suppressed) = throttled_log.ready() {
                    tracing::warn!(
                        kind,
                        wait_ms = wait.as_millis() as u64,
                        suppressed,
                        "agent replaces its worker's blocks more than once a second; each waits its turn (logged at most every 10 s)"
                    );
                }
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = sh.shutdown.cancelled() => break,
                    () = tx.closed() => break,
                }
            }
            ws.live
                .replaced(pace::next_tat(ws.live.replaced_at(), monotonic_ms()));
        }
        let (now_ms, now_unix) = (monotonic_ms(), warmpath_proto::unix_micros());
        let answer = match work {
            Work::Light => ws.on_message(msg, now_ms, now_unix),
            Work::Big | Work::Replace(_) => {
                // A replacement may compact the whole index: one job per pool.
                let held = match work {
                    Work::Replace(_) => Some(Arc::clone(&gate).lock_owned().await),
                    _ => None,
                };
                let job = tokio::task::spawn_blocking(move || {
                    let _held = held;
                    let r = ws.on_message(msg, now_ms, now_unix);
                    super::sweeper::catch_up();
                    (ws, r)
                });
                match job.await {
                    Ok((back, r)) => {
                        ws = back;
                        r
                    }
                    Err(e) => {
                        // `ws` was dropped with the job (worker disconnected).
                        tracing::error!(error = %e, "applying an agent message failed; stream closed");
                        peers.detach(&hello.model, &hello.worker_id, stream_id);
                        return;
                    }
                }
            }
        };
        match answer {
            Ok(answers) => {
                for a in answers {
                    if tx.send(Ok(a)).await.is_err() {
                        break 'stream;
                    }
                }
            }
            Err(r) => {
                if r.retryable {
                    tracing::warn!(reason = %r.reason, "agent stream closed");
                } else {
                    tracing::error!(reason = %r.reason, "agent refused");
                }
                let _ = tx.send(Ok(r.answer())).await;
                break;
            }
        }
    }
    peers.detach(&hello.model, &hello.worker_id, stream_id);
    ws.close();
    tracing::info!("agent disconnected");
}
