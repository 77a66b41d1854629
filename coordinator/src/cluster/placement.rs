//! Placement: which worker runs which expert.
//!
//! Inputs: what each connected worker holds on its disk, its RAM cache, its
//! measured read bandwidth and compute speed ([`Candidate`], from its
//! `Hello`), and the routing heat the coordinator has measured (rows routed
//! to each expert so far).
//!
//! 1. Each expert's routing probability per token is estimated from heat
//!    with add-one smoothing (uniform before anything is measured):
//!    `p = top_k · (rows(e) + 1) / Σ_layer (rows + 1)`.
//! 2. Experts are placed hottest first (longest-processing-time greedy) on
//!    the holder whose expected busy time per token grows least: compute
//!    `p / rows_per_s`, plus `p · bytes / disk_bandwidth` when the expert no
//!    longer fits in that worker's cache. The previous owner keeps an expert
//!    unless another holder would be over 10 % less loaded, so a re-plan
//!    moves little.
//! 3. Replicas: while some other holder has cache to spare, the hottest
//!    experts get a second copy there. A replica is the first place an
//!    expert is re-sent when its owner fails (it is not warmed ahead).
//! 4. Every expert ends with a preference list: owner, replica, the other
//!    holders (least loaded first), then the coordinator's in-process
//!    worker when it has the files. An expert no one holds is `uncovered`.
//! 5. Expected cost of a decode token: a worker is involved in a layer when
//!    any of the token's `top_k` choices is one of its experts (choices
//!    taken as independent draws from the heat); its request and reply
//!    sizes are measured by encoding one-row messages.
//!
//! Placement decides speed only: every holder computes an expert with the
//! same code, and the coordinator combines outputs in a fixed order.

use std::collections::HashMap;
use std::net::SocketAddr;

use charm_proto::frame::encode;
use charm_proto::{ExpertBatch, ExpertGroup, ExpertOutputs, ExpertsOut, GroupOutput, Holdings, Message, RunExperts};
use serde::Serialize;

/// `(layer, expert)`.
pub type Key = (u16, u32);

/// Advantage of an expert's previous owner when re-planning: it keeps the
/// expert unless another holder would be more than this share less loaded.
const STICKY: f64 = 0.1;

/// The model as placement sees it.
#[derive(Clone, Debug)]
pub struct ModelShape {
    pub num_layers: usize,
    /// Layers with routed experts.
    pub moe_layers: Vec<u16>,
    pub num_experts: u32,
    pub top_k: usize,
    pub hidden: u32,
}

/// A connected worker, as its `Hello` described it.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub address: SocketAddr,
    pub holdings: Holdings,
    pub expert_bytes: u64,
    pub cache_bytes: u64,
    pub disk_bytes_per_s: f64,
    pub expert_rows_per_s: f64,
}

/// Who can run an expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Holder {
    Worker(SocketAddr),
    /// The coordinator's own in-process worker.
    Local,
}

/// What one worker was given.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct WorkerPlan {
    pub address: String,
    /// Experts it holds on disk.
    pub holds: u64,
    /// Experts it owns (runs unless it fails).
    pub owns: u64,
    /// Replicas it keeps for others.
    pub replicas: u64,
    /// Bytes of owned experts that fit its cache / that do not.
    pub cached_bytes: u64,
    pub uncached_bytes: u64,
    /// Expected busy time per token (compute and reads), in ms.
    pub expected_ms_per_token: f64,
    /// Expected requests it gets per token.
    pub requests_per_token: f64,
}

/// Expected network cost of one decode token (one row per step).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PerToken {
    /// Layer steps that wait on the network.
    pub round_trips: f64,
    /// Requests sent (all of a layer's requests go out together).
    pub requests: f64,
    pub bytes_sent: f64,
    pub bytes_received: f64,
}

/// A placement.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    holders: HashMap<Key, Vec<Holder>>,
    /// How many of an expert's first holders keep it cached (its owner and
    /// its replica): a step may hand the expert to any of them.
    warm: HashMap<Key, usize>,
    pub workers: Vec<WorkerPlan>,
    /// Experts no worker holds (run by the coordinator when it can).
    pub uncovered: Vec<Key>,
    pub per_token: PerToken,
}

impl Plan {
    /// Everyone who can run `key`, best first.
    pub fn holders(&self, key: Key) -> &[Holder] {
        self.holders.get(&key).map_or(&[], Vec::as_slice)
    }

    /// The owner of `key`, if anyone can run it.
    pub fn owner(&self, key: Key) -> Option<Holder> {
        self.holders(key).first().copied()
    }

    /// Every placed expert with its owner (in no particular order).
    pub fn owners(&self) -> impl Iterator<Item = (Key, Holder)> + '_ {
        self.holders.iter().filter_map(|(k, hs)| hs.first().map(|h| (*k, *h)))
    }

    /// The holders that keep `key` cached (owner, then replica), best first.
    pub fn warm_holders(&self, key: Key) -> &[Holder] {
        let hs = self.holders(key);
        &hs[..self.warm.get(&key).copied().unwrap_or(0).min(hs.len())]
    }
}

/// Computes a placement. `heat[layer][expert]` counts rows routed so far
/// (missing entries count as 0); `local` says whether the coordinator can
/// run experts itself; `previous` keeps owners stable on ties.
pub fn plan(
    shape: &ModelShape,
    workers: &[Candidate],
    heat: &[Vec<u64>],
    local: bool,
    previous: Option<&Plan>,
) -> Plan {
    let mut experts: Vec<(f64, Key)> = Vec::new();
    for &l in &shape.moe_layers {
        let row = heat.get(l as usize);
        let count = |e: u32| row.and_then(|r| r.get(e as usize)).copied().unwrap_or(0) as f64 + 1.0;
        let total: f64 = (0..shape.num_experts).map(count).sum();
        for e in 0..shape.num_experts {
            let p = (shape.top_k as f64 * count(e) / total).min(1.0);
            experts.push((p, (l, e)));
        }
    }
    // Hottest first; ties in (layer, expert) order.
    experts.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));

    let n = workers.len();
    let mut load = vec![0.0f64; n];
    let mut cached = vec![0u64; n];
    let mut uncached = vec![0u64; n];
    let mut owns = vec![0u64; n];
    let mut replicas = vec![0u64; n];
    let mut owner: HashMap<Key, usize> = HashMap::new();
    let mut uncovered = Vec::new();
    let cost = |w: usize, p: f64, fits: bool| {
        let c = &workers[w];
        let compute = p / c.expert_rows_per_s.max(1e-9);
        let read = if fits {
            0.0
        } else {
            p * c.expert_bytes as f64 / c.disk_bytes_per_s.max(1e-9)
        };
        compute + read
    };
    for &(p, key) in &experts {
        let prev = previous.and_then(|pl| pl.owner(key));
        // (effective cost, load after, worker): the previous owner's cost
        // counts STICKY less, so a re-plan moves an expert (and loses its
        // cached copy) only for a clear gain; ties go to the first worker.
        let mut best: Option<(f64, f64, usize)> = None;
        for w in 0..n {
            if !workers[w].holdings.contains(key.0, key.1) {
                continue;
            }
            let fits = cached[w] + workers[w].expert_bytes <= workers[w].cache_bytes;
            let after = load[w] + cost(w, p, fits);
            let sticky = prev == Some(Holder::Worker(workers[w].address));
            let effective = if sticky { after * (1.0 - STICKY) } else { after };
            if best.is_none_or(|(b, _, _)| effective < b) {
                best = Some((effective, after, w));
            }
        }
        let Some((_, after, w)) = best else {
            uncovered.push(key);
            continue;
        };
        let fits = cached[w] + workers[w].expert_bytes <= workers[w].cache_bytes;
        if fits {
            cached[w] += workers[w].expert_bytes;
        } else {
            uncached[w] += workers[w].expert_bytes;
        }
        load[w] = after;
        owns[w] += 1;
        owner.insert(key, w);
    }

    // Replicas where another holder has cache to spare, hottest first.
    let mut replica: HashMap<Key, usize> = HashMap::new();
    for &(_, key) in &experts {
        let Some(&o) = owner.get(&key) else { continue };
        let spare = |w: usize| workers[w].cache_bytes.saturating_sub(cached[w]);
        let pick = (0..n)
            .filter(|&w| w != o && workers[w].holdings.contains(key.0, key.1))
            .filter(|&w| spare(w) >= workers[w].expert_bytes)
            .max_by(|&a, &b| spare(a).cmp(&spare(b)).then(b.cmp(&a)));
        if let Some(w) = pick {
            cached[w] += workers[w].expert_bytes;
            replicas[w] += 1;
            replica.insert(key, w);
        }
    }

    let mut holders: HashMap<Key, Vec<Holder>> = HashMap::new();
    let mut warm: HashMap<Key, usize> = HashMap::new();
    for &(_, key) in &experts {
        let mut list = Vec::new();
        if let Some(&o) = owner.get(&key) {
            list.push(o);
        }
        if let Some(&r) = replica.get(&key) {
            list.push(r);
        }
        warm.insert(key, list.len());
        let mut others: Vec<usize> = (0..n)
            .filter(|w| !list.contains(w) && workers[*w].holdings.contains(key.0, key.1))
            .collect();
        others.sort_by(|a, b| load[*a].total_cmp(&load[*b]).then(a.cmp(b)));
        list.extend(others);
        let mut hs: Vec<Holder> = list.into_iter().map(|w| Holder::Worker(workers[w].address)).collect();
        if local {
            hs.push(Holder::Local);
        }
        if !hs.is_empty() {
            holders.insert(key, hs);
        }
    }

    // Expected network cost per decode token, from the owners.
    let sizes = MessageSizes::new(shape.hidden);
    let p_of: HashMap<Key, f64> = experts.iter().map(|&(p, k)| (k, p)).collect();
    let mut per_token = PerToken::default();
    let mut requests = vec![0.0f64; n];
    let k = shape.top_k.max(1) as i32;
    for &l in &shape.moe_layers {
        // A worker is involved when any of the token's k choices is one of
        // its experts (the k choices taken as independent draws).
        let mut remote_mass = 0.0;
        for (w, req) in requests.iter_mut().enumerate() {
            let groups: f64 = (0..shape.num_experts)
                .filter(|&e| owner.get(&(l, e)) == Some(&w))
                .map(|e| p_of[&(l, e)])
                .sum();
            let mass = (groups / k as f64).min(1.0);
            remote_mass += mass;
            let q = 1.0 - (1.0 - mass).powi(k);
            *req += q;
            per_token.requests += q;
            per_token.bytes_sent += q * sizes.request_base + groups * sizes.request_per_group;
            per_token.bytes_received += q * sizes.reply_base + groups * sizes.reply_per_group;
        }
        per_token.round_trips += 1.0 - (1.0 - remote_mass.min(1.0)).powi(k);
    }

    Plan {
        holders,
        warm,
        workers: (0..n)
            .map(|w| WorkerPlan {
                address: workers[w].address.to_string(),
                holds: workers[w].holdings.count(),
                owns: owns[w],
                replicas: replicas[w],
                cached_bytes: cached[w] - replicas[w] * workers[w].expert_bytes,
                uncached_bytes: uncached[w],
                expected_ms_per_token: load[w] * 1e3,
                requests_per_token: requests[w],
            })
            .collect(),
        uncovered,
        per_token,
    }
}

/// Frame sizes of one-row requests and replies, measured by encoding them.
struct MessageSizes {
    request_base: f64,
    request_per_group: f64,
    reply_base: f64,
    reply_per_group: f64,
}

impl MessageSizes {
    fn new(hidden: u32) -> MessageSizes {
        let h = hidden as usize;
        let request = |groups: u32| {
            Message::RunExperts(RunExperts {
                step: 1 << 20,
                batch: ExpertBatch {
                    layer: 1,
                    hidden,
                    rows: vec![0.5; h],
                    groups: (0..groups)
                        .map(|e| ExpertGroup {
                            expert: e,
                            rows: vec![0],
                            weights: vec![0.25],
                        })
                        .collect(),
                    next: None,
                },
            })
        };
        let reply = |groups: u32| {
            Message::ExpertsOut(ExpertsOut {
                step: 1 << 20,
                outputs: ExpertOutputs {
                    layer: 1,
                    groups: (0..groups)
                        .map(|e| GroupOutput {
                            expert: e,
                            out: vec![0.5; h],
                        })
                        .collect(),
                },
                worker_ms: 1.0,
            })
        };
        let len = |m: Message| encode(&m).map_or(0.0, |b| b.len() as f64);
        let (r1, r2) = (len(request(1)), len(request(2)));
        let (o1, o2) = (len(reply(1)), len(reply(2)));
        MessageSizes {
            request_base: 2.0 * r1 - r2,
            request_per_group: r2 - r1,
            reply_base: 2.0 * o1 - o2,
            reply_per_group: o2 - o1,
        }
    }
}

/// `coordinator plan` as text: one line per worker, then the per-token cost.
pub fn render(plan: &Plan, shape: &ModelShape) -> String {
    let mut s = String::new();
    let total = shape.moe_layers.len() as u64 * shape.num_experts as u64;
    s.push_str(&format!(
        "{} MoE layers × {} experts (top-{}), {} workers\n",
        shape.moe_layers.len(),
        shape.num_experts,
        shape.top_k,
        plan.workers.len()
    ));
    s.push_str(&format!(
        "{:<22} {:>6} {:>6} {:>8} {:>12} {:>12} {:>10} {:>10}\n",
        "worker", "holds", "owns", "replicas", "cached MiB", "uncached MiB", "ms/token", "req/token"
    ));
    for w in &plan.workers {
        s.push_str(&format!(
            "{:<22} {:>6} {:>6} {:>8} {:>12.1} {:>12.1} {:>10.3} {:>10.2}\n",
            w.address,
            w.holds,
            w.owns,
            w.replicas,
            w.cached_bytes as f64 / (1 << 20) as f64,
            w.uncached_bytes as f64 / (1 << 20) as f64,
            w.expected_ms_per_token,
            w.requests_per_token
        ));
    }
    let placed: u64 = plan.workers.iter().map(|w| w.owns).sum();
    s.push_str(&format!("{placed} of {total} experts placed on workers"));
    if !plan.uncovered.is_empty() {
        s.push_str(&format!(
            "; {} held by no worker (the coordinator runs them when it has the files): {}",
            plan.uncovered.len(),
            plan.uncovered
                .iter()
                .take(8)
                .map(|(l, e)| format!("{l}/{e}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let t = &plan.per_token;
    s.push_str(&format!(
        "\nper decode token (expected from routing heat): {:.2} round trips, {:.2} requests, {:.0} bytes sent, {:.0} bytes received\n",
        t.round_trips, t.requests, t.bytes_sent, t.bytes_received
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> ModelShape {
        ModelShape {
            num_layers: 2,
            moe_layers: vec![0, 1],
            num_experts: 8,
            top_k: 2,
            hidden: 64,
        }
    }

    fn worker(port: u16, experts: impl IntoIterator<Item = (u16, u32)>, cache: u64, speed: f64) -> Candidate {
        Candidate {
            address: SocketAddr::from(([127, 0, 0, 1], port)),
            holdings: Holdings::from_experts(experts),
            expert_bytes: 100,
            cache_bytes: cache,
            disk_bytes_per_s: 1e9,
            expert_rows_per_s: speed,
        }
    }

    fn all() -> Vec<(u16, u32)> {
        (0..2u16).flat_map(|l| (0..8u32).map(move |e| (l, e))).collect()
    }

    fn owners(p: &Plan) -> HashMap<Key, Holder> {
        all().into_iter().filter_map(|k| p.owner(k).map(|o| (k, o))).collect()
    }

    #[test]
    fn equal_workers_split_evenly_and_every_expert_has_an_owner() {
        let ws = vec![
            worker(1, all(), 0, 1e4),
            worker(2, all(), 0, 1e4),
            worker(3, all(), 0, 1e4),
        ];
        let p = plan(&shape(), &ws, &[], false, None);
        assert_eq!(owners(&p).len(), 16);
        let owns: Vec<u64> = p.workers.iter().map(|w| w.owns).collect();
        assert_eq!(owns.iter().sum::<u64>(), 16);
        assert!(owns.iter().max().unwrap() - owns.iter().min().unwrap() <= 1, "{owns:?}");
        assert!(p.uncovered.is_empty());
        // Every holder is listed, the owner first, and no local fallback.
        for k in all() {
            assert_eq!(p.holders(k).len(), 3);
            assert!(!p.holders(k).contains(&Holder::Local));
        }
        // Two MoE layers, each all remote: two round trips per token.
        assert!((p.per_token.round_trips - 2.0).abs() < 1e-9, "{:?}", p.per_token);
        assert!(p.per_token.bytes_sent > 0.0 && p.per_token.bytes_received > p.per_token.bytes_sent * 0.5);
    }

    #[test]
    fn partial_holdings_are_respected() {
        let low: Vec<_> = all().into_iter().filter(|k| k.1 < 4).collect();
        let high: Vec<_> = all().into_iter().filter(|k| k.1 >= 4).collect();
        let a = worker(1, low, 0, 1e4);
        let b = worker(2, high, 0, 1e4);
        let p = plan(&shape(), &[a.clone(), b.clone()], &[], true, None);
        for (k, o) in owners(&p) {
            let expected = if k.1 < 4 { a.address } else { b.address };
            assert_eq!(o, Holder::Worker(expected), "{k:?}");
            assert_eq!(p.holders(k), &[Holder::Worker(expected), Holder::Local]);
        }
        // Without b, its experts are uncovered: local only, or nobody.
        let p = plan(&shape(), std::slice::from_ref(&a), &[], true, None);
        assert_eq!(p.uncovered.len(), 8);
        assert_eq!(p.holders((1, 6)), &[Holder::Local]);
        let p = plan(&shape(), &[a], &[], false, None);
        assert!(p.holders((1, 6)).is_empty());
        assert_eq!(p.owner((1, 6)), None);
    }

    #[test]
    fn a_faster_worker_gets_more_and_heat_is_spread() {
        let p = plan(
            &shape(),
            &[worker(1, all(), 0, 3e4), worker(2, all(), 0, 1e4)],
            &[],
            false,
            None,
        );
        assert!(p.workers[0].owns >= 2 * p.workers[1].owns, "{:?}", p.workers);
        // Two very hot experts of layer 0 go to different workers.
        let mut heat = vec![vec![0u64; 8]; 2];
        heat[0][3] = 1000;
        heat[0][5] = 1000;
        let p = plan(
            &shape(),
            &[worker(1, all(), 0, 1e4), worker(2, all(), 0, 1e4)],
            &heat,
            false,
            None,
        );
        assert_ne!(p.owner((0, 3)), p.owner((0, 5)));
    }

    #[test]
    fn replicas_only_where_cache_allows_and_ties_keep_owners() {
        let ws = vec![worker(1, all(), 10_000, 1e4), worker(2, all(), 10_000, 1e4)];
        let p = plan(&shape(), &ws, &[], false, None);
        let reps: u64 = p.workers.iter().map(|w| w.replicas).sum();
        assert_eq!(reps, 16, "room for a second copy of everything");
        for k in all() {
            assert_eq!(p.holders(k).len(), 2);
            assert_ne!(p.holders(k)[0], p.holders(k)[1]);
        }
        let tight = vec![worker(1, all(), 800, 1e4), worker(2, all(), 800, 1e4)];
        let p = plan(&shape(), &tight, &[], false, None);
        assert_eq!(p.workers.iter().map(|w| w.replicas).sum::<u64>(), 0);
        assert_eq!(p.workers.iter().map(|w| w.cached_bytes).sum::<u64>(), 1600);
        assert_eq!(p.workers.iter().map(|w| w.uncached_bytes).sum::<u64>(), 0);
        // Re-planning with the same inputs keeps every owner; so does a
        // little measured heat (no expert gets over 10 % cheaper elsewhere).
        let again = plan(&shape(), &tight, &[], false, Some(&p));
        assert_eq!(owners(&again), owners(&p));
        let mut heat = vec![vec![0u64; 8]; 2];
        heat[0][2] = 1;
        heat[1][7] = 1;
        let warm = plan(&shape(), &tight, &heat, false, Some(&p));
        assert_eq!(owners(&warm), owners(&p));
        // Without the previous plan the same heat may place differently.
        let fresh = plan(&shape(), &tight, &heat, false, None);
        assert_eq!(owners(&fresh).len(), 16);
    }

    #[test]
    fn render_names_every_worker_and_the_per_token_cost() {
        let p = plan(&shape(), &[worker(1, all(), 0, 1e4)], &[], true, None);
        let text = render(&p, &shape());
        assert!(text.contains("127.0.0.1:1"), "{text}");
        assert!(text.contains("16 of 16 experts placed"), "{text}");
        assert!(text.contains("2.00 round trips"), "{text}");
    }
}
