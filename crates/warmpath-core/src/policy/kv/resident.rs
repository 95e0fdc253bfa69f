//! What each backend of known capacity caches, for the eviction term: an LRU over prefix
//! keys that trims chains as the engine's `prefix_cache` does (proptest; docs/kv.md).

use crate::route::BackendLoad;
use std::collections::{BTreeSet, HashMap};

#[derive(Clone, Debug, Default)]
pub(crate) struct Cache {
    capacity: u64,
    /// Per prefix key: (leading blocks held, last use).
    held: HashMap<u64, (u64, u64)>,
    /// (last use, key): the eviction order.
    lru: BTreeSet<(u64, u64)>,
    used: u64,
    tick: u64,
}

impl Cache {
    pub(crate) fn new(capacity: u64) -> Self {
        Cache {
            capacity,
            ..Default::default()
        }
    }

    pub(crate) fn held(&self, key: u64) -> u64 {
        self.held.get(&key).map_or(0, |h| h.0)
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// Marks `key` used now (the engine's lookup), if held.
    fn touch(&mut self, key: u64) {
        self.tick += 1;
        if let Some(h) = self.held.get_mut(&key) {
            self.lru.remove(&(h.1, key));
            h.1 = self.tick;
            self.lru.insert((self.tick, key));
        }
    }

    /// Sets `key` to `blocks` held (a new entry is used now).
    fn set(&mut self, key: u64, blocks: u64) {
        let tick = self.tick;
        match self.held.get_mut(&key) {
            Some(h) if blocks == 0 => {
                self.used -= h.0;
                self.lru.remove(&(h.1, key));
                self.held.remove(&key);
            }
            Some(h) => {
                self.used = self.used - h.0 + blocks;
                h.0 = blocks;
            }
            None if blocks > 0 => {
                self.used += blocks;
                self.held.insert(key, (blocks, tick));
                self.lru.insert((tick, key));
            }
            None => {}
        }
    }

    /// A request of `key`'s `blocks`-block chain ran here: the LRU others are trimmed for it.
    pub(crate) fn store(&mut self, key: u64, blocks: u64) {
        let blocks = blocks.min(self.capacity).max(self.held(key));
        self.touch(key);
        self.set(key, blocks);
        while self.used > self.capacity {
            let Some((victim, trim)) = self.victims(key, 0).next() else {
                break;
            };
            self.set(victim, self.held(victim) - trim);
        }
    }

    /// The index saw `blocks` of `key`'s chain here: the truth (its place in the LRU stays).
    pub(crate) fn observe(&mut self, key: u64, blocks: u64) {
        self.set(key, blocks.min(self.capacity));
    }

    /// `key`'s entry as it was before an [`Self::observe`] (which touches nothing else).
    fn restore(&mut self, key: u64, entry: Option<(u64, u64)>, used: u64) {
        if let Some((_, t)) = self.held.remove(&key) {
            self.lru.remove(&(t, key));
        }
        if let Some(e) = entry {
            self.held.insert(key, e);
            self.lru.insert((e.1, key));
        }
        self.used = used;
    }

    /// Whether `blocks` more fit untrimmed: then [`Self::victims`] yields nothing for any key.
    pub(crate) fn has_room(&self, blocks: u64) -> bool {
        self.used + blocks.min(self.capacity) <= self.capacity
    }

    /// What caching `blocks` blocks of `key` would trim, LRU first: (prefix key, blocks trimmed).
    pub(crate) fn victims(&self, key: u64, blocks: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let need = blocks.min(self.capacity).saturating_sub(self.held(key));
        let mut over = (self.used + need).saturating_sub(self.capacity);
        self.lru
            .iter()
            .filter(move |&&(_, k)| k != key)
            .map_while(move |&(_, k)| {
                if over == 0 {
                    return None;
                }
                let trim = self.held(k).min(over);
                over -= trim;
                Some((k, trim))
            })
    }
}

/// The capacity `l` reports when it differs from `model`'s (none or 0 keeps the model).
fn new_capacity(model: Option<&Cache>, l: &BackendLoad) -> Option<u64> {
    l.engine
        .and_then(|e| e.capacity_blocks)
        .filter(|&c| c > 0 && model.map(|m| m.capacity) != Some(c))
}

/// The modelled caches, by backend position (`None`: capacity unknown).
#[derive(Clone, Debug, Default)]
pub(crate) struct Resident {
    caches: Vec<Option<Cache>>,
    /// Positions whose reported capacity may differ from their model's (see [`Self::note`]).
    stale: Vec<u32>,
    /// Whether every position was compared once since the models were made.
    synced: bool,
    /// While a preview runs: what it changed.
    journal: Option<Journal>,
}

/// What a preview changed in the models ([`Resident::begin`]).
#[derive(Clone, Debug, Default)]
pub(crate) struct Journal {
    stale: Vec<u32>,
    synced: bool,
    changes: Vec<(u32, Change)>,
}

/// One change a preview made, as it was before.
#[derive(Clone, Debug)]
enum Change {
    /// An observation: the key, its entry, the blocks used.
    Entry(u64, Option<(u64, u64)>, u64),
    /// A new model: the one it replaced.
    Model(Option<Cache>),
}

impl Resident {
    pub(crate) fn new(capacities: impl IntoIterator<Item = Option<u64>>) -> Self {
        Resident {
            caches: capacities.into_iter().map(|c| c.map(Cache::new)).collect(),
            ..Resident::default()
        }
    }

    pub(crate) fn of(&self, b: usize) -> Option<&Cache> {
        self.caches.get(b).and_then(Option::as_ref)
    }

    pub(crate) fn of_mut(&mut self, b: usize) -> Option<&mut Cache> {
        self.caches.get_mut(b).and_then(Option::as_mut)
    }

    /// [`Cache::observe`], journaled.
    pub(crate) fn observe(&mut self, b: usize, key: u64, blocks: u64) {
        let Some(c) = self.caches.get_mut(b).and_then(Option::as_mut) else {
            return;
        };
        if let Some(j) = &mut self.journal {
            let before = Change::Entry(key, c.held.get(&key).copied(), c.used);
            j.changes.push((b as u32, before));
        }
        c.observe(key, blocks);
    }

    /// From here until [`Self::rollback`] every change is journaled (a preview).
    pub(crate) fn begin(&mut self) {
        self.journal = Some(Journal {
            stale: self.stale.clone(),
            synced: self.synced,
            changes: Vec::new(),
        });
    }

    /// Undoes what changed since [`Self::begin`], newest first.
    pub(crate) fn rollback(&mut self) {
        let Some(j) = self.journal.take() else {
            return;
        };
        for (b, change) in j.changes.into_iter().rev() {
            let Some(slot) = self.caches.get_mut(b as usize) else {
                continue;
            };
            match (change, slot) {
                (Change::Entry(key, entry, used), Some(c)) => c.restore(key, entry, used),
                (Change::Model(model), slot) => *slot = model,
                (Change::Entry(..), None) => {}
            }
        }
        self.stale = j.stale;
        self.synced = j.synced;
    }

    /// Notes changed capacities for the next [`Self::sync`] (models follow reports where read).
    pub(crate) fn note(&mut self, loads: &[BackendLoad], changed: Option<&[usize]>) {
        let Some(changed) = changed else {
            self.synced = false;
            return;
        };
        for &i in changed {
            let model = self.caches.get(i).and_then(Option::as_ref);
            if loads.get(i).and_then(|l| new_capacity(model, l)).is_some() {
                self.stale.push(i as u32);
            }
        }
        // Warm picks never sync: past one entry per position a full compare is as cheap.
        if self.stale.len() > self.caches.len() {
            self.stale.clear();
            self.synced = false;
        }
    }

    /// A capacity that appears or changes gets a fresh, empty model (relearned from the index).
    pub(crate) fn sync(&mut self, loads: &[BackendLoad]) {
        if self.synced {
            for i in std::mem::take(&mut self.stale) {
                if let (Some(slot), Some(l)) =
                    (self.caches.get_mut(i as usize), loads.get(i as usize))
                {
                    Self::follow(i as usize, slot, l, &mut self.journal);
                }
            }
        } else {
            for (i, (slot, l)) in self.caches.iter_mut().zip(loads).enumerate() {
                Self::follow(i, slot, l, &mut self.journal);
            }
            self.stale.clear();
            self.synced = true;
        }
    }

    fn follow(i: usize, slot: &mut Option<Cache>, l: &BackendLoad, journal: &mut Option<Journal>) {
        if let Some(cap) = new_capacity(slot.as_ref(), l) {
            let old = slot.replace(Cache::new(cap));
            if let Some(j) = journal {
                j.changes.push((i as u32, Change::Model(old)));
            }
        }
    }

    /// Over a new membership: `from[j]` is `j`'s old position (`None`: new, empty).
    pub(crate) fn remap(
        &self,
        from: &[Option<usize>],
        capacities: impl IntoIterator<Item = Option<u64>>,
    ) -> Self {
        Resident {
            caches: from
                .iter()
                .zip(capacities)
                .map(|(f, cap)| match f {
                    Some(i) => self.caches.get(*i).cloned().flatten(),
                    None => cap.map(Cache::new),
                })
                .collect(),
            ..Resident::default()
        }
    }

    /// Blocks of every modelled cache together, and of the largest one.
    pub(crate) fn capacity(&self) -> (u64, u64) {
        self.caches.iter().flatten().fold((0, 0), |(sum, max), c| {
            (sum.saturating_add(c.capacity), max.max(c.capacity))
        })
    }

    pub(crate) fn any(&self) -> bool {
        self.caches.iter().any(Option::is_some)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::prefix_cache::PrefixCache;
    use proptest::prelude::*;

    #[test]
    fn the_model_follows_the_capacity_engines_report() {
        use crate::route::{BackendLoad, EngineLoad};
        let with = |cap: Option<u64>| BackendLoad {
            engine: Some(EngineLoad {
                capacity_blocks: cap,
                ..EngineLoad::default()
            }),
            ..BackendLoad::default()
        };
        let mut r = Resident::new([None, Some(10)]);
        let sync = |r: &mut Resident, loads: &[BackendLoad]| {
            r.note(loads, None);
            r.sync(loads);
        };
        sync(&mut r, &[with(Some(100)), with(None)]);
        assert_eq!(r.of(0).map(|c| c.capacity), Some(100), "appears");
        assert_eq!(
            r.of(1).map(|c| c.capacity),
            Some(10),
            "kept without a report"
        );
        r.of_mut(0).unwrap().store(7, 5);
        sync(&mut r, &[with(Some(100)), BackendLoad::default()]);
        assert_eq!(r.of(0).unwrap().held(7), 5, "unchanged: the model stays");
        sync(&mut r, &[with(Some(50)), with(Some(0))]);
        assert_eq!(r.of(0).unwrap().held(7), 0, "changed: a fresh model");
        assert_eq!(r.of(1).map(|c| c.capacity), Some(10), "0 means unknown");
        // Told which positions changed, it compares only those.
        let loads = [with(Some(50)), with(Some(20))];
        r.note(&loads, Some(&[1]));
        r.sync(&loads);
        assert_eq!(r.of(1).map(|c| c.capacity), Some(20), "noted: followed");
        r.of_mut(0).unwrap().store(7, 5);
        r.note(&loads, Some(&[]));
        r.sync(&loads);
        assert_eq!(r.of(0).unwrap().held(7), 5, "nothing noted: kept");
        let grown = [with(Some(60)), with(Some(20))];
        for _ in 0..3 {
            r.note(&grown, Some(&[0]));
        }
        r.sync(&grown);
        assert_eq!(r.of(0).map(|c| c.capacity), Some(60), "past the bound");
    }

    #[test]
    fn trims_the_least_recently_used_from_its_end() {
        let mut c = Cache::new(10);
        c.store(1, 4);
        c.store(2, 4);
        assert_eq!(c.victims(3, 2).collect::<Vec<_>>(), vec![]);
        assert_eq!(c.victims(3, 4).collect::<Vec<_>>(), vec![(1, 2)]);
        c.store(1, 4); // used again: 2 is the older now
        assert_eq!(c.victims(3, 8).collect::<Vec<_>>(), vec![(2, 4), (1, 2)]);
        c.store(3, 4);
        assert_eq!((c.held(1), c.held(2), c.held(3), c.used()), (4, 2, 4, 10));
        // The index says 1 lost all but one block.
        c.observe(1, 1);
        assert_eq!((c.held(1), c.used()), (1, 7));
        // No room for 4 more: victims; room for 0 (or after trimming): none.
        assert!(!c.has_room(4) && c.has_room(0));
        // Too big for the cache: held up to the capacity, everything else out.
        c.store(4, 30);
        assert_eq!((c.held(4), c.used()), (10, 10));
    }

    /// Distinct tokens for `blocks` blocks of prefix `key`.
    fn chain(key: u64, blocks: u64, bs: usize) -> Vec<u32> {
        (0..blocks as usize * bs)
            .map(|i| (key as u32) << 16 | i as u32)
            .collect()
    }

    /// Leading blocks of `key`'s chain (of up to `max` blocks) the engine
    /// cache holds, without touching it.
    fn engine_held(p: &PrefixCache<()>, key: u64, max: u64, bs: usize) -> u64 {
        let hashes = p.block_hashes(&chain(key, max, bs), None);
        hashes.iter().take_while(|h| p.contains(**h)).count() as u64
    }

    proptest! {
        /// Under random stores (which evict) and engine-side removals (seen
        /// through the index), the model holds exactly what the engine's
        /// `prefix_cache` holds, prefix by prefix.
        #[test]
        fn matches_the_engine_prefix_cache(
            cap in 4u64..40,
            lens in proptest::collection::vec(1u64..16, 8),
            ops in proptest::collection::vec((0usize..8, 0u8..12), 1..200),
        ) {
            let bs = 2;
            let mut engine = PrefixCache::<()>::new(bs, cap as usize).unwrap();
            let mut model = Cache::new(cap);
            // One chain per prefix key, as `kv_aware` keys prefixes.
            for (k, op) in ops {
                let (key, blocks) = (k as u64, lens[k]);
                if op == 0 {
                    // The engine drops its cache (evictions the model did
                    // not predict); the index tells, prefix by prefix.
                    let _ = engine.clear();
                    for k in 0..8 {
                        model.observe(k, 0);
                    }
                } else {
                    let tokens = chain(key, blocks, bs);
                    engine.lookup(&tokens, None);
                    engine.insert(&tokens, None, |_| ());
                    model.store(key, blocks);
                }
                for k in 0..8 {
                    prop_assert_eq!(model.held(k), engine_held(&engine, k, 16, bs), "key {}", k);
                    // Room means nothing is trimmed, for any chain that fits.
                    for need in [1, blocks, cap] {
                        if model.has_room(need) {
                            prop_assert_eq!(model.victims(k, need).count(), 0);
                        }
                    }
                }
                prop_assert_eq!(model.used(), engine.len() as u64);
            }
        }
    }
}
