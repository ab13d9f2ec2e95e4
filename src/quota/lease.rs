//! One tenant's leasing on one node: when to ask, how much, what to report,
//! and the fallback trickle. Pure: every method takes the time.
//!
//! # Implementation notes
//!
//! The leasing thread keeps one [`TenantLease`] per tenant in the node's
//! table and calls it every tick with the units requests asked for since
//! the last tick and the tenant's local balance:
//!
//! * **Demand** is measured over windows of [`Policy::demand_window`]
//!   (an EWMA, the current window counting while it is fuller): units
//!   asked, whether admitted or not, so a node's reported demand is what
//!   its requests want, not what it got.
//! * **Asking.** With no exchange in flight, at most every
//!   [`Policy::min_interval`], a tenant with demand asks once its balance
//!   is half spent (at most half the last grant, or none at all) for about
//!   one lease period of that demand, less what it holds; it also reports
//!   (asking nothing) when its demand moved by half since it last reported
//!   or it has fallback units to charge. So under contention (the balance
//!   empty, leases small) a node asks at the minimum interval, and without
//!   it about twice a lease period.
//! * **Fallback.** While the node is degraded, every tick adds the
//!   fallback rate's units for the time elapsed (fractions carried), up to
//!   one lease period of them banked, and remembers them: the next exchange
//!   that succeeds charges them to the fleet's bucket (`Lease::charge`), so
//!   the fleet does not admit the outage's units twice, and the leasing
//!   thread takes from the local balance those it still holds (a node whose
//!   demand was below its trickle would otherwise spend them on top of its
//!   leases after the outage).
//! * **Refill**, the rate at which units reach the local balance (leases
//!   and fallback, an EWMA over the same windows), is what
//!   [`AdmitError::OverQuota`](crate::AdmitError::OverQuota)'s
//!   `retry_after` is computed from.

use std::time::Duration;

use tokio::time::Instant;

use super::backend::{Lease, Leased};
use super::TenantQuota;
use crate::work::TenantId;

/// The node-wide settings leasing follows (from the quota's builder).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy {
    /// A lease covers about this long of the node's demand.
    pub(crate) lease_period: Duration,
    /// The shortest time between two asks for one tenant.
    pub(crate) min_interval: Duration,
    /// How many nodes share each quota, for the default fallback rate.
    pub(crate) expected_nodes: u32,
    /// The window demand and refill are measured over.
    pub(crate) demand_window: Duration,
}

/// The weight of a closed window in the demand and refill EWMAs.
const WINDOW_WEIGHT: f64 = 0.3;

/// Units a second, measured over windows.
#[derive(Clone, Debug)]
struct Meter {
    ewma: f64,
    window: u64,
    since: Instant,
    /// Whether a window has closed yet.
    primed: bool,
}

impl Meter {
    fn new(now: Instant) -> Self {
        Meter {
            ewma: 0.0,
            window: 0,
            since: now,
            primed: false,
        }
    }

    fn add(&mut self, units: u64) {
        self.window = self.window.saturating_add(units);
    }

    /// Closes the window if it is long enough.
    fn roll(&mut self, now: Instant, window: Duration) {
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed < window {
            return;
        }
        let observed = self.window as f64 / elapsed.as_secs_f64();
        self.ewma = if self.primed {
            (1.0 - WINDOW_WEIGHT) * self.ewma + WINDOW_WEIGHT * observed
        } else {
            observed
        };
        // A demand below half a unit a second is none: the EWMA would
        // otherwise never reach zero, and an idle tenant would keep a
        // share of the bucket.
        if self.ewma < 0.5 {
            self.ewma = 0.0;
        }
        self.primed = true;
        self.window = 0;
        self.since = now;
    }

    /// The EWMA, or the open window's rate where that is higher (a rise
    /// counts at once, a fall only as windows close).
    fn per_sec(&self, window: Duration) -> f64 {
        self.ewma.max(self.window as f64 / window.as_secs_f64())
    }
}

/// One tenant's leasing state on this node.
#[derive(Clone, Debug)]
pub(crate) struct TenantLease {
    tenant: TenantId,
    quota: TenantQuota,
    demand: Meter,
    refill: Meter,
    /// Units the last exchange granted: the balance is half spent at half
    /// of it.
    last_granted: u64,
    asked_at: Option<Instant>,
    in_flight: bool,
    /// The demand the bucket was last told.
    reported_demand: Option<u64>,
    drip_at: Option<Instant>,
    drip_carry: f64,
    /// Fallback units added since the last exchange that succeeded.
    unreported: u64,
    /// What the backend said this node could have, at the last exchange.
    pub(crate) available: u64,
    pub(crate) leased_total: u64,
    pub(crate) fallback_total: u64,
}

impl TenantLease {
    pub(crate) fn new(tenant: TenantId, quota: TenantQuota, now: Instant) -> Self {
        TenantLease {
            tenant,
            quota,
            demand: Meter::new(now),
            refill: Meter::new(now),
            last_granted: 0,
            asked_at: None,
            in_flight: false,
            reported_demand: None,
            drip_at: None,
            drip_carry: 0.0,
            unreported: 0,
            available: 0,
            leased_total: 0,
            fallback_total: 0,
        }
    }

    /// Records the units requests asked for since the last tick, and
    /// closes the measuring windows that are due.
    pub(crate) fn observe(&mut self, now: Instant, requested: u64, policy: &Policy) {
        self.demand.add(requested);
        self.demand.roll(now, policy.demand_window);
        self.refill.roll(now, policy.demand_window);
    }

    /// Units a second this node's requests of the tenant ask for.
    pub(crate) fn demand_per_sec(&self, policy: &Policy) -> f64 {
        self.demand.per_sec(policy.demand_window)
    }

    /// Units a second reaching the local balance; the fallback rate until
    /// anything has.
    pub(crate) fn refill_per_sec(&self, policy: &Policy) -> f64 {
        let measured = self.refill.per_sec(policy.demand_window);
        if measured > 0.0 {
            measured
        } else {
            self.fallback_rate(policy)
        }
    }

    /// The fallback trickle, units a second: the tenant's own, or its rate
    /// over the expected node count.
    pub(crate) fn fallback_rate(&self, policy: &Policy) -> f64 {
        match self.quota.fallback() {
            Some(rate) => rate as f64,
            None => self.quota.rate() as f64 / f64::from(policy.expected_nodes.max(1)),
        }
    }

    /// The lease to send now, if any (see the module notes); marks it in
    /// flight. `balance` is the local balance (negative in debt), `waiting`
    /// the requests waiting for it.
    pub(crate) fn ask(
        &mut self,
        now: Instant,
        balance: i64,
        waiting: usize,
        policy: &Policy,
    ) -> Option<Lease> {
        if self.in_flight {
            return None;
        }
        if let Some(asked_at) = self.asked_at {
            if now.saturating_duration_since(asked_at) < policy.min_interval {
                return None;
            }
        }
        let demand = self.demand_per_sec(policy);
        let wanted = demand > 0.0 || waiting > 0;
        let half_spent =
            balance <= 0 || balance.unsigned_abs().saturating_mul(2) <= self.last_granted;
        let demand_units = demand.ceil().min(u64::MAX as f64) as u64;
        let moved = match self.reported_demand {
            None => demand_units > 0,
            Some(reported) => {
                let (low, high) = (reported.min(demand_units), reported.max(demand_units));
                high > low.saturating_mul(3) / 2 && high - low > 1
            }
        };
        let asking = wanted && half_spent;
        if !asking && !moved && self.unreported == 0 {
            return None;
        }
        let asked = if asking {
            let burst = self.quota.burst();
            let period = (demand * policy.lease_period.as_secs_f64()).ceil();
            let target = (period.min(burst as f64) as u64).max(1);
            // Debt is paid from the next lease, so it is asked for too.
            let asked = i128::from(target) - i128::from(balance);
            u64::try_from(asked.clamp(0, i128::from(burst))).unwrap_or(burst)
        } else {
            0
        };
        self.in_flight = true;
        self.asked_at = Some(now);
        let mut lease = Lease::new(
            self.tenant,
            self.quota.rate(),
            self.quota.burst(),
            asked,
            demand_units,
        );
        lease.charge = self.unreported;
        Some(lease)
    }

    /// The answer to `lease` arrived: the units to add to the local balance.
    pub(crate) fn granted(&mut self, lease: &Lease, answer: Leased) -> u64 {
        self.in_flight = false;
        // A backend that grants more than was asked is not believed.
        let granted = answer.granted.min(lease.asked);
        self.last_granted = granted;
        self.available = answer.available;
        self.reported_demand = Some(lease.demand);
        self.unreported = self.unreported.saturating_sub(lease.charge);
        self.leased_total = self.leased_total.saturating_add(granted);
        self.refill.add(granted);
        granted
    }

    /// The exchange carrying this tenant's lease failed.
    pub(crate) fn failed(&mut self) {
        self.in_flight = false;
    }

    /// A fallback tick while the node is degraded: the units to add to the
    /// local balance for the time since the last one.
    pub(crate) fn drip(&mut self, now: Instant, balance: i64, policy: &Policy) -> u64 {
        let rate = self.fallback_rate(policy);
        let Some(since) = self.drip_at.replace(now) else {
            return 0;
        };
        let elapsed = now.saturating_duration_since(since).as_secs_f64();
        let bank = (rate * policy.lease_period.as_secs_f64()).ceil().max(1.0);
        let room = (bank - balance as f64).max(0.0);
        if room <= 0.0 {
            self.drip_carry = 0.0;
            return 0;
        }
        let units = rate * elapsed + self.drip_carry;
        let whole = units.floor().min(room.floor());
        self.drip_carry = (units - whole).clamp(0.0, 1.0);
        let whole = whole.max(0.0) as u64;
        self.unreported = self.unreported.saturating_add(whole);
        self.fallback_total = self.fallback_total.saturating_add(whole);
        self.refill.add(whole);
        whole
    }

    /// The node became degraded at `now`: the trickle counts from then.
    pub(crate) fn start_dripping(&mut self, now: Instant) {
        self.drip_at = Some(now);
        self.drip_carry = 0.0;
    }

    /// The node is healthy again: the next degraded spell drips from its
    /// own start.
    pub(crate) fn stop_dripping(&mut self) {
        self.drip_at = None;
        self.drip_carry = 0.0;
    }

    /// The lease that gives `balance` back and leaves the bucket, with the
    /// fallback units still to charge.
    pub(crate) fn leaving(&self, balance: i64) -> Lease {
        let mut lease = Lease::new(self.tenant, self.quota.rate(), self.quota.burst(), 0, 0);
        lease.returned = u64::try_from(balance).unwrap_or(0);
        lease.charge = self.unreported;
        lease.leaving = true;
        lease
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// What the backend answered: `granted` units, `available` left.
    fn leased(granted: u64, available: u64) -> Leased {
        Leased { granted, available }
    }

    fn policy() -> Policy {
        Policy {
            lease_period: Duration::from_secs(1),
            min_interval: 50 * MS,
            expected_nodes: 3,
            demand_window: 100 * MS,
        }
    }

    fn quota() -> TenantQuota {
        TenantQuota::new(900, 1_000).unwrap()
    }

    /// A tenant whose requests asked for `per_sec` for a second, in ticks.
    fn busy(per_sec: u64, t0: Instant) -> (TenantLease, Instant) {
        let mut lease = TenantLease::new(TenantId::new(1), quota(), t0);
        let mut now = t0;
        for _ in 0..100 {
            now += 10 * MS;
            lease.observe(now, per_sec / 100, &policy());
        }
        (lease, now)
    }

    #[test]
    fn a_lease_covers_a_period_of_demand_less_what_is_held() {
        let t0 = Instant::now();
        // Rows: demand/s, balance, asked.
        let rows: &[(u64, i64, Option<u64>)] = &[
            (300, 0, Some(300)),
            (300, 100, Some(200)),
            (300, -50, Some(350)),   // the debt is asked for too
            (5_000, 0, Some(1_000)), // never past the burst
            (300, 200, None),        // not half spent yet
        ];
        for &(demand, balance, expected) in rows {
            let (mut lease, now) = busy(demand, t0);
            // One exchange already granted 300 and reported the demand.
            lease.reported_demand = Some(demand);
            lease.last_granted = 300;
            let asked = lease
                .ask(now, balance, 0, &policy())
                .map(|lease| lease.asked);
            assert_eq!(asked, expected, "demand {demand}, balance {balance}");
        }
    }

    #[test]
    fn it_asks_again_once_half_spent_and_never_faster_than_the_minimum_interval() {
        let t0 = Instant::now();
        let (mut lease, now) = busy(400, t0);
        let first = lease.ask(now, 0, 0, &policy()).unwrap();
        assert!(lease.ask(now, 0, 0, &policy()).is_none(), "one in flight");
        assert_eq!(lease.granted(&first, leased(400, 600)), 400);
        let soon = now + 10 * MS;
        assert!(
            lease.ask(soon, 0, 0, &policy()).is_none(),
            "minimum interval"
        );
        let later = now + 60 * MS;
        assert!(
            lease.ask(later, 201, 0, &policy()).is_none(),
            "201 of 400 left"
        );
        assert!(lease.ask(later, 200, 0, &policy()).is_some(), "half spent");
    }

    #[test]
    fn an_idle_tenant_asks_nothing_and_reports_a_fall_in_demand_once() {
        let t0 = Instant::now();
        let (mut lease, mut now) = busy(400, t0);
        let first = lease.ask(now, 0, 0, &policy()).unwrap();
        lease.granted(&first, leased(400, 0));
        // Demand stops: windows close with nothing in them.
        for _ in 0..300 {
            now += 10 * MS;
            lease.observe(now, 0, &policy());
        }
        let report = lease.ask(now, 400, 0, &policy()).expect("demand fell");
        assert_eq!((report.asked, report.demand), (0, 0));
        lease.granted(&report, leased(0, 0));
        now += 100 * MS;
        assert!(
            lease.ask(now, 400, 0, &policy()).is_none(),
            "nothing new to say"
        );
    }

    #[test]
    fn waiting_requests_ask_even_before_a_window_closes() {
        let t0 = Instant::now();
        let mut lease = TenantLease::new(TenantId::new(1), quota(), t0);
        lease.observe(t0 + MS, 1, &policy());
        let first = lease
            .ask(t0 + MS, 0, 1, &policy())
            .expect("a request waits");
        assert!(first.asked >= 1);
        assert_eq!(first.demand, 10, "one unit in a 100 ms window");
    }

    /// Fallback at 900 / 3 nodes = 300 units a second.
    #[test]
    fn the_fallback_trickle_adds_its_rate_banks_a_period_and_is_charged_later() {
        let t0 = Instant::now();
        let mut lease = TenantLease::new(TenantId::new(1), quota(), t0);
        let policy = policy();
        assert_eq!(lease.drip(t0, 0, &policy), 0, "the first tick starts it");
        let mut added = 0;
        let mut balance = 0i64;
        let mut now = t0;
        for _ in 0..100 {
            now += 10 * MS;
            let units = lease.drip(now, balance, &policy);
            added += units;
            balance += units as i64;
        }
        assert_eq!(added, 300, "one second at 300/s, fractions carried");
        // Nothing spent: the bank (one period, 300) is full.
        assert_eq!(lease.drip(now + 100 * MS, balance, &policy), 0);
        // Spending makes room again: 100 ms more at 300/s.
        assert_eq!(lease.drip(now + 200 * MS, balance - 100, &policy), 30);
        // The next exchange charges what the trickle added.
        lease.observe(now + 200 * MS, 50, &policy);
        let report = lease.ask(now + 200 * MS, balance, 0, &policy).unwrap();
        assert_eq!(report.charge, 330);
        lease.granted(&report, leased(report.asked, 0));
        lease.stop_dripping();
        let again = lease.ask(now + 300 * MS, 0, 0, &policy).unwrap();
        assert_eq!(again.charge, 0, "charged once");
    }

    #[test]
    fn a_failed_exchange_keeps_the_charge_for_the_next() {
        let t0 = Instant::now();
        let mut lease = TenantLease::new(TenantId::new(1), quota(), t0);
        lease.drip(t0, 0, &policy());
        lease.drip(t0 + Duration::from_millis(100), 0, &policy());
        let first = lease.ask(t0 + 100 * MS, 0, 0, &policy()).unwrap();
        assert_eq!(first.charge, 30);
        lease.failed();
        let retry = lease.ask(t0 + 200 * MS, 0, 0, &policy()).unwrap();
        assert_eq!(retry.charge, 30);
    }

    #[test]
    fn an_explicit_fallback_rate_replaces_the_share() {
        let t0 = Instant::now();
        let quota = TenantQuota::new(900, 1_000).unwrap().fallback_rate(50);
        let lease = TenantLease::new(TenantId::new(1), quota, t0);
        assert_eq!(lease.fallback_rate(&policy()), 50.0);
        assert_eq!(lease.refill_per_sec(&policy()), 50.0, "before any refill");
    }

    #[test]
    fn a_backend_granting_more_than_asked_is_not_believed() {
        let t0 = Instant::now();
        let (mut lease, now) = busy(100, t0);
        let asked = lease.ask(now, 0, 0, &policy()).unwrap();
        assert_eq!(lease.granted(&asked, leased(u64::MAX, 0)), asked.asked);
    }

    #[test]
    fn leaving_returns_a_positive_balance_and_charges_what_is_owed() {
        let t0 = Instant::now();
        let mut lease = TenantLease::new(TenantId::new(1), quota(), t0);
        lease.drip(t0, 0, &policy());
        lease.drip(t0 + 100 * MS, 0, &policy());
        let leaving = lease.leaving(250);
        assert_eq!(
            (leaving.returned, leaving.charge, leaving.leaving),
            (250, 30, true)
        );
        assert_eq!(lease.leaving(-40).returned, 0, "a debt returns nothing");
    }
}
