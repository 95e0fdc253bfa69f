//! The chunk memo: token ids of ~1 KiB chunks of long pieces, each cut at the
//! first *safe point* (an ASCII space before an ASCII letter); why a piece's ids
//! are its chunks' ids concatenated: docs/tokenization.md.

use crate::weighted_lru::WeightedLru;
use std::sync::Arc;

#[derive(Debug)]
pub(crate) struct ChunkMemo {
    /// Pieces shorter than this are encoded directly; longer ones are cut
    /// into chunks of at least this many bytes.
    pub(crate) chunk_bytes: usize,
    pub(crate) lru: WeightedLru,
}

impl ChunkMemo {
    /// A memo holding at most `capacity_tokens` ids.
    pub(crate) fn new(chunk_bytes: usize, capacity_tokens: usize) -> Self {
        ChunkMemo {
            chunk_bytes: chunk_bytes.max(1),
            lru: WeightedLru::new(capacity_tokens),
        }
    }

    /// Appends the ids of `piece` to `ids`: short pieces straight from
    /// `encode`, long ones chunk by chunk through the memo (`chunked`: cut at
    /// safe points; otherwise the whole piece is one chunk). After each chunk
    /// `enough` may stop the piece early (a capped encode), with its error.
    pub(crate) fn encode<E>(
        &self,
        piece: &str,
        chunked: bool,
        ids: &mut Vec<u32>,
        mut encode: impl FnMut(&str, &mut Vec<u32>) -> Result<(), E>,
        enough: impl Fn(&[u32]) -> Result<(), E>,
    ) -> Result<(), E> {
        if piece.len() < self.chunk_bytes || self.lru.capacity() == 0 {
            return encode(piece, ids);
        }
        let mut rest = piece;
        while !rest.is_empty() {
            let end = if chunked {
                safe_point(rest.as_bytes(), self.chunk_bytes).unwrap_or(rest.len())
            } else {
                rest.len()
            };
            let (chunk, tail) = rest.split_at(end);
            let got = self.lru.get_or_make(chunk.as_bytes(), || {
                let mut own = Vec::with_capacity(chunk.len() / 3 + 1);
                encode(chunk, &mut own).map(|()| Arc::from(own))
            })?;
            ids.extend_from_slice(&got);
            enough(ids)?;
            rest = tail;
        }
        Ok(())
    }
}

/// The first safe point at or after `from` (a byte offset where `b` has an
/// ASCII space followed by an ASCII letter), if any; never 0.
pub(crate) fn safe_point(b: &[u8], from: usize) -> Option<usize> {
    let from = from.max(1);
    let tail = b.get(from..)?;
    memchr::memchr_iter(b' ', tail)
        .map(|k| from + k)
        .find(|&p| b.get(p + 1).is_some_and(u8::is_ascii_alphabetic))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunks of `text`, through a fresh memo of 8-byte chunks.
    fn chunks(text: &str) -> Vec<String> {
        let memo = ChunkMemo::new(8, 1 << 10);
        let mut seen = Vec::new();
        memo.encode(
            text,
            true,
            &mut Vec::new(),
            |c, _| {
                seen.push(c.to_owned());
                Ok::<(), ()>(())
            },
            |_| Ok(()),
        )
        .ok();
        seen
    }

    #[test]
    fn safe_points_are_a_space_before_a_letter() {
        assert_eq!(safe_point(b"ab cd", 0), Some(2));
        assert_eq!(safe_point(b" ab", 0), None, "never at the start");
        assert_eq!(safe_point(b"a  b", 0), Some(2), "the last space of a run");
        assert_eq!(safe_point(b"a 1 \xc3\xa9 b", 0), Some(6));
        assert_eq!(safe_point(b"ab c", 3), None);
        assert_eq!(safe_point(b"ab c", 9), None);
    }

    #[test]
    fn cut_points_do_not_depend_on_what_follows() {
        let doc = "alpha beta gamma delta epsilon zeta eta theta";
        let a = chunks(&format!("{doc} iota?"));
        let b = chunks(&format!("{doc}\n\nkappa lambda"));
        assert_eq!(a.concat(), format!("{doc} iota?"));
        // Every chunk that ends inside the document is the same in both.
        let mut end = 0;
        let inside = a.iter().take_while(|c| {
            end += c.len();
            end < doc.len()
        });
        let n = inside.count();
        assert!(n >= 3, "{a:?}");
        assert_eq!(a[..n], b[..n], "{a:?} {b:?}");
        assert_eq!(chunks("short"), ["short"]);
    }
}
