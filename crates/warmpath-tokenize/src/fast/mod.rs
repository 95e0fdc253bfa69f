//! The fast path of encoding: the `tokenizers` library's pipeline redone step by
//! step (docs/tokenization.md). The one switch is [`FastPath::new`]: `Some` only
//! when every step gives the library's ids for this tokenizer.

mod chunks;
mod presplit;
mod split;
mod word_cache;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

pub(crate) use presplit::byte_alphabet;

use super::error::TokenizeError;
use crate::weighted_lru::CacheStats;
use chunks::ChunkMemo;
use presplit::FastPieces;
use split::{AddedCut, Piece};
use tokenizers::{Encoding, Token, Tokenizer};

/// Sizing of the chunk memo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Pieces (text between added tokens) shorter than this many bytes are
    /// encoded directly; longer ones are cut into chunks of at least this
    /// many bytes, each remembered.
    pub min_segment_bytes: usize,
    /// Most token ids held in total; 0 turns the memo off.
    pub capacity_tokens: usize,
}

impl Default for CacheConfig {
    /// Chunks of 1 KiB (about 250 tokens), so a repeated document's re-encoded
    /// tail stays short; 4 Mi ids (16 MiB), e.g. 500 distinct 8k-token documents.
    fn default() -> Self {
        CacheConfig {
            min_segment_bytes: 1024,
            capacity_tokens: 4 << 20,
        }
    }
}

/// The ids the post-processor adds around one sequence with special tokens on.
#[derive(Debug)]
struct SpecialWrap {
    before: Vec<u32>,
    after: Vec<u32>,
}

impl SpecialWrap {
    /// Finds the wrap by post-processing a one-id sequence. `None` when the
    /// post-processor changes a sequence without special tokens, or does more
    /// than put ids around it.
    fn probe(tokenizer: &Tokenizer) -> Option<Self> {
        const SENTINEL: u32 = u32::MAX;
        let probe = |add_special_tokens| {
            let one = Encoding::from_tokens(vec![Token::new(SENTINEL, String::new(), (0, 0))], 0);
            let out = tokenizer.post_process(one, None, add_special_tokens).ok()?;
            Some(out.get_ids().to_vec())
        };
        if probe(false)? != [SENTINEL] {
            return None;
        }
        let ids = probe(true)?;
        let at = ids.iter().position(|&i| i == SENTINEL)?;
        if ids[at + 1..].contains(&SENTINEL) {
            return None;
        }
        Some(SpecialWrap {
            before: ids[..at].to_vec(),
            after: ids[at + 1..].to_vec(),
        })
    }
}

/// The fast path of one tokenizer (see module docs).
#[derive(Debug)]
pub(crate) struct FastPath {
    wrap: SpecialWrap,
    cut: AddedCut,
    /// The pre-split, when it reproduces the tokenizer's pre-tokenizer.
    pieces: Option<FastPieces>,
    memo: ChunkMemo,
}

impl FastPath {
    /// The switch: `Some` when the fast path is exact for `tokenizer`.
    pub(crate) fn new(tokenizer: &Tokenizer, config: CacheConfig) -> Option<Self> {
        if tokenizer.get_truncation().is_some() || tokenizer.get_padding().is_some() {
            return None;
        }
        Some(FastPath {
            cut: AddedCut::new(tokenizer)?,
            wrap: SpecialWrap::probe(tokenizer)?,
            pieces: FastPieces::new(tokenizer),
            memo: ChunkMemo::new(config.min_segment_bytes, config.capacity_tokens),
        })
    }

    /// Whether long pieces are cut into chunks at safe points (see `chunks`).
    pub(crate) fn chunks_pieces(&self) -> bool {
        self.pieces.as_ref().is_some_and(FastPieces::deterministic)
    }

    /// The ids of `text`, equal to the library's `encode_fast(text, add_special_tokens)`.
    /// With a `cap`, a text found to have more ids than that is refused
    /// ([`TokenizeError::PromptTooLong`]) soon after the cap is passed: after
    /// the piece or ~1 KiB chunk that passed it, so a giant text costs about
    /// `cap` tokens of work, not its length (an unchunked piece is encoded whole).
    pub(crate) fn encode(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        add_special_tokens: bool,
        cap: Option<usize>,
    ) -> Result<Vec<u32>, TokenizeError> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 4);
        if add_special_tokens {
            ids.extend_from_slice(&self.wrap.before);
        }
        let chunked = self.chunks_pieces();
        // BPE dropout gives other ids on every call: nothing to remember.
        let memo = self.pieces.as_ref().is_none_or(FastPieces::deterministic);
        let encode_piece = |piece: &str, ids: &mut Vec<u32>| match &self.pieces {
            Some(fast) => fast.encode(tokenizer, piece, ids),
            None => {
                let enc = tokenizer
                    .encode_fast(piece, false)
                    .map_err(TokenizeError::Encode)?;
                ids.extend_from_slice(enc.get_ids());
                Ok(())
            }
        };
        let enough = |ids: &[u32]| match cap {
            Some(cap) if ids.len() > cap => Err(TokenizeError::PromptTooLong {
                cap,
                seen: ids.len(),
                complete: false,
            }),
            _ => Ok(()),
        };
        self.cut.split(text, |piece| {
            match piece {
                Piece::Added(id) => ids.push(id),
                Piece::Text(t) if memo => {
                    self.memo
                        .encode(t, chunked, &mut ids, encode_piece, enough)?
                }
                Piece::Text(t) => encode_piece(t, &mut ids)?,
            }
            enough(&ids)
        })?;
        // Without truncation or padding, post-processing only puts the probed
        // ids around the sequence.
        if add_special_tokens {
            ids.extend_from_slice(&self.wrap.after);
        }
        Ok(ids)
    }

    /// The chunk memo's counters.
    pub(crate) fn chunk_stats(&self) -> CacheStats {
        self.memo.lru.stats()
    }

    /// The word cache's counters, when there is one.
    pub(crate) fn word_stats(&self) -> Option<CacheStats> {
        self.pieces.as_ref()?.word_stats()
    }
}
