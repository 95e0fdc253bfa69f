//! Asking an engine rank's replay endpoint (a ZMQ ROUTER) for the batches it
//! still buffers, bounded in time, batches and bytes: the batches are held
//! until the end marker, so an endpoint that streams without end, or streams
//! huge payloads, fails the replay instead of growing the agent.

use bytes::Bytes;
use std::time::Duration;
use thiserror::Error;
use warmpath_vllm_events::wire::{parse_replay_reply, END_OF_REPLAY};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// What one replay may take.
#[derive(Clone, Copy, Debug)]
pub struct ReplayLimits {
    /// The whole replay, end marker included.
    pub deadline: Duration,
    pub max_batches: usize,
    /// Payload bytes, summed.
    pub max_bytes: usize,
}

/// Why a replay failed; the follower then counts an unrecovered gap (or
/// learns from live events), it never stops following.
#[derive(Debug, Error)]
pub enum ReplayError {
    #[error("replay socket: {0}")]
    Socket(#[from] zeromq::ZmqError),
    #[error("malformed replay reply ({0} frames)")]
    Malformed(usize),
    #[error("replay longer than {0} batches")]
    TooManyBatches(usize),
    #[error("replay larger than {0} bytes")]
    TooManyBytes(usize),
    #[error("no complete replay within {0:?}")]
    Timeout(Duration),
    #[error("replay task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Asks `endpoint` for every buffered batch with seq >= `from`; returns them
/// in order, stopping at the end marker.
pub async fn replay(
    endpoint: &str,
    from: u64,
    limits: ReplayLimits,
) -> Result<Vec<(u64, Bytes)>, ReplayError> {
    let endpoint = endpoint.to_owned();
    let task = tokio::spawn(async move {
        let mut dealer = DealerSocket::new();
        dealer.connect(&endpoint).await?;
        let mut req = ZmqMessage::from(Bytes::new());
        req.push_back(Bytes::copy_from_slice(&from.to_be_bytes()));
        dealer.send(req).await?;
        let mut out = Vec::new();
        let mut bytes = 0usize;
        loop {
            let m = dealer.recv().await?.into_vec();
            let Some((seq, payload)) = parse_replay_reply(&m) else {
                return Err(ReplayError::Malformed(m.len()));
            };
            if seq == END_OF_REPLAY {
                return Ok(out);
            }
            if out.len() >= limits.max_batches {
                return Err(ReplayError::TooManyBatches(limits.max_batches));
            }
            bytes = bytes.saturating_add(payload.len());
            if bytes > limits.max_bytes {
                return Err(ReplayError::TooManyBytes(limits.max_bytes));
            }
            out.push((seq, payload));
        }
    });
    let abort = task.abort_handle();
    match tokio::time::timeout(limits.deadline, task).await {
        Ok(Ok(r)) => r,
        Ok(Err(join)) => Err(join.into()),
        Err(_) => {
            abort.abort();
            Err(ReplayError::Timeout(limits.deadline))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use warmpath_vllm_events::{
        BlockStored, EngineBlockHash, KvEvent, KvEventPublisher, PublisherConfig,
    };

    fn stored(h: u64, tokens: usize) -> KvEvent {
        KvEvent::BlockStored(BlockStored {
            block_hashes: vec![EngineBlockHash::Int(h)],
            token_ids: vec![7; tokens],
            block_size: tokens as u32,
            ..Default::default()
        })
    }

    #[tokio::test]
    async fn a_replay_is_bounded_in_batches_and_bytes() {
        let mut c = PublisherConfig::new("tcp://127.0.0.1:0");
        c.replay_endpoint = Some("tcp://127.0.0.1:0".into());
        let p = KvEventPublisher::bind(c).await.unwrap();
        for h in 0..4 {
            p.publish(vec![stored(h, 1000)]).await.unwrap();
        }
        let ep = p.replay_endpoint().unwrap().to_owned();
        let limits = ReplayLimits {
            deadline: Duration::from_secs(5),
            max_batches: 100,
            max_bytes: 1 << 20,
        };
        let all = replay(&ep, 0, limits).await.unwrap();
        assert_eq!(
            all.iter().map(|b| b.0).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        let one = all[0].1.len();
        let r = replay(
            &ep,
            0,
            ReplayLimits {
                max_bytes: 2 * one + one / 2,
                ..limits
            },
        )
        .await;
        assert!(matches!(r, Err(ReplayError::TooManyBytes(_))), "{r:?}");
        let r = replay(
            &ep,
            1,
            ReplayLimits {
                max_batches: 2,
                ..limits
            },
        )
        .await;
        assert!(matches!(r, Err(ReplayError::TooManyBatches(2))), "{r:?}");
    }
}
