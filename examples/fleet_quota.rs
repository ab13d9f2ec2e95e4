//! Three nodes, one tenant's quota, one Redis: fleet-wide admission with
//! local decisions.
//!
//! ```text
//! cargo run --release --example fleet_quota --features redis [-- --quick]
//! ```
//!
//! Starts a `redis-server` of its own on a free loopback port (or uses
//! `ADMISSION_REDIS_URL`, and then skips the outage, which needs a server
//! it may kill), and three node processes (this binary again), each with a
//! `Quota` on that Redis and a CPU queue. Tenant 1 has a quota of 1,000
//! requests a second fleet-wide and asks for 3x that, split 70/20/10
//! across the nodes, open-loop, each request with a 50 ms deadline. Phases:
//! steady; Redis killed for 5 s and started again (empty); node 0 killed
//! (SIGKILL: its lease dies with it) and its demand moved to the other two,
//! as a balancer would. Every node reports every 100 ms; the parent prints
//! the fleet-wide admitted rate against the quota per phase, each node's
//! share against its demand's, the time from Redis' return to the fleet
//! being within 5% of the quota, the excess over the quota after the node
//! died against that node's lease, and, in the same run, admission's p99 on
//! each node for a tenant whose node holds a lease (tenant 2: a quota far
//! above its demand) beside a tenant admitted through a local token bucket
//! (tenant 3: a `WorkQueue::tokens` refilled on the node), both then through
//! the same CPU queue.
//!
//! `--quick` runs shorter phases; `cargo test --example fleet_quota
//! --features redis` runs it so and checks only directions (admitted below
//! demand and near the quota, shares in demand order, the outage bounded
//! by quota and trickle), never a timing.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use admission::quota::{Quota, RedisBackend, TenantQuota};
use admission::{Priority, TenantId, WorkInfo, WorkQueue};
use hdrhistogram::Histogram;

#[path = "../tests/common/redis_server.rs"]
mod redis_server;

/// The tenant under test, the one whose node holds a lease, and the one on
/// a local token bucket.
const QUOTA_TENANT: TenantId = TenantId::new(1);
const LEASED_TENANT: TenantId = TenantId::new(2);
const LOCAL_TENANT: TenantId = TenantId::new(3);

const QUOTA: u64 = 1_000;
const BURST: u64 = 200;
const NODES: usize = 3;
const SPLIT: [f64; NODES] = [0.7, 0.2, 0.1];
const DEMAND: f64 = 3.0 * QUOTA as f64;
/// Requests a second of tenants 2 and 3 on each node.
const PROBE_RATE: u64 = 500;
const TICK: Duration = Duration::from_millis(100);
/// The environment variable that makes this binary a node.
const CHILD: &str = "FLEET_QUOTA_NODE";

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        node_main(&spec);
        return;
    }
    let quick = std::env::args().any(|arg| arg == "--quick");
    let phases = if quick { Phases::QUICK } else { Phases::FULL };
    match run(phases, &[]) {
        Some(report) => report.print(),
        None => println!("fleet_quota: no Redis to run against; nothing measured"),
    }
}

/// How long each phase lasts.
#[derive(Clone, Copy, Debug)]
struct Phases {
    warmup: Duration,
    steady: Duration,
    outage: Duration,
    recovery: Duration,
    after_kill: Duration,
}

impl Phases {
    const FULL: Phases = Phases {
        warmup: Duration::from_secs(2),
        steady: Duration::from_secs(10),
        outage: Duration::from_secs(5),
        recovery: Duration::from_secs(5),
        after_kill: Duration::from_secs(8),
    };
    const QUICK: Phases = Phases {
        warmup: Duration::from_secs(1),
        steady: Duration::from_secs(2),
        outage: Duration::from_secs(2),
        recovery: Duration::from_secs(2),
        after_kill: Duration::from_secs(2),
    };
}

/// One node's report of one tick.
#[derive(Clone, Copy, Debug, Default)]
struct Tick {
    admitted: u64,
    refused: u64,
    degraded: bool,
    balance: i64,
}

/// What the run measured.
#[derive(Debug)]
struct Report {
    phases: Phases,
    /// Per 100 ms bin since the start: admitted of tenant 1 per node.
    bins: Vec<[Tick; NODES]>,
    outage: Option<(usize, usize)>,
    steady: (usize, usize),
    recovery: (usize, usize),
    kill: (usize, usize),
    /// Node 0's balance in its last report before it died.
    dead_lease: i64,
    /// Per surviving node: p99 of admission (µs) for the leased tenant and
    /// the local token bucket, and how many of each.
    latency: Vec<(f64, f64, u64, u64)>,
}

impl Report {
    fn admitted(&self, (from, to): (usize, usize)) -> [u64; NODES] {
        let mut sums = [0; NODES];
        for bin in &self.bins[from.min(self.bins.len())..to.min(self.bins.len())] {
            for (sum, tick) in sums.iter_mut().zip(bin) {
                *sum += tick.admitted;
            }
        }
        sums
    }

    /// The fleet's admitted rate of tenant 1 over bins `range`, a second.
    fn rate(&self, range: (usize, usize)) -> f64 {
        let seconds = (range.1.saturating_sub(range.0)) as f64 * TICK.as_secs_f64();
        self.admitted(range).iter().sum::<u64>() as f64 / seconds.max(f64::EPSILON)
    }

    /// Seconds from the recovery's start until the rate over the trailing
    /// half second is within 5% of the quota.
    fn recovery_time(&self) -> Option<f64> {
        let (from, to) = self.recovery;
        (from + 5..=to).find_map(|end| {
            let rate = self.rate((end - 5, end));
            ((rate - QUOTA as f64).abs() <= 0.05 * QUOTA as f64)
                .then(|| (end - from) as f64 * TICK.as_secs_f64())
        })
    }

    /// How many nodes said they were degraded during bins `range`.
    fn degraded_nodes(&self, (from, to): (usize, usize)) -> usize {
        (0..NODES)
            .filter(|&node| {
                self.bins[from.min(self.bins.len())..to.min(self.bins.len())]
                    .iter()
                    .any(|bin| bin[node].degraded)
            })
            .count()
    }

    /// The most any one-second window after the kill admitted beyond the
    /// quota, in units.
    fn excess_after_kill(&self) -> f64 {
        let (from, to) = self.kill;
        (from + 10..=to)
            .map(|end| self.rate((end - 10, end)) - QUOTA as f64)
            .fold(f64::MIN, f64::max)
    }

    fn print(&self) {
        let steady = self.admitted(self.steady);
        let total: u64 = steady.iter().sum();
        println!("fleet_quota: 3 nodes, tenant 1 quota {QUOTA}/s (burst {BURST}), demand {DEMAND}/s split 70/20/10, 50 ms deadlines");
        println!();
        println!("| phase | fleet admitted /s | vs quota |");
        println!("|---|---|---|");
        let row = |name: &str, range: (usize, usize)| {
            let rate = self.rate(range);
            println!(
                "| {name} | {rate:.0} | {:+.1}% |",
                (rate / QUOTA as f64 - 1.0) * 100.0
            );
        };
        row(&format!("steady ({:?})", self.phases.steady), self.steady);
        if let Some(outage) = self.outage {
            row(
                &format!(
                    "Redis down ({:?}); bound quota + trickle = {}",
                    self.phases.outage,
                    2 * QUOTA
                ),
                outage,
            );
        }
        row(
            &format!("Redis back ({:?})", self.phases.recovery),
            self.recovery,
        );
        row(
            &format!("node 0 killed ({:?})", self.phases.after_kill),
            self.kill,
        );
        println!();
        println!("| node | demand share | admitted share (steady) |");
        println!("|---|---|---|");
        for (node, admitted) in steady.iter().enumerate() {
            println!(
                "| {node} | {:.0}% | {:.1}% |",
                SPLIT[node] * 100.0,
                *admitted as f64 / total.max(1) as f64 * 100.0
            );
        }
        println!();
        if let Some(outage) = self.outage {
            println!(
                "nodes that reported degraded during the outage: {} of {NODES}",
                self.degraded_nodes(outage)
            );
        }
        match (self.outage, self.recovery_time()) {
            (None, _) => println!("recovery: no outage in this run (ADMISSION_REDIS_URL)"),
            (Some(_), Some(seconds)) => println!(
                "recovery: the fleet's rate over the trailing 0.5 s was within 5% of the quota \
                 {seconds:.1} s after Redis returned (0.5 s is the first such window)"
            ),
            (Some(_), None) => println!("recovery: not within 5% of the quota during the phase"),
        }
        println!(
            "after the kill: at most {:+.0} units over the quota in any 1 s window; node 0 held {} when it died",
            self.excess_after_kill(),
            self.dead_lease
        );
        println!();
        println!("| node | p99 admission, lease held (us) | p99, local token bucket (us) | ratio | requests |");
        println!("|---|---|---|---|---|");
        for (node, (leased, local, n_leased, n_local)) in self.latency.iter().enumerate() {
            println!(
                "| {} | {leased:.1} | {local:.1} | {:.2} | {n_leased} / {n_local} |",
                node + 1,
                leased / local.max(f64::EPSILON)
            );
        }
    }
}

/// A node process and its reports.
struct NodeProcess {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl NodeProcess {
    fn set_demand(&mut self, demand: f64) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "demand {demand}");
        }
    }
}

/// The command that runs this program as a node: the example binary
/// itself, or, under `cargo test`, the test binary running only the test
/// that turns into a node when it sees [`CHILD`].
fn node_command(test_args: &[&str]) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("this binary"));
    command.args(test_args);
    command
}

/// Runs the fleet; `None` when there is no Redis to run against.
fn run(phases: Phases, test_args: &[&str]) -> Option<Report> {
    let mut own_server = None;
    let url = match std::env::var("ADMISSION_REDIS_URL") {
        Ok(url) => url,
        Err(_) => {
            let server = redis_server::RedisServer::start("fleet_quota")?;
            let url = server.url();
            own_server = Some(server);
            url
        }
    };
    let (sender, reports) = mpsc::channel::<(usize, Instant, String)>();
    let mut nodes: Vec<NodeProcess> = (0..NODES)
        .map(|node| {
            let demand = DEMAND * SPLIT[node];
            let mut child = node_command(test_args)
                .env(CHILD, format!("{node} {url} {demand}"))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("a node process starts");
            let stdout = child.stdout.take().expect("piped");
            let sender = sender.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if sender.send((node, Instant::now(), line)).is_err() {
                        break;
                    }
                }
            });
            let stdin = child.stdin.take();
            NodeProcess { child, stdin }
        })
        .collect();
    drop(sender);

    let start = Instant::now();
    let bin_of = |at: Duration| (at.as_nanos() / TICK.as_nanos()) as usize;
    let mut bins: Vec<[Tick; NODES]> = Vec::new();
    let mut latency = vec![None; NODES];
    let mut dead_lease = 0;
    let collect = |until: Duration,
                   bins: &mut Vec<[Tick; NODES]>,
                   latency: &mut Vec<Option<(f64, f64, u64, u64)>>,
                   dead_lease: &mut i64| {
        while let Some(left) = until.checked_sub(start.elapsed()) {
            let Ok((node, at, line)) = reports.recv_timeout(left) else {
                continue;
            };
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                ["tick", admitted, refused, degraded, balance] => {
                    let bin = bin_of(at.duration_since(start));
                    if bins.len() <= bin {
                        bins.resize(bin + 1, [Tick::default(); NODES]);
                    }
                    let tick = &mut bins[bin][node];
                    tick.admitted += admitted.parse::<u64>().unwrap_or(0);
                    tick.refused += refused.parse::<u64>().unwrap_or(0);
                    tick.degraded |= *degraded == "1";
                    tick.balance = balance.parse().unwrap_or(0);
                    if node == 0 {
                        *dead_lease = tick.balance;
                    }
                }
                ["latency", leased, local, n_leased, n_local] => {
                    latency[node] = Some((
                        leased.parse().unwrap_or(f64::NAN),
                        local.parse().unwrap_or(f64::NAN),
                        n_leased.parse().unwrap_or(0),
                        n_local.parse().unwrap_or(0),
                    ));
                }
                _ => {}
            }
        }
    };

    let mut at = phases.warmup;
    collect(at, &mut bins, &mut latency, &mut dead_lease);
    let steady = (bin_of(at), bin_of(at + phases.steady));
    at += phases.steady;
    collect(at, &mut bins, &mut latency, &mut dead_lease);
    let outage = match own_server.as_mut() {
        Some(server) => {
            server.kill();
            let outage = (bin_of(at), bin_of(at + phases.outage));
            at += phases.outage;
            collect(at, &mut bins, &mut latency, &mut dead_lease);
            server.restart();
            Some(outage)
        }
        None => None,
    };
    let recovery = (bin_of(at), bin_of(at + phases.recovery));
    at += phases.recovery;
    collect(at, &mut bins, &mut latency, &mut dead_lease);
    // Node 0 dies holding its lease; the balancer sends its demand to the
    // others in proportion.
    let _ = nodes[0].child.kill();
    let _ = nodes[0].child.wait();
    nodes[0].stdin = None;
    let moved = DEMAND * SPLIT[0];
    let rest = SPLIT[1] + SPLIT[2];
    for node in 1..NODES {
        let demand = DEMAND * SPLIT[node] + moved * SPLIT[node] / rest;
        nodes[node].set_demand(demand);
    }
    let kill = (bin_of(at), bin_of(at + phases.after_kill));
    at += phases.after_kill;
    collect(at, &mut bins, &mut latency, &mut dead_lease);
    // Closing their input ends the others: they report latency and return
    // their leases.
    for node in nodes.iter_mut().skip(1) {
        node.stdin = None;
    }
    collect(
        at + Duration::from_secs(5),
        &mut bins,
        &mut latency,
        &mut dead_lease,
    );
    for node in nodes.iter_mut() {
        let _ = node.child.wait();
    }
    Some(Report {
        phases,
        bins,
        outage,
        steady,
        recovery,
        kill,
        dead_lease,
        latency: latency.into_iter().skip(1).flatten().collect(),
    })
}

/// One node: its quota on the shared Redis, a CPU queue, the open-loop
/// demand of tenant 1 and the two probe tenants; a report every tick.
fn node_main(spec: &str) {
    let mut parts = spec.split_whitespace();
    let node: usize = parts
        .next()
        .and_then(|n| n.parse().ok())
        .expect("node index");
    let url = parts.next().expect("redis url").to_owned();
    let demand: f64 = parts.next().and_then(|d| d.parse().ok()).expect("demand");
    let demand_bits = Arc::new(AtomicU64::new(demand.to_bits()));
    {
        // Demand changes arrive on stdin; its end is the end of the run.
        let demand_bits = demand_bits.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if let Some(value) = line
                    .strip_prefix("demand ")
                    .and_then(|d| d.trim().parse::<f64>().ok())
                {
                    demand_bits.store(value.to_bits(), Ordering::Relaxed);
                }
            }
            demand_bits.store(f64::NAN.to_bits(), Ordering::Relaxed);
        });
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let quota = Quota::builder()
            .backend(RedisBackend::new(&url).expect("a redis url"))
            .node_id(format!("node-{node}"))
            .expected_nodes(NODES as u32)
            .tenant(
                QUOTA_TENANT,
                TenantQuota::new(QUOTA, BURST).expect("a quota"),
            )
            .tenant(
                LEASED_TENANT,
                TenantQuota::new(1_000_000, 1_000_000).expect("a quota"),
            )
            .build()
            .expect("a quota");
        let cpu = WorkQueue::new(4_096).expect("a queue");
        let local = WorkQueue::tokens(1_000_000).expect("a token queue");
        local.set_token_limit(Some(1_000_000)).expect("a limit");
        local.add_tokens(1_000_000);
        let admitted = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let mut leased_latency = Histogram::<u64>::new(3).expect("a histogram");
        let mut local_latency = Histogram::<u64>::new(3).expect("a histogram");
        let mut interval = tokio::time::interval(Duration::from_millis(1));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let (mut carry, mut probe_carry) = (0.0f64, 0.0f64);
        let mut next_report = Instant::now() + TICK;
        let mut reported = (0u64, 0u64);
        let mut probes = 0u64;
        loop {
            interval.tick().await;
            let demand = f64::from_bits(demand_bits.load(Ordering::Relaxed));
            if demand.is_nan() {
                break;
            }
            carry += demand / 1_000.0;
            while carry >= 1.0 {
                carry -= 1.0;
                let (quota, cpu, admitted, refused) = (
                    quota.clone(),
                    cpu.clone(),
                    admitted.clone(),
                    refused.clone(),
                );
                tokio::spawn(async move {
                    let work = WorkInfo::builder()
                        .tenant(QUOTA_TENANT)
                        .priority(Priority::NORMAL)
                        .timeout(Duration::from_millis(50))
                        .build();
                    match quota.admit(&cpu, work).await {
                        Ok(permit) => {
                            admitted.fetch_add(1, Ordering::Relaxed);
                            drop(permit);
                        }
                        Err(_) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
            // The probes: a request of each, in turn first, timed inline.
            probe_carry += PROBE_RATE as f64 / 1_000.0;
            while probe_carry >= 1.0 {
                probe_carry -= 1.0;
                probes += 1;
                let leased_first = probes % 2 == 0;
                for leased in [leased_first, !leased_first] {
                    let started = Instant::now();
                    let permit = if leased {
                        quota
                            .admit(&cpu, WorkInfo::new(LEASED_TENANT, Priority::NORMAL))
                            .await
                    } else {
                        let work = WorkInfo::new(LOCAL_TENANT, Priority::NORMAL);
                        match local.admit(work.clone()).await {
                            Ok(tokens) => {
                                drop(tokens);
                                cpu.admit(work).await
                            }
                            Err(error) => Err(error),
                        }
                    };
                    let nanos = started.elapsed().as_nanos() as u64;
                    if permit.is_ok() {
                        let histogram = if leased {
                            &mut leased_latency
                        } else {
                            &mut local_latency
                        };
                        let _ = histogram.record(nanos.max(1));
                    }
                }
            }
            if Instant::now() >= next_report {
                next_report += TICK;
                local.add_tokens(PROBE_RATE);
                let (now_admitted, now_refused) = (
                    admitted.load(Ordering::Relaxed),
                    refused.load(Ordering::Relaxed),
                );
                let snapshot = quota.snapshot();
                let balance = snapshot
                    .tenants
                    .iter()
                    .find(|tenant| tenant.tenant == QUOTA_TENANT)
                    .map_or(0, |tenant| tenant.balance);
                println!(
                    "tick {} {} {} {balance}",
                    now_admitted - reported.0,
                    now_refused - reported.1,
                    u8::from(snapshot.degraded)
                );
                reported = (now_admitted, now_refused);
            }
        }
        let p99 = |histogram: &Histogram<u64>| histogram.value_at_quantile(0.99) as f64 / 1_000.0;
        println!(
            "latency {:.2} {:.2} {} {}",
            p99(&leased_latency),
            p99(&local_latency),
            leased_latency.len(),
            local_latency.len()
        );
        if std::env::var("FLEET_QUOTA_DEBUG").is_ok() {
            for q in [0.5, 0.9, 0.99, 0.999] {
                eprintln!(
                    "node {node} q{q}: leased {} ns, local {} ns",
                    leased_latency.value_at_quantile(q),
                    local_latency.value_at_quantile(q)
                );
            }
        }
        quota.shutdown();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quick run, checking directions only. Under `cargo test` this is
    /// also what each node process runs: the test binary started again
    /// with [`CHILD`] set turns into a node here.
    #[test]
    fn quick_run_admits_near_the_quota_by_demand_and_bounds_the_outage() {
        if let Ok(spec) = std::env::var(CHILD) {
            node_main(&spec);
            return;
        }
        let args = [
            "--exact",
            "tests::quick_run_admits_near_the_quota_by_demand_and_bounds_the_outage",
            "--nocapture",
            "--test-threads=1",
        ];
        let Some(report) = run(Phases::QUICK, &args) else {
            return;
        };
        report.print();
        let steady = report.rate(report.steady);
        assert!(steady < DEMAND, "admitted below demand: {steady}");
        assert!(
            (0.5 * QUOTA as f64..1.5 * QUOTA as f64).contains(&steady),
            "near the quota: {steady}"
        );
        let shares = report.admitted(report.steady);
        assert!(shares[0] > shares[1] && shares[1] > shares[2], "{shares:?}");
        if let Some(outage) = report.outage {
            let rate = report.rate(outage);
            // Quota plus every node's trickle, plus a burst.
            let bound = 2.0 * QUOTA as f64 + BURST as f64;
            assert!(rate < bound, "the outage is bounded: {rate}");
            assert!(rate > 0.0, "the trickle admits");
            assert!(report.degraded_nodes(outage) > 0, "and says so");
        }
        assert!(report.rate(report.kill) > 0.0);
        assert_eq!(report.latency.len(), NODES - 1, "every survivor reported");
    }
}
