//! The compact set of workers holding one block: each holder is one `u32`, worker
//! slot (16 bits) | generation (8 bits) | tier bits (8 bits); one or two inline,
//! more in a boxed vector, so a map slot stays 24 bytes.

use super::tier::Tier;

/// A worker's dense index inside one [`super::table::CacheIndex`].
pub type WorkerSlot = u16;

/// One (worker, generation, tiers) holder packed in a `u32`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Holder(u32);

impl Holder {
    pub(crate) fn new(slot: WorkerSlot, gen: u8, tiers: u8) -> Self {
        Holder((slot as u32) << 16 | (gen as u32) << 8 | tiers as u32)
    }
    pub(crate) fn slot(self) -> WorkerSlot {
        (self.0 >> 16) as WorkerSlot
    }
    pub(crate) fn gen(self) -> u8 {
        (self.0 >> 8) as u8
    }
    pub(crate) fn tiers(self) -> u8 {
        self.0 as u8
    }
    fn with_tiers(self, tiers: u8) -> Self {
        Holder(self.0 & !0xff | tiers as u32)
    }
}

/// The holders of one block.
#[derive(Clone, Debug, Default)]
pub(crate) enum Holders {
    #[default]
    Empty,
    One(Holder),
    Two(Holder, Holder),
    // A thin box keeps the enum at 16 bytes (a boxed slice would make it 24).
    #[allow(clippy::box_collection)]
    Many(Box<Vec<Holder>>),
}

impl Holders {
    pub(crate) fn iter(&self) -> impl Iterator<Item = Holder> + '_ {
        let (a, b, rest): (Option<Holder>, Option<Holder>, &[Holder]) = match self {
            Holders::Empty => (None, None, &[]),
            Holders::One(x) => (Some(*x), None, &[]),
            Holders::Two(x, y) => (Some(*x), Some(*y), &[]),
            Holders::Many(v) => (None, None, v.as_slice()),
        };
        a.into_iter().chain(b).chain(rest.iter().copied())
    }

    pub(crate) fn find(&self, slot: WorkerSlot) -> Option<Holder> {
        // By variant, not through `iter`'s chained iterators: the index walk
        // calls this per block and worker.
        let is = |h: &Holder| h.slot() == slot;
        match self {
            Holders::Empty => None,
            Holders::One(a) => Some(*a).filter(is),
            Holders::Two(a, b) => Some(*a).filter(is).or(Some(*b).filter(is)),
            Holders::Many(v) => v.iter().copied().find(is),
        }
    }

    /// The holders when they spilled to the heap (more than two).
    pub(crate) fn spilled(&self) -> Option<&[Holder]> {
        match self {
            Holders::Many(v) => Some(v.as_slice()),
            _ => None,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        matches!(self, Holders::Empty)
    }

    fn from_vec(mut v: Vec<Holder>) -> Self {
        match v.len() {
            0 => Holders::Empty,
            1 => Holders::One(v[0]),
            2 => Holders::Two(v[0], v[1]),
            _ => {
                v.shrink_to_fit();
                Holders::Many(Box::new(v))
            }
        }
    }

    /// Adds `tier` for `slot` at generation `gen`. Entries of `slot` from an
    /// older generation are replaced. Returns the tier bits that were newly set
    /// for the current generation (0 when nothing changed).
    pub(crate) fn add(&mut self, slot: WorkerSlot, gen: u8, tier: Tier) -> u8 {
        let bit = tier.bit();
        if let Holders::Many(v) = self {
            if let Some(h) = v.iter_mut().find(|h| h.slot() == slot) {
                let old = if h.gen() == gen { h.tiers() } else { 0 };
                *h = Holder::new(slot, gen, old | bit);
                return bit & !old;
            }
            v.push(Holder::new(slot, gen, bit));
            return bit;
        }
        // Fast paths: no allocation for the common one- and two-holder cases.
        match *self {
            Holders::Empty => {
                *self = Holders::One(Holder::new(slot, gen, bit));
                return bit;
            }
            Holders::One(a) if a.slot() != slot => {
                *self = Holders::Two(a, Holder::new(slot, gen, bit));
                return bit;
            }
            Holders::One(a) => {
                let old = if a.gen() == gen { a.tiers() } else { 0 };
                *self = Holders::One(Holder::new(slot, gen, old | bit));
                return bit & !old;
            }
            _ => {}
        }
        let mut v: Vec<Holder> = self.iter().collect();
        let newly = match v.iter_mut().find(|h| h.slot() == slot) {
            Some(h) => {
                let old = if h.gen() == gen { h.tiers() } else { 0 };
                *h = Holder::new(slot, gen, old | bit);
                bit & !old
            }
            None => {
                v.push(Holder::new(slot, gen, bit));
                bit
            }
        };
        *self = Holders::from_vec(v);
        newly
    }

    /// Removes `tier` (or every tier with `None`) of `slot` at generation `gen`.
    /// Returns the tier bits that were removed.
    pub(crate) fn remove(&mut self, slot: WorkerSlot, gen: u8, tier: Option<Tier>) -> u8 {
        let mask = tier.map_or(0xff, Tier::bit);
        let mut removed = 0;
        let v: Vec<Holder> = self
            .iter()
            .filter_map(|h| {
                if h.slot() != slot {
                    return Some(h);
                }
                if h.gen() != gen {
                    return None; // an old generation's leftover: drop it
                }
                removed = h.tiers() & mask;
                let left = h.tiers() & !mask;
                (left != 0).then(|| h.with_tiers(left))
            })
            .collect();
        *self = Holders::from_vec(v);
        removed
    }

    /// Drops holders whose generation is no longer current.
    pub(crate) fn retain_current(&mut self, current: &impl Fn(WorkerSlot) -> Option<u8>) {
        let v: Vec<Holder> = self
            .iter()
            .filter(|h| current(h.slot()) == Some(h.gen()))
            .collect();
        *self = Holders::from_vec(v);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn size_is_compact() {
        assert_eq!(std::mem::size_of::<Holders>(), 16);
    }

    #[test]
    fn add_remove_tiers_and_spill() {
        let mut h = Holders::Empty;
        assert_eq!(h.add(1, 0, Tier::Gpu), Tier::Gpu.bit());
        assert_eq!(h.add(1, 0, Tier::Gpu), 0, "already there");
        assert_eq!(h.add(1, 0, Tier::Cpu), Tier::Cpu.bit());
        for s in 2..6 {
            h.add(s, 0, Tier::Gpu);
        }
        assert!(matches!(h, Holders::Many(_)));
        assert_eq!(
            h.find(1).unwrap().tiers(),
            Tier::Gpu.bit() | Tier::Cpu.bit()
        );
        assert_eq!(h.remove(1, 0, Some(Tier::Gpu)), Tier::Gpu.bit());
        assert_eq!(h.find(1).unwrap().tiers(), Tier::Cpu.bit());
        assert_eq!(h.remove(1, 0, None), Tier::Cpu.bit());
        assert!(h.find(1).is_none());
        for s in 2..6 {
            h.remove(s, 0, None);
        }
        assert!(h.is_empty());
    }

    #[test]
    fn old_generation_is_replaced() {
        let mut h = Holders::Empty;
        h.add(3, 0, Tier::Gpu);
        assert_eq!(h.add(3, 1, Tier::Cpu), Tier::Cpu.bit());
        let x = h.find(3).unwrap();
        assert_eq!((x.gen(), x.tiers()), (1, Tier::Cpu.bit()));
        h.retain_current(&|_| Some(2));
        assert!(h.is_empty());
    }
}
