//! `warmpath-bench scale`: a socket-free discrete-event simulation that
//! drives the real hashing, [`CacheIndex`] and policies over a fleet too large
//! for one machine; the model is described in docs/bench.md ("The `scale` model").

mod cost;
mod diag;
mod fleet;
mod view;

pub use cost::{KindCost, RoutingCost};
pub use diag::Diagnosis;

use crate::error::{ensure, ensure_in, BenchError};
use crate::stats::{ratio, share_min_max, Summary};
use crate::timing::TimeModel;
use cost::CostSums;
use diag::{DocState, Origin, Sample};
use fleet::Instance;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Instant;
use view::{Fact, Phase, Replicas};
use warmpath_core::hash::ChainHasher;
use warmpath_core::policy::{
    build_policy, Mode, PolicyBackend, PolicyConfig, RemoteDecision, RouteInput,
};
use warmpath_core::{BlockHash, CacheIndex, HashSeed, Strategy};
use xxhash_rust::xxh3::xxh3_64;

use crate::dist::{unit_exp, Zipf};

/// Settings of one scale run; its flags are `warmpath-bench scale`'s.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct ScaleConfig {
    /// Simulated instances.
    #[arg(long, default_value_t = 1000)]
    pub instances: usize,
    /// Requests per strategy.
    #[arg(long, default_value_t = 1_000_000)]
    pub requests: usize,
    /// Mean arrivals per second per instance.
    #[arg(long, default_value_t = 4.0)]
    pub rate_per_instance: f64,
    /// Distinct documents.
    #[arg(long, default_value_t = 8000)]
    pub docs: usize,
    /// Zipf exponent of document popularity.
    #[arg(long, default_value_t = 0.8)]
    pub zipf: f64,
    /// Tokens per document.
    #[arg(long, default_value_t = 8000)]
    pub doc_tokens: usize,
    /// Prefix cache capacity per instance, in blocks.
    #[arg(long, default_value_t = 8192)]
    pub cache_blocks: usize,
    /// Do not tell kv_aware the instances' cache capacity (no capacity
    /// model, as with agents that do not report it).
    #[arg(long)]
    pub hide_capacity: bool,
    /// RNG seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Router replicas, each request sent to one at random; they share the
    /// index and the engines' load reports, nothing else.
    #[arg(long, default_value_t = 1)]
    pub routers: usize,
    /// Replicas share each decision through the agents, arriving this many
    /// ms later (ARCHITECTURE.md, "Router replicas"); unset: no sharing.
    #[arg(long)]
    pub share_delay_ms: Option<f64>,
    /// Every this many seconds, `--reset-instances` instances (the next ones
    /// in turn) lose their whole cache, as engine restarts do.
    #[arg(long)]
    pub reset_every_s: Option<f64>,
    /// Instances reset each time (with `--reset-every-s`).
    #[arg(long, default_value_t = 2)]
    pub reset_instances: usize,
    /// Every this many seconds one instance (the next in turn) leaves the
    /// member list and rejoins before the next request, its cache kept, as
    /// on a discovery flap: each router's policy is rebuilt over both lists.
    #[arg(long)]
    pub rejoin_every_s: Option<f64>,
    /// How often the agents report the engines' load to the replicas, ms.
    #[arg(skip = 1000u64)]
    pub load_report_ms: u64,
    #[arg(skip)]
    pub time: TimeModel,
    #[arg(skip)]
    pub policy: PolicyConfig,
}

impl Default for ScaleConfig {
    /// The flags' defaults.
    fn default() -> Self {
        crate::flag_defaults()
    }
}

impl ScaleConfig {
    /// Blocks of the whole working set (every document once).
    pub fn working_set_blocks(&self) -> usize {
        self.docs * (self.doc_tokens / BLOCK)
    }

    /// Sizes each instance's cache so that the fleet's total holds `ratio`
    /// x the working set.
    pub fn with_cache_ratio(mut self, ratio: f64) -> Self {
        let total = ratio * self.working_set_blocks() as f64;
        self.cache_blocks = (total / self.instances.max(1) as f64).round().max(1.0) as usize;
        self
    }

    pub fn validate(&self) -> Result<(), BenchError> {
        let c = self;
        ensure_in("instances", c.instances, 65_536)?;
        let docs_ok = c.requests > 0 && c.docs > 0 && c.docs <= u32::MAX as usize;
        ensure(docs_ok, "requests/docs", "must be at least 1")?;
        let rate_ok = c.rate_per_instance.is_finite() && c.rate_per_instance > 0.0;
        ensure(rate_ok, "rate_per_instance", "must be a number > 0")?;
        ensure_in("routers", c.routers, 64)?;
        let delay_ok = c.share_delay_ms.is_none_or(|d| d.is_finite() && d >= 0.0);
        ensure(delay_ok, "share_delay_ms", "must be a number >= 0")?;
        let fits = c.reset_instances <= c.instances;
        let reset_ok = c
            .reset_every_s
            .is_none_or(|s| s.is_finite() && s > 0.0 && fits);
        let why = "must be a number > 0, resetting at most every instance";
        ensure(reset_ok, "reset_every_s", why)?;
        let rejoin_ok = c.rejoin_every_s.is_none_or(|s| s.is_finite() && s > 0.0);
        ensure(rejoin_ok, "rejoin_every_s", "must be a number > 0")?;
        self.time.validate()?;
        self.policy.validate()?;
        Ok(())
    }
}

/// What one strategy achieved (`scale --json` writes a list of these).
#[derive(Clone, Debug, Serialize)]
pub struct ScaleReport {
    pub strategy: Strategy,
    pub routers: usize,
    pub requests: usize,
    /// Cached prompt tokens / prompt tokens.
    pub hit_rate: f64,
    /// Offline references on the same trace (see [`crate::optimum`]).
    pub optimum: Option<crate::optimum::Optimum>,
    pub ttft_ms: Summary,
    pub e2e_ms: Summary,
    /// Smallest and largest per-instance share of requests, %.
    pub share_min_pct: f64,
    pub share_max_pct: f64,
    /// Routing decisions per second of routing work (hash + match + pick), one core.
    pub decisions_per_s: f64,
    /// Mean routing work per request, µs.
    pub routing_us: f64,
    pub routing_dist_us: Summary,
    pub routing_cost: RoutingCost,
    pub decisions: BTreeMap<String, u64>,
    /// Simulated seconds from first arrival to last completion.
    pub simulated_s: f64,
    /// Completed requests per simulated second.
    pub throughput_rps: f64,
    pub wall_s: f64,
    /// Distinct blocks in the index at the end.
    pub index_blocks: usize,
    /// Requests routed to each instance, in instance order.
    pub served: Vec<u64>,
    /// The same, counting only the second half of the run's requests.
    pub served_late: Vec<u64>,
    /// Fleets of at most 64 instances: where the uncached tokens came from.
    pub diagnosis: Option<Diagnosis>,
}

struct Req {
    doc: u32,
    arrival_us: u64,
    instance: u32,
    router: u16,
    cached_tokens: u32,
    first_token_us: u64,
    predicted_blocks: u64,
    chain: Vec<BlockHash>,
    origin: Origin,
    prefill_start_us: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival(usize),
    PrefillDone(usize),
    DecodeDone(usize),
    Shared(usize),
    /// The `n`-th round of cache resets.
    Reset(usize),
    /// The `n`-th leave and rejoin.
    Rejoin(usize),
}

/// Tokens per block, of each request's question, and of each answer.
const BLOCK: usize = 16;
const QUESTION_TOKENS: usize = 50;
const OUTPUT_TOKENS: u32 = 32;

/// Segment keys: documents by id, request tails by request number.
const TAIL_KEY: u64 = 1 << 63;

/// Runs `config` with `strategy`; `progress` is called with the number of
/// completed requests every 10,000 completions.
pub fn run(
    config: &ScaleConfig,
    strategy: Strategy,
    progress: &mut dyn FnMut(usize),
) -> Result<ScaleReport, BenchError> {
    config.validate()?;
    let wall = Instant::now();
    let mut sim = Sim::new(config, strategy)?;
    sim.schedule(0, Event::Arrival(0));
    if let Some(s) = config.reset_every_s {
        sim.schedule(us(s * 1000.0), Event::Reset(0));
    }
    if let Some(s) = config.rejoin_every_s {
        sim.schedule(us(s * 1000.0), Event::Rejoin(0));
    }
    while let Some(Reverse((at, _, ev))) = sim.heap.pop() {
        sim.now = at;
        match ev {
            Event::Arrival(r) => sim.arrive(r)?,
            Event::PrefillDone(r) => sim.prefill_done(r)?,
            Event::Shared(f) => sim.routers.deliver(f),
            Event::Reset(n) => sim.reset(n)?,
            Event::Rejoin(n) => sim.rejoin(n)?,
            Event::DecodeDone(r) => {
                sim.decode_done(r);
                if sim.e2e.len() % 10_000 == 0 {
                    progress(sim.e2e.len());
                }
            }
        }
    }
    progress(sim.e2e.len());
    Ok(sim.report(wall.elapsed().as_secs_f64()))
}

struct Sim<'a> {
    cfg: &'a ScaleConfig,
    strategy: Strategy,
    /// The member list, in instance order.
    backends: Vec<PolicyBackend>,
    index: CacheIndex,
    fleet: Vec<Instance>,
    routers: Replicas,
    reqs: Vec<Req>,
    heap: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    now: u64,
    tick: u64,
    rng: SmallRng,
    zipf: Zipf,
    seed: HashSeed,
    tokens: Vec<u32>,
    /// Each request's routing work, µs.
    routing_each: Vec<f64>,
    cost: CostSums,
    ttft: Vec<f64>,
    e2e: Vec<f64>,
    prompt_sum: u64,
    cached_sum: u64,
    /// Per-document state for the diagnosis (empty above 64 instances).
    docs: Vec<DocState>,
    samples: Vec<Sample>,
    /// When each instance last finished a prefill that missed its document.
    last_cold_done_us: Vec<u64>,
}

fn us(ms: f64) -> u64 {
    (ms * 1000.0).round().max(0.0) as u64
}

impl<'a> Sim<'a> {
    fn new(cfg: &'a ScaleConfig, strategy: Strategy) -> Result<Self, BenchError> {
        let n = cfg.instances;
        let index = CacheIndex::with_capacity(n * cfg.cache_blocks / 2);
        let mut backends = Vec::with_capacity(n);
        let mut fleet = Vec::with_capacity(n);
        for i in 0..n {
            let id = format!("w{i}");
            let slot = index.register_worker(&id)?;
            // What an instance holds stays prefix-closed (`fleet` docs).
            index.set_prefix_closed(slot, true)?;
            backends.push(PolicyBackend {
                id,
                slot,
                capacity_blocks: (!cfg.hide_capacity).then_some(cfg.cache_blocks as u64),
            });
            fleet.push(Instance::new(slot, cfg.cache_blocks));
        }
        let policies = (0..cfg.routers)
            .map(|_| build_policy(strategy, &cfg.policy, &backends, None))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Sim {
            cfg,
            strategy,
            backends,
            index,
            fleet,
            routers: Replicas::new(policies, n, cfg.seed, cfg.load_report_ms * 1000),
            reqs: Vec::with_capacity(cfg.requests),
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0,
            tick: 0,
            rng: SmallRng::seed_from_u64(cfg.seed),
            zipf: Zipf::new(cfg.docs, cfg.zipf),
            seed: HashSeed::new("scale-model", "", ""),
            tokens: Vec::with_capacity(cfg.doc_tokens + QUESTION_TOKENS),
            routing_each: Vec::with_capacity(cfg.requests),
            cost: CostSums::default(),
            ttft: Vec::with_capacity(cfg.requests),
            e2e: Vec::with_capacity(cfg.requests),
            prompt_sum: 0,
            cached_sum: 0,
            docs: if n <= 64 {
                vec![DocState::default(); cfg.docs]
            } else {
                Vec::new()
            },
            samples: Vec::new(),
            last_cold_done_us: vec![0; n],
        })
    }

    fn prompt_tokens(&self) -> usize {
        self.cfg.doc_tokens + QUESTION_TOKENS
    }

    /// The sharing delay, when replicas share decisions (never one router).
    fn share_delay_us(&self) -> Option<u64> {
        self.cfg
            .share_delay_ms
            .filter(|_| self.cfg.routers > 1)
            .map(us)
    }

    fn share(&mut self, from: usize, backend: usize, phase: Phase) {
        let Some(delay) = self.share_delay_us() else {
            return;
        };
        let f = self.routers.send(Fact {
            from,
            backend,
            phase,
        });
        self.schedule(self.now + delay, Event::Shared(f));
    }

    fn schedule(&mut self, at: u64, ev: Event) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, ev)));
    }

    /// Synthetic token ids: the document's (distinct per document from the
    /// first token on), then the request's own question.
    fn fill_tokens(&mut self, doc: u32, req: u32) {
        self.tokens.clear();
        let d = u64::from(doc);
        for i in 0..self.cfg.doc_tokens as u64 {
            self.tokens
                .push(((d * 1_000_003 + i * 7_919) % 50_000) as u32 + (doc % 16) * 50_000);
        }
        for j in 0..QUESTION_TOKENS as u32 {
            self.tokens
                .push(req.wrapping_mul(2_654_435_761).wrapping_add(j) | 0x8000_0000);
        }
    }

    fn arrive(&mut self, r: usize) -> Result<(), BenchError> {
        if r + 1 < self.cfg.requests {
            let rate = self.cfg.rate_per_instance * self.cfg.instances as f64;
            let gap = unit_exp(&mut self.rng) / rate;
            self.schedule(self.now + (gap * 1e6) as u64 + 1, Event::Arrival(r + 1));
        }
        let doc = self.zipf.sample(&mut self.rng) as u32;
        // Only kv_aware reads the index: the others skip hashing and its upkeep.
        let kv = self.strategy == Strategy::KvAware;
        if kv {
            self.fill_tokens(doc, r as u32);
        }
        // The agents' load reports reach every replica, outside the routing work.
        let fleet = &self.fleet;
        let capacity = (!self.cfg.hide_capacity).then_some(self.cfg.cache_blocks as u64);
        self.routers
            .report_engines(self.now, |i| fleet[i].in_flight, capacity);
        let t0 = Instant::now();
        let mut chain = Vec::new();
        if kv {
            chain.reserve(self.tokens.len() / BLOCK);
            ChainHasher::new(self.seed, BLOCK).extend(&self.tokens, &mut chain);
        }
        let hashed = t0.elapsed();
        let matches = kv.then(|| self.index.longest_match(&chain));
        let matched = t0.elapsed();
        let chain_blocks = (self.prompt_tokens() / BLOCK) as u32;
        let rr = self.routers.choose();
        let sharing = self.share_delay_us().is_some();
        let view = &mut self.routers.views[rr];
        let input = RouteInput {
            prefix_key: xxh3_64(&doc.to_le_bytes()),
            chain_blocks,
            matches: matches.as_ref(),
            mode: Mode::Commit,
        };
        let d = view.pick(&input, sharing)?;
        let took = t0.elapsed();
        self.routing_each.push(took.as_secs_f64() * 1e6);
        self.cost
            .add(d.kind.as_str(), hashed, matched - hashed, took - matched);
        let i = d.backend;
        let predicted = u64::from(input.chain_blocks.saturating_sub(d.matched_blocks));
        view.start(i, predicted);
        let home = (view.policy.learns.as_ref()).and_then(|l| l.home_of(input.prefix_key));
        let start = Phase::Start(RemoteDecision {
            prefix_key: input.prefix_key,
            backend: i,
            chain_blocks,
            prefill_blocks: u32::try_from(predicted).unwrap_or(u32::MAX),
            home,
        });
        self.share(rr, i, start);
        let inst = &mut self.fleet[i];
        inst.in_flight += 1;
        inst.served += 1;
        if 2 * r >= self.cfg.requests {
            inst.served_late += 1;
        }
        inst.prefill_queue.push_back(r);
        let origin = match self.docs.get_mut(doc as usize) {
            Some(state) => {
                let holders = self
                    .fleet
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| f.holds(u64::from(doc)))
                    .fold(0u64, |acc, (j, _)| acc | 1 << j);
                let origin = state.origin(i, holders);
                state.routed += 1;
                state.pending += 1;
                origin
            }
            None => Origin::FirstSight,
        };
        self.reqs.push(Req {
            doc,
            arrival_us: self.now,
            instance: i as u32,
            router: rr as u16,
            cached_tokens: 0,
            first_token_us: 0,
            predicted_blocks: predicted,
            chain,
            origin,
            prefill_start_us: 0,
        });
        if self.fleet[i].prefilling.is_none() {
            self.start_prefill(i);
        }
        Ok(())
    }

    /// Takes the next request off instance `i`'s prefill queue: looks up its
    /// cached prefix (as vLLM does at scheduling time) and schedules the end.
    fn start_prefill(&mut self, i: usize) {
        let Some(r) = self.fleet[i].prefill_queue.pop_front() else {
            return;
        };
        self.tick += 1;
        let prompt = self.prompt_tokens();
        let doc_blocks = self.cfg.doc_tokens / BLOCK;
        let cap_blocks = (prompt - 1) / BLOCK;
        let doc = self.reqs[r].doc;
        // A document of no full block is never cached: `have` is 0.
        let have = self.fleet[i].touch(u64::from(doc), self.tick);
        let cached = have.min(doc_blocks).min(cap_blocks) * BLOCK;
        self.reqs[r].cached_tokens = cached as u32;
        self.reqs[r].prefill_start_us = self.now;
        self.fleet[i].prefilling = Some(r);
        let t = self.cfg.time.prefill_ms(prompt - cached);
        self.schedule(self.now + us(t), Event::PrefillDone(r));
    }

    /// Round `n` of resets: the next `reset_instances` instances lose their
    /// caches; another round follows while the run goes on.
    fn reset(&mut self, n: usize) -> Result<(), BenchError> {
        let k = self.cfg.reset_instances;
        let index = (self.strategy == Strategy::KvAware).then_some(&self.index);
        for j in 0..k {
            let i = (n * k + j) % self.fleet.len();
            self.fleet[i].clear(index)?;
        }
        if let (false, Some(s)) = (self.heap.is_empty(), self.cfg.reset_every_s) {
            self.schedule(self.now + us(s * 1000.0), Event::Reset(n + 1));
        }
        Ok(())
    }

    /// Round `n` of flaps: instance `n` (mod the fleet) leaves the member list
    /// and rejoins; each router rebuilds its policy over both lists in turn,
    /// carrying it over as the router does on a discovery change.
    fn rejoin(&mut self, n: usize) -> Result<(), BenchError> {
        let (strategy, config) = (self.strategy, &self.cfg.policy);
        let mut without = self.backends.clone();
        without.remove(n % without.len());
        for v in &mut self.routers.views {
            let left = build_policy(strategy, config, &without, Some(&v.policy))?;
            v.rebuilt(build_policy(strategy, config, &self.backends, Some(&left))?);
        }
        if let (false, Some(s)) = (self.heap.is_empty(), self.cfg.rejoin_every_s) {
            self.schedule(self.now + us(s * 1000.0), Event::Rejoin(n + 1));
        }
        Ok(())
    }

    fn prefill_done(&mut self, r: usize) -> Result<(), BenchError> {
        let i = self.reqs[r].instance as usize;
        let chain = std::mem::take(&mut self.reqs[r].chain);
        let total_blocks = self.prompt_tokens() / BLOCK;
        let doc_blocks = (self.cfg.doc_tokens / BLOCK).min(total_blocks);
        let index = (self.strategy == Strategy::KvAware).then_some(&self.index);
        let (doc_hashes, tail_hashes) = chain.split_at(doc_blocks.min(chain.len()));
        self.tick += 1;
        let doc_key = u64::from(self.reqs[r].doc);
        self.fleet[i].insert(doc_key, doc_hashes, doc_blocks, self.tick, None, index)?;
        self.fleet[i].insert(
            TAIL_KEY | r as u64,
            tail_hashes,
            total_blocks - doc_blocks,
            self.tick,
            (doc_blocks > 0).then_some((doc_key, doc_blocks)),
            index,
        )?;
        let prompt = self.prompt_tokens() as u64;
        let req = &mut self.reqs[r];
        req.first_token_us = self.now;
        self.prompt_sum += prompt;
        self.cached_sum += u64::from(req.cached_tokens);
        self.ttft.push((self.now - req.arrival_us) as f64 / 1000.0);
        let predicted = req.predicted_blocks;
        let hit = req.cached_tokens > 0;
        if let Some(state) = self.docs.get_mut(req.doc as usize) {
            state.pending = state.pending.saturating_sub(1);
            state.ever |= 1 << i;
            self.samples.push(Sample {
                origin: req.origin,
                hit,
                uncached_tokens: prompt - u64::from(req.cached_tokens),
                tail_tokens: prompt
                    - (doc_blocks.min((prompt as usize - 1) / BLOCK) * BLOCK) as u64,
                ttft_ms: (self.now - req.arrival_us) as f64 / 1000.0,
                wait_ms: (req.prefill_start_us - req.arrival_us) as f64 / 1000.0,
                behind_cold: self.last_cold_done_us[i] > req.arrival_us,
            });
            if !hit {
                self.last_cold_done_us[i] = self.now;
            }
        }
        let rr = self.reqs[r].router as usize;
        self.routers.views[rr].prefilled(i, predicted);
        self.share(rr, i, Phase::Prefilled(predicted));
        self.fleet[i].prefilling = None;
        if self.fleet[i].decoding < self.cfg.time.max_batch {
            self.start_decode(r);
        } else {
            self.fleet[i].decode_wait.push_back(r);
        }
        self.start_prefill(i);
        Ok(())
    }

    fn start_decode(&mut self, r: usize) {
        let i = self.reqs[r].instance as usize;
        self.fleet[i].decoding += 1;
        let t = self.cfg.time.decode_ms(OUTPUT_TOKENS);
        self.schedule(self.now + us(t), Event::DecodeDone(r));
    }

    fn decode_done(&mut self, r: usize) {
        let i = self.reqs[r].instance as usize;
        let inst = &mut self.fleet[i];
        inst.decoding -= 1;
        inst.in_flight -= 1;
        let rr = self.reqs[r].router as usize;
        self.routers.views[rr].finished(i);
        self.share(rr, i, Phase::Finished);
        self.e2e
            .push((self.now - self.reqs[r].arrival_us) as f64 / 1000.0);
        if let Some(next) = self.fleet[i].decode_wait.pop_front() {
            self.start_decode(next);
        }
    }

    /// The documents in arrival order, in flight until their last token.
    fn optimum(&self) -> Option<crate::optimum::Optimum> {
        let c = self.cfg;
        let decode_us = us(c.time.decode_ms(OUTPUT_TOKENS)) as f64;
        let docs = self.reqs.iter().map(|r| {
            let done = (r.first_token_us as f64 + decode_us) / 1e6;
            (r.arrival_us as f64 / 1e6, done, u64::from(r.doc))
        });
        let fleet = crate::optimum::Fleet {
            backends: c.instances,
            cache_blocks: c.cache_blocks as u64,
            block_size: BLOCK as u64,
            max_in_flight: c.time.max_batch as usize,
        };
        let doc_blocks = u32::try_from(c.doc_tokens / BLOCK).unwrap_or(u32::MAX);
        crate::optimum::of_documents(docs, doc_blocks, self.prompt_tokens() as u64, fleet)
    }

    fn report(&self, wall_s: f64) -> ScaleReport {
        let served: Vec<u64> = self.fleet.iter().map(|f| f.served).collect();
        let (share_min_pct, share_max_pct) = share_min_max(&served);
        let requests = self.e2e.len();
        let routing_s = self.routing_each.iter().sum::<f64>() / 1e6;
        let routing_cost = self.cost.report();
        let simulated_s = self.now as f64 / 1e6;
        ScaleReport {
            strategy: self.strategy,
            routers: self.cfg.routers,
            requests,
            hit_rate: ratio(self.cached_sum as f64, self.prompt_sum as f64),
            optimum: self.optimum(),
            ttft_ms: Summary::of(&self.ttft),
            e2e_ms: Summary::of(&self.e2e),
            share_min_pct,
            share_max_pct,
            decisions_per_s: ratio(requests as f64, routing_s),
            routing_us: ratio(routing_s * 1e6, requests as f64),
            routing_dist_us: Summary::of(&self.routing_each),
            decisions: (routing_cost.by_kind.iter())
                .map(|(k, c)| (k.clone(), c.decisions))
                .collect(),
            routing_cost,
            simulated_s,
            throughput_rps: ratio(requests as f64, simulated_s),
            wall_s,
            index_blocks: self.index.distinct_blocks(),
            served,
            served_late: self.fleet.iter().map(|f| f.served_late).collect(),
            diagnosis: (!self.docs.is_empty())
                .then(|| Diagnosis::of(&self.samples, self.prompt_sum)),
        }
    }
}

#[cfg(test)]
mod tests;
