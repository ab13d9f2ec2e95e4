//! One tenant's fleet-wide bucket: the arithmetic both backends run.
//!
//! # Implementation notes
//!
//! The bucket is a token bucket (`rate` units a second, at most `burst`
//! banked) split into a shared **pool** and one **credit** per node that
//! has reported demand recently. Every exchange, by any node:
//!
//! 1. refills by the time elapsed since the last exchange (the store's own
//!    clock: Redis' `TIME`, or the in-process backend's), and divides the
//!    refill among the nodes in proportion to the demand each reported
//!    last. A node's credit is capped at its share of the burst; what does
//!    not fit, or arrives while no node reports demand, goes to the pool;
//! 2. forgets nodes not heard from for the share TTL (a dead node), and
//!    their credit with them: what was set aside for a node that died is
//!    lost with it, as its lease is, so a death never lets the others run
//!    over the quota (a node that leaves on purpose gives its credit back);
//! 3. records the caller's demand, charges the units it admitted on its
//!    fallback trickle while the store was out of reach (as far as the
//!    bucket holds them: a charge never makes a debt), and takes back the
//!    units it returns (a shutdown, an idle tenant);
//! 4. grants up to what the caller asked, from its own credit first, then
//!    from the pool.
//!
//! So under contention each node gets the refill in proportion to its
//! demand (a node with 70% of a tenant's requests gets 70% of its quota),
//! and without contention the pool serves whoever asks, up to the burst.
//!
//! **Conservation.** The pool plus the credits never exceed the burst
//! after an exchange, and a grant never exceeds them; they grow only by
//! the refill and by returned units. So, from the exchange that created
//! the bucket, the units granted minus those returned never exceed
//! `burst + rate × elapsed`, however many nodes ask, in whatever order
//! (`granted_never_exceeds_refill_plus_burst` below; the same property
//! against a real Redis in `tests/quota_redis.rs`).
//!
//! `src/quota/lease.lua` is the same arithmetic as a Redis script: a change
//! here is a change there.

use std::collections::BTreeMap;

use super::backend::Lease;

/// The most nodes one tenant's bucket keeps shares for; beyond it the node
/// heard from longest ago is forgotten (with its credit, as a dead one is).
pub(crate) const MAX_NODES: usize = 1_024;

/// What one node has told the bucket.
#[derive(Clone, Debug, PartialEq)]
struct NodeShare {
    /// Units a second the node's requests asked for, at its last exchange.
    demand: f64,
    /// Units set aside for the node from the refill, not yet granted.
    credit: f64,
    /// When the node last exchanged, in the store's microseconds.
    seen_us: u64,
}

/// One tenant's fleet-wide bucket.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FleetBucket {
    pool: f64,
    last_us: u64,
    nodes: BTreeMap<String, NodeShare>,
}

/// What an exchange gave the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exchanged {
    /// Units granted to the caller.
    pub(crate) granted: u64,
    /// What the caller could be granted right after: its credit and the pool.
    pub(crate) available: u64,
}

impl FleetBucket {
    /// A bucket created at `now_us`, full: an expired bucket (its TTL is at
    /// least the time the burst takes to refill) would be full by then too.
    pub(crate) fn new(burst: u64, now_us: u64) -> Self {
        FleetBucket {
            pool: burst as f64,
            last_us: now_us,
            nodes: BTreeMap::new(),
        }
    }

    /// Everything banked: the pool and every credit.
    #[cfg(test)]
    pub(crate) fn content(&self) -> f64 {
        self.pool + self.nodes.values().map(|node| node.credit).sum::<f64>()
    }

    /// When the bucket was last exchanged with.
    pub(crate) fn last_us(&self) -> u64 {
        self.last_us
    }

    /// One exchange by `node` at `now_us` (the store's clock); see the
    /// module notes for the steps.
    pub(crate) fn exchange(
        &mut self,
        now_us: u64,
        node: &str,
        share_ttl_us: u64,
        lease: &Lease,
    ) -> Exchanged {
        let rate = lease.rate as f64;
        let burst = lease.burst as f64;
        // The store's clock does not go back, but a restored snapshot or a
        // failover to a replica with a slower clock could: no negative
        // refill, and the later time is kept.
        let elapsed_us = now_us.saturating_sub(self.last_us);
        self.last_us = self.last_us.max(now_us);

        // Nodes not heard from for the TTL are gone, with their credit;
        // the caller is not.
        let stale_before = now_us.saturating_sub(share_ttl_us);
        self.nodes
            .retain(|id, share| share.seen_us >= stale_before || id == node);

        let share = self.nodes.entry(node.to_owned()).or_insert(NodeShare {
            demand: 0.0,
            credit: 0.0,
            seen_us: now_us,
        });
        share.demand = lease.demand as f64;
        share.seen_us = now_us;
        if self.nodes.len() > MAX_NODES {
            self.forget_oldest(node);
        }

        self.refill(rate * elapsed_us as f64 / 1e6, burst);
        self.charge(node, lease.charge as f64);
        self.pool += lease.returned as f64;
        self.cap(burst);

        let share = self.nodes.get_mut(node).expect("inserted above");
        let from_credit = share.credit.min(lease.asked as f64);
        let from_pool = self.pool.min(lease.asked as f64 - from_credit);
        let granted = (from_credit + from_pool).floor();
        // Floor the grant, then take it from the credit first: the
        // fractions stay banked.
        let taken_from_credit = share.credit.min(granted);
        share.credit -= taken_from_credit;
        self.pool = (self.pool - (granted - taken_from_credit)).max(0.0);
        let available = (share.credit + self.pool).floor();
        if lease.leaving {
            let share = self.nodes.remove(node).expect("inserted above");
            self.pool += share.credit;
            self.cap(burst);
        }
        Exchanged {
            granted: granted as u64,
            available: available as u64,
        }
    }

    /// Divides `refill` among the nodes by demand, each capped at its share
    /// of the burst; the rest to the pool.
    fn refill(&mut self, refill: f64, burst: f64) {
        let demand: f64 = self.nodes.values().map(|node| node.demand).sum();
        if demand <= 0.0 {
            self.pool += refill;
            return;
        }
        let mut overflow = 0.0;
        for node in self.nodes.values_mut() {
            let fraction = node.demand / demand;
            let offered = refill * fraction;
            let room = (burst * fraction - node.credit).max(0.0);
            let taken = offered.min(room);
            node.credit += taken;
            overflow += offered - taken;
        }
        self.pool += overflow;
    }

    /// Takes `charge` from the node's credit, then the pool, never below
    /// zero.
    fn charge(&mut self, node: &str, charge: f64) {
        if charge <= 0.0 {
            return;
        }
        let share = self.nodes.get_mut(node).expect("inserted by the caller");
        let from_credit = share.credit.min(charge);
        share.credit -= from_credit;
        self.pool = (self.pool - (charge - from_credit)).max(0.0);
    }

    /// Keeps the content within the burst: the pool first, then (a burst
    /// lowered below the credits) every credit in proportion.
    fn cap(&mut self, burst: f64) {
        let credits: f64 = self.nodes.values().map(|node| node.credit).sum();
        if credits > burst {
            let scale = burst / credits;
            for node in self.nodes.values_mut() {
                node.credit *= scale;
            }
            self.pool = 0.0;
        } else {
            self.pool = self.pool.min(burst - credits).max(0.0);
        }
    }

    /// Forgets the node heard from longest ago, other than `keep`.
    fn forget_oldest(&mut self, keep: &str) {
        let oldest = self
            .nodes
            .iter()
            .filter(|(id, _)| id.as_str() != keep)
            .min_by_key(|(_, share)| share.seen_us)
            .map(|(id, _)| id.clone());
        if let Some(id) = oldest {
            self.nodes.remove(&id);
        }
    }

    /// The nodes with a share, for tests.
    #[cfg(test)]
    fn node_count(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::work::TenantId;

    const SECOND: u64 = 1_000_000;
    const TTL: u64 = 3 * SECOND;

    fn lease(asked: u64, demand: u64) -> Lease {
        Lease::new(TenantId::new(1), 1_000, 1_000, asked, demand)
    }

    #[test]
    fn a_new_bucket_grants_its_burst_then_the_refill() {
        let mut bucket = FleetBucket::new(1_000, 0);
        let first = bucket.exchange(0, "a", TTL, &lease(600, 600));
        assert_eq!(
            first,
            Exchanged {
                granted: 600,
                available: 400
            }
        );
        let second = bucket.exchange(0, "a", TTL, &lease(600, 600));
        assert_eq!(second.granted, 400, "the rest of the burst");
        let later = bucket.exchange(SECOND / 4, "a", TTL, &lease(600, 600));
        assert_eq!(later.granted, 250, "a quarter second of 1,000/s");
    }

    /// Rows: the demands three nodes report, and the share of one second's
    /// refill each is granted once the burst is spent.
    #[test]
    fn under_contention_the_refill_follows_demand() {
        let rows: &[(&str, [u64; 3], [u64; 3])] = &[
            ("70/20/10 of 3x", [2_100, 600, 300], [700, 200, 100]),
            ("equal", [1_000, 1_000, 1_000], [333, 333, 333]),
            ("one node alone asks", [5_000, 0, 0], [1_000, 0, 0]),
        ];
        for &(name, demands, expected) in rows {
            let mut bucket = FleetBucket::new(1_000, 0);
            let nodes = ["a", "b", "c"];
            // Spend the burst and report demand.
            for (node, demand) in nodes.iter().zip(demands) {
                bucket.exchange(0, node, TTL, &lease(1_000, demand));
            }
            let mut granted = [0u64; 3];
            // Ten exchanges a second each, asking for more than they get.
            for step in 1..=10 {
                for (i, (node, demand)) in nodes.iter().zip(demands).enumerate() {
                    let at = step * SECOND / 10;
                    granted[i] += bucket
                        .exchange(at, node, TTL, &lease(10_000, demand))
                        .granted;
                }
            }
            for i in 0..3 {
                assert!(
                    granted[i].abs_diff(expected[i]) <= 2,
                    "{name}: node {i} got {granted:?}, expected {expected:?}"
                );
            }
        }
    }

    #[test]
    fn without_contention_every_node_gets_what_it_asks() {
        let mut bucket = FleetBucket::new(1_000, 0);
        for step in 1..=20u64 {
            let at = step * SECOND / 10;
            for (node, demand) in [("a", 350), ("b", 100), ("c", 50)] {
                let asked = demand / 10;
                let got = bucket.exchange(at, node, TTL, &lease(asked, demand));
                assert_eq!(got.granted, asked, "{node} at step {step}");
            }
        }
    }

    #[test]
    fn a_dead_nodes_share_lapses_after_the_ttl_and_its_credit_with_it() {
        let mut bucket = FleetBucket::new(1_000, 0);
        bucket.exchange(0, "a", TTL, &lease(1_000, 500));
        bucket.exchange(0, "b", TTL, &lease(0, 500));
        // b goes silent; a keeps asking every 100 ms for more than it gets.
        let mut granted = 0;
        for step in 1..=20 {
            granted += bucket
                .exchange(step * SECOND / 10, "a", TTL, &lease(10_000, 500))
                .granted;
        }
        // Until the TTL, half the refill is set aside for b, up to half the
        // burst (reached after 1 s); what overflows reaches a through the
        // pool.
        assert_eq!(bucket.node_count(), 2);
        assert_eq!(granted, 1_500, "half of the first second, all of the next");
        // Then b is forgotten, and what it had set aside is lost with it:
        // a gets the refill since its last exchange, no more.
        let after = bucket.exchange(TTL + SECOND / 10, "a", TTL, &lease(10_000, 500));
        assert_eq!(bucket.node_count(), 1);
        assert_eq!(after.granted, 1_000, "1.1 s of refill, capped at the burst");
        assert!(bucket.content() < 1.0, "b's 500 did not reach the pool");
    }

    #[test]
    fn fallback_spending_is_charged_but_never_makes_a_debt() {
        let mut bucket = FleetBucket::new(1_000, 0);
        let charged = Lease {
            charge: 400,
            ..lease(0, 100)
        };
        let got = bucket.exchange(0, "a", TTL, &charged);
        assert_eq!(got.available, 600);
        let overcharged = Lease {
            charge: 10_000,
            ..lease(0, 100)
        };
        assert_eq!(bucket.exchange(0, "a", TTL, &overcharged).available, 0);
        assert_eq!(bucket.content(), 0.0);
        let refilled = bucket.exchange(SECOND / 10, "a", TTL, &lease(1_000, 100));
        assert_eq!(refilled.granted, 100, "refill resumes from zero, no debt");
    }

    #[test]
    fn returned_units_and_a_leaving_node_fill_the_pool_up_to_the_burst() {
        let mut bucket = FleetBucket::new(1_000, 0);
        bucket.exchange(0, "a", TTL, &lease(1_000, 100));
        let returning = Lease {
            returned: 300,
            leaving: true,
            ..lease(0, 0)
        };
        let back = bucket.exchange(0, "a", TTL, &returning);
        assert_eq!(back.granted, 0);
        assert_eq!(bucket.node_count(), 0, "a leaving node keeps no share");
        assert_eq!(bucket.content(), 300.0);
        let too_much = Lease {
            returned: 5_000,
            ..lease(0, 0)
        };
        bucket.exchange(0, "b", TTL, &too_much);
        assert_eq!(bucket.content(), 1_000.0, "never past the burst");
    }

    #[test]
    fn a_clock_that_goes_back_refills_nothing() {
        let mut bucket = FleetBucket::new(1_000, 10 * SECOND);
        bucket.exchange(10 * SECOND, "a", TTL, &lease(1_000, 10));
        let back = bucket.exchange(SECOND, "a", TTL, &lease(1_000, 10));
        assert_eq!(back.granted, 0);
        assert_eq!(bucket.last_us(), 10 * SECOND, "the later time is kept");
    }

    #[test]
    fn node_shares_are_bounded() {
        let mut bucket = FleetBucket::new(1_000, 0);
        for i in 0..(MAX_NODES as u64 + 50) {
            bucket.exchange(i, &format!("node-{i}"), u64::MAX, &lease(0, 1));
        }
        assert_eq!(bucket.node_count(), MAX_NODES);
        assert!(bucket.content() <= 1_000.0);
    }

    mod conservation {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        struct Step {
            after_us: u64,
            node: usize,
            asked: u64,
            demand: u64,
            charge: u64,
            returned: u64,
            leaving: bool,
        }

        fn step() -> impl Strategy<Value = Step> {
            (
                0..300_000u64,
                0..4usize,
                0..3_000u64,
                0..5_000u64,
                prop_oneof![9 => Just(0u64), 1 => 0..2_000u64],
                prop_oneof![9 => Just(0u64), 1 => 0..500u64],
                prop::bool::weighted(0.05),
            )
                .prop_map(
                    |(after_us, node, asked, demand, charge, returned, leaving)| Step {
                        after_us,
                        node,
                        asked,
                        demand,
                        charge,
                        returned,
                        leaving,
                    },
                )
        }

        proptest! {
            /// Whatever nodes ask, report, charge and return, in whatever
            /// order: the units granted, less those returned, never exceed
            /// the burst plus the refill since the bucket was made; and the
            /// bucket never banks more than its burst.
            #[test]
            fn granted_never_exceeds_refill_plus_burst(
                rate in 1..10_000u64,
                burst in 1..10_000u64,
                steps in prop::collection::vec(step(), 1..200),
            ) {
                let mut now = 0u64;
                let mut bucket = FleetBucket::new(burst, now);
                let (mut granted, mut returned) = (0u64, 0u64);
                for step in steps {
                    now += step.after_us;
                    let lease = Lease {
                        rate,
                        burst,
                        asked: step.asked,
                        demand: step.demand,
                        charge: step.charge,
                        returned: step.returned,
                        leaving: step.leaving,
                        ..Lease::new(TenantId::new(1), rate, burst, 0, 0)
                    };
                    let got = bucket.exchange(now, &format!("n{}", step.node), TTL, &lease);
                    prop_assert!(got.granted <= step.asked);
                    granted += got.granted;
                    returned += step.returned;
                    let bound = burst as f64 + rate as f64 * now as f64 / 1e6 + returned as f64;
                    prop_assert!(granted as f64 <= bound + 1e-6, "{granted} > {bound}");
                    prop_assert!(bucket.content() <= burst as f64 + 1e-6);
                    prop_assert!(bucket.content() >= 0.0);
                }
            }
        }
    }
}
