//! Where each recent prefix lives (home and copies) and its decayed popularity, so each
//! backend's expected load: a set-associative table (docs/kv.md).

use super::tuning::{HOME_INLINE_COPIES as INLINE, HOME_TABLE_KEYS, HOME_WAYS as WAYS};
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Home {
    pub(crate) key: u64,
    pub(crate) backend: u32,
    /// The decision (`seq`, low 32 bits) it was homed there at.
    pub(crate) since: u32,
    /// Decayed requests of it, in the caller's units.
    pub(crate) pop: f64,
    /// Copies besides `backend`: the first `extra` (at most `INLINE`) here, the rest spilled.
    copies: [u32; INLINE],
    extra: u16,
    used: bool,
}

impl Home {
    /// How many backends hold it deliberately (1 + copies).
    pub(crate) fn count(&self) -> usize {
        1 + usize::from(self.extra)
    }
}

/// `e`'s holders: the home, its inline copies, then its spilled ones.
fn holders_of<'a>(
    e: &'a Home,
    spill: &'a HashMap<u64, Vec<u32>>,
) -> impl Iterator<Item = usize> + 'a {
    let inline = usize::from(e.extra).min(INLINE);
    let spilled = if usize::from(e.extra) > INLINE {
        spill.get(&e.key).map_or(&[][..], Vec::as_slice)
    } else {
        &[]
    };
    std::iter::once(e.backend as usize)
        .chain(e.copies[..inline].iter().map(|&c| c as usize))
        .chain(spilled.iter().map(|&c| c as usize))
}

#[derive(Clone, Debug)]
pub(crate) struct Homes {
    entries: Vec<Home>,
    /// Per backend: the popularity homed there, `pop / k` for each of `k` holders.
    load: Vec<f64>,
    /// Copies beyond `INLINE`, by key.
    spill: HashMap<u64, Vec<u32>>,
}

impl Homes {
    /// Room for about `keys` prefixes.
    pub(crate) fn new(backends: usize, keys: usize) -> Self {
        let sets = keys
            .div_ceil(WAYS)
            .clamp(1, HOME_TABLE_KEYS.1 / WAYS)
            .next_power_of_two();
        Homes {
            entries: vec![Home::default(); sets * WAYS],
            load: vec![0.0; backends],
            spill: HashMap::new(),
        }
    }

    fn set(&self, key: u64) -> std::ops::Range<usize> {
        // The low bits pick the set; keys are hashes.
        let sets = self.entries.len() / WAYS;
        let at = (key as usize & (sets - 1)) * WAYS;
        at..at + WAYS
    }

    fn find(&self, key: u64) -> Option<usize> {
        self.set(key)
            .find(|&i| self.entries[i].used && self.entries[i].key == key)
    }

    pub(crate) fn get(&self, key: u64) -> Option<Home> {
        self.find(key).map(|i| self.entries[i])
    }

    /// `h`'s holders: its home, then its copies.
    pub(crate) fn holders<'a>(&'a self, h: &'a Home) -> impl Iterator<Item = usize> + 'a {
        holders_of(h, &self.spill)
    }

    pub(crate) fn holds(&self, h: &Home, b: usize) -> bool {
        self.holders(h).any(|x| x == b)
    }

    pub(crate) fn pops(&self) -> impl Iterator<Item = f64> + '_ {
        self.entries.iter().filter(|e| e.used).map(|e| e.pop)
    }

    pub(crate) fn loads(&self) -> &[f64] {
        &self.load
    }

    /// Bytes of the spill table's copies.
    #[cfg(test)]
    pub(crate) fn spilled(&self) -> usize {
        self.spill.values().map(|v| 8 + 4 * v.len()).sum()
    }

    /// One more request of `key` (weight `unit`); a key not in the table is homed on `backend`.
    pub(crate) fn hit(&mut self, key: u64, backend: usize, unit: f64, seq: u64) {
        let i = self
            .find(key)
            .unwrap_or_else(|| self.insert(key, backend, seq));
        self.entries[i].pop += unit;
        let share = unit / self.entries[i].count() as f64;
        self.each_load(i, |l| *l += share);
    }

    /// Adds (`sign` 1) or takes away (-1) entry `i`'s popularity from its holders' loads.
    fn spread(&mut self, i: usize, sign: f64) {
        let share = self.entries[i].pop / self.entries[i].count() as f64;
        // Rounding must never leave a negative load.
        self.each_load(i, |l| *l = (*l + sign * share).max(0.0));
    }

    fn each_load(&mut self, i: usize, f: impl Fn(&mut f64)) {
        let (e, load) = (&self.entries[i], &mut self.load);
        for b in holders_of(e, &self.spill) {
            if let Some(l) = load.get_mut(b) {
                f(l);
            }
        }
    }

    /// One more copy of `key` on `backend`; never more holders than backends.
    pub(crate) fn add_copy(&mut self, key: u64, backend: usize) {
        let Some(i) = self.find(key) else {
            return;
        };
        let e = self.entries[i];
        if e.count() >= self.load.len() || e.extra == u16::MAX || self.holds(&e, backend) {
            return;
        }
        self.spread(i, -1.0);
        self.push_copies(i, &[backend]);
        self.spread(i, 1.0);
    }

    /// Drops the last copy of `key`, if any; returns where it was.
    pub(crate) fn drop_copy(&mut self, key: u64) -> Option<usize> {
        let i = self.find(key)?;
        if self.entries[i].extra == 0 {
            return None;
        }
        self.spread(i, -1.0);
        let e = &mut self.entries[i];
        e.extra -= 1;
        let at = usize::from(e.extra);
        let gone = if at < INLINE {
            e.copies[at]
        } else {
            let v = self.spill.entry(key).or_default();
            let gone = v.pop().unwrap_or(e.backend);
            if v.is_empty() {
                self.spill.remove(&key);
            }
            gone
        };
        self.spread(i, 1.0);
        Some(gone as usize)
    }

    /// Drops every copy of entry `i` (its load must be taken away first).
    fn clear_copies(&mut self, i: usize) {
        let e = &mut self.entries[i];
        if usize::from(e.extra) > INLINE {
            self.spill.remove(&e.key);
        }
        e.extra = 0;
    }

    /// Homes `key` on `backend`: a copy made home keeps the other copies, any other drops them.
    pub(crate) fn set_home(&mut self, key: u64, backend: usize, seq: u64) {
        let i = self
            .find(key)
            .unwrap_or_else(|| self.insert(key, backend, seq));
        self.spread(i, -1.0);
        let e = self.entries[i];
        let others: Vec<usize> = if e.extra > 0 && self.holds(&e, backend) {
            self.holders(&e).skip(1).filter(|&c| c != backend).collect()
        } else {
            Vec::new()
        };
        self.clear_copies(i);
        self.entries[i] = Home {
            backend: backend as u32,
            since: seq as u32,
            extra: 0,
            ..self.entries[i]
        };
        self.push_copies(i, &others);
        self.spread(i, 1.0);
    }

    /// Appends `copies` to entry `i`'s (its load is not touched).
    fn push_copies(&mut self, i: usize, copies: &[usize]) {
        for &c in copies {
            let e = &mut self.entries[i];
            let at = usize::from(e.extra);
            if at < INLINE {
                e.copies[at] = c as u32;
            } else {
                self.spill.entry(e.key).or_default().push(c as u32);
            }
            e.extra += 1;
        }
    }

    /// A new entry for `key` on `backend`, in a free way or over the set's least popular entry.
    fn insert(&mut self, key: u64, backend: usize, seq: u64) -> usize {
        let set = self.set(key);
        let i = set
            .clone()
            .find(|&i| !self.entries[i].used)
            .or_else(|| set.min_by(|&a, &b| self.entries[a].pop.total_cmp(&self.entries[b].pop)))
            .unwrap_or(0);
        if self.entries[i].used {
            self.spread(i, -1.0);
            self.clear_copies(i);
        }
        self.entries[i] = Home {
            key,
            backend: backend as u32,
            since: seq as u32,
            used: true,
            ..Home::default()
        };
        i
    }

    /// Divides every popularity and load by `k` (the caller's unit reset).
    pub(crate) fn rescale(&mut self, k: f64) {
        self.entries.iter_mut().for_each(|e| e.pop /= k);
        self.load.iter_mut().for_each(|l| *l /= k);
    }

    /// Over a new membership, `to[b]` old `b`'s position; never shrinks, so no entry is lost.
    pub(crate) fn remap(&self, to: &[Option<usize>], backends: usize, keys: usize) -> Homes {
        let mut out = Homes::new(backends, keys);
        if out.entries.len() < self.entries.len() {
            out.entries = vec![Home::default(); self.entries.len()];
        }
        let map = |b: usize| to.get(b).copied().flatten();
        for (b, &l) in self.load.iter().enumerate() {
            if let Some(slot) = map(b).and_then(|j| out.load.get_mut(j)) {
                *slot = l;
            }
        }
        for e in self.entries.iter().filter(|e| e.used) {
            let kept: Vec<usize> = self.holders(e).filter_map(map).collect();
            let changed = kept.len() != e.count();
            for &j in kept.iter().filter(|_| changed) {
                if let Some(l) = out.load.get_mut(j) {
                    *l = (*l - e.pop / e.count() as f64).max(0.0);
                }
            }
            let Some(home) = map(e.backend as usize) else {
                continue;
            };
            let moved = Home {
                backend: home as u32,
                copies: [0; INLINE],
                extra: 0,
                ..*e
            };
            // Never full: an old set's entries land in the same or more sets.
            if let Some(i) = out.set(e.key).find(|&i| !out.entries[i].used) {
                out.entries[i] = moved;
                out.push_copies(i, &kept[1..]);
                if changed {
                    out.spread(i, 1.0);
                }
            }
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn popularity_follows_its_home() {
        let mut h = Homes::new(3, 16);
        for _ in 0..5 {
            h.hit(10, 0, 1.0, 0);
        }
        h.hit(11, 1, 1.0, 0);
        assert_eq!(h.loads(), &[5.0, 1.0, 0.0]);
        h.set_home(10, 2, 0);
        assert_eq!(h.loads(), &[0.0, 1.0, 5.0]);
        let e = h.get(10).unwrap();
        assert_eq!((e.backend, e.pop), (2, 5.0));
        // Later requests count where it lives now.
        h.hit(10, 0, 2.0, 0);
        assert_eq!(h.loads(), &[0.0, 1.0, 7.0]);
        h.rescale(2.0);
        assert_eq!(h.loads(), &[0.0, 0.5, 3.5]);
    }

    #[test]
    fn a_full_set_drops_its_least_popular_entry() {
        let mut h = Homes::new(2, 1);
        let sets = (h.entries.len() / WAYS) as u64;
        // Five keys of the same set, popularity 5, 4, 3, 2, 1 ...
        for (n, k) in (0..5u64).enumerate() {
            let key = 3 + k * sets;
            for _ in 0..(5 - n) {
                h.hit(key, n % 2, 1.0, 0);
            }
        }
        // ... the fifth (1 request) took the place of the fourth (2).
        assert!(h.get(3 + 3 * sets).is_none());
        assert_eq!(h.get(3 + 4 * sets).unwrap().pop, 1.0);
        // The fourth's 2 left backend 1's load (4 remain); backend 0 holds
        // 5 + 3 + 1.
        assert_eq!(h.loads(), &[9.0, 4.0]);
    }

    #[test]
    fn an_entry_stays_small() {
        // The table's memory bound in `tuning` assumes 40 bytes a prefix.
        assert!(std::mem::size_of::<Home>() <= 40);
    }

    #[test]
    fn copies_beyond_the_entry_spill_and_come_back() {
        let mut h = Homes::new(10, 16);
        for _ in 0..8 {
            h.hit(7, 0, 1.0, 0);
        }
        for b in 1..8 {
            h.add_copy(7, b);
        }
        let e = h.get(7).unwrap();
        assert_eq!(e.count(), 8);
        assert_eq!(
            h.holders(&e).collect::<Vec<_>>(),
            (0..8).collect::<Vec<_>>()
        );
        assert!(h.holds(&e, 7) && !h.holds(&e, 8));
        // A backend that holds it already is refused.
        h.add_copy(7, 5);
        assert_eq!(h.get(7).unwrap().count(), 8);
        // 8 requests over 8 holders.
        assert_eq!(
            &h.loads()[..9],
            &[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
        );
        assert_eq!(h.spilled(), 8 + 4 * (8 - 1 - INLINE));
        // Dropped last first, spill before the entry's own.
        for want in (1..8).rev() {
            assert_eq!(h.drop_copy(7), Some(want));
        }
        assert_eq!(h.drop_copy(7), None);
        assert_eq!(h.spilled(), 0);
        assert_eq!(h.loads()[0], 8.0);
        // Never more holders than backends.
        for b in 1..12 {
            h.add_copy(7, b);
        }
        assert_eq!(h.get(7).unwrap().count(), 10);
    }

    #[test]
    fn a_copy_made_home_keeps_the_other_copies() {
        let mut h = Homes::new(8, 16);
        for _ in 0..6 {
            h.hit(3, 0, 1.0, 0);
        }
        for b in 1..6 {
            h.add_copy(3, b);
        }
        // The home lost it; copy 4 is its home now: 0 holds nothing.
        h.set_home(3, 4, 0);
        let e = h.get(3).unwrap();
        assert_eq!(h.holders(&e).collect::<Vec<_>>(), vec![4, 1, 2, 3, 5]);
        assert_eq!(h.loads(), &[0.0, 1.2, 1.2, 1.2, 1.2, 1.2, 0.0, 0.0]);
        // A new home that held nothing drops them all.
        h.set_home(3, 6, 0);
        let e = h.get(3).unwrap();
        assert_eq!(e.count(), 1);
        assert_eq!(h.spilled(), 0);
        assert_eq!(h.loads()[6], 6.0);
    }

    proptest! {
        /// Whatever the sequence, loads stay >= 0 and equal the sum of the
        /// remembered popularities homed on each backend.
        #[test]
        fn loads_are_the_sums_of_the_homed_popularities(
            ops in proptest::collection::vec((0u64..40, 0usize..4, 0u8..4, 1u32..4), 1..300)
        ) {
            let mut h = Homes::new(4, 8);
            for &(key, backend, op, w) in &ops {
                match op {
                    0 => h.set_home(key, backend, 0),
                    1 => h.add_copy(key, backend),
                    2 if w == 1 => {
                        h.drop_copy(key);
                    }
                    _ => h.hit(key, backend, f64::from(w), 0),
                }
            }
            // A prefix with copies counts pop / k on each of its k holders.
            let mut sums = [0.0; 4];
            for e in h.entries.iter().filter(|e| e.used) {
                for b in h.holders(e) {
                    sums[b] += e.pop / e.count() as f64;
                }
            }
            for (b, l) in h.loads().iter().enumerate() {
                prop_assert!(*l >= 0.0);
                prop_assert!((l - sums[b]).abs() < 1e-6, "{:?} {:?}", h.loads(), sums);
            }
        }

        /// The same over a fleet where copies spill out of the entry: loads
        /// are the sums, a prefix's holders are distinct and as many as its
        /// count, and the spill holds exactly the copies past the entry's.
        #[test]
        fn spilled_copies_are_counted_like_the_entry_s_own(
            ops in proptest::collection::vec((0u64..24, 0usize..12, 0u8..5, 1u32..4), 1..400)
        ) {
            let mut h = Homes::new(12, 8);
            for &(key, backend, op, w) in &ops {
                match op {
                    0 => h.set_home(key, backend, 0),
                    1 | 2 => h.add_copy(key, backend),
                    3 if w == 1 => {
                        h.drop_copy(key);
                    }
                    _ => h.hit(key, backend, f64::from(w), 0),
                }
            }
            let mut sums = [0.0; 12];
            let mut spilled = 0;
            for e in h.entries.iter().filter(|e| e.used) {
                let mut all: Vec<usize> = h.holders(e).collect();
                prop_assert_eq!(all.len(), e.count());
                all.sort_unstable();
                all.dedup();
                prop_assert_eq!(all.len(), e.count());
                for b in h.holders(e) {
                    sums[b] += e.pop / e.count() as f64;
                }
                spilled += e.count().saturating_sub(1 + INLINE);
            }
            prop_assert_eq!(h.spill.values().map(Vec::len).sum::<usize>(), spilled);
            prop_assert!(h.spill.values().all(|v| !v.is_empty()));
            for (b, l) in h.loads().iter().enumerate() {
                prop_assert!(*l >= 0.0);
                prop_assert!((l - sums[b]).abs() < 1e-6, "{:?} {:?}", h.loads(), sums);
            }
        }
    }
}
