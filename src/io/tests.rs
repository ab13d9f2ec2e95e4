//! The load rule end to end, in the crate because the listener and the drip
//! are its own: a simulated LSM whose L0 debt rises with the bytes admitted
//! and drains at a compaction rate, driven through the listener, the drip
//! and a token queue full of backlogged writers.

use std::task::Poll;

use tokio_test::task::Spawn;

use super::drip::TokenDrip;
use super::listener::{IoLoadConfig, IoLoadListener};
use super::{LsmStats, Tokens};
use crate::grant::TokenGranter;
use crate::{Admit, Priority, TenantId, WorkInfo, WorkQueue};

const MIB: u64 = 1 << 20;
/// Compactions remove this much from L0 per interval.
const COMPACTION: u64 = 400 * MIB;
/// One sub-level per this much L0 data.
const SUBLEVEL: u64 = 32 * MIB;
const WRITE: u64 = MIB;

fn write(tenant: u64) -> WorkInfo {
    WorkInfo::builder()
        .tenant(TenantId::new(tenant))
        .priority(Priority::NORMAL)
        .requested(WRITE)
        .build()
}

#[tokio::test(start_paused = true)]
async fn l0_debt_stays_bounded_near_the_threshold_while_writers_are_backlogged() {
    let mut listener = IoLoadListener::new(IoLoadConfig::default()).unwrap();
    let queue = WorkQueue::tokens(1).unwrap();
    let mut stats = LsmStats::default();
    let mut waiting: Vec<Spawn<Admit<TokenGranter>>> = Vec::new();
    let mut sublevels_seen = Vec::new();

    for _interval in 0..40 {
        let tokens = listener.next_interval(&stats);
        let mut drip = match tokens.regular {
            Tokens::Unlimited => {
                queue.set_token_limit(None).unwrap();
                None
            }
            Tokens::Limited(total) => {
                queue.set_token_limit(Some(total / 60 + WRITE)).unwrap();
                Some(TokenDrip::new(total, 60))
            }
        };
        let mut admitted_bytes = 0u64;
        for _tick in 0..60 {
            // Admission takes tokio's cooperative budget like any resource:
            // give the scheduler its turn each tick, as a real writer would.
            tokio::task::yield_now().await;
            if let Some(drip) = &mut drip {
                queue.add_tokens(drip.next_tick().unwrap_or(0));
            }
            // Writers are always backlogged: keep 50 waiting.
            while waiting.len() < 50 {
                let tenant = waiting.len() as u64 % 3 + 1;
                waiting.push(tokio_test::task::spawn(queue.admit(write(tenant))));
            }
            let mut admitted = 0u64;
            waiting.retain_mut(|admit| match admit.poll() {
                Poll::Ready(result) => {
                    // Tokens are consumed: the permit returns nothing.
                    drop(result.expect("writes are admitted, never refused"));
                    admitted += 1;
                    false
                }
                Poll::Pending => true,
            });
            admitted_bytes += admitted * WRITE;
            // Unlimited intervals admit whatever is asked; cap the offered
            // load there at twice what compactions can take.
            if drip.is_none() && admitted_bytes > 2 * COMPACTION {
                break;
            }
        }
        // The interval's writes land in L0; compactions take some out.
        stats.flushed_bytes += admitted_bytes;
        stats.l0_bytes = (stats.l0_bytes + admitted_bytes).saturating_sub(COMPACTION);
        let sublevels = stats.l0_bytes / SUBLEVEL;
        stats.l0_sublevels = Some(sublevels);
        stats.l0_files = sublevels;
        sublevels_seen.push(sublevels);
    }
    // Unlimited at first, the debt grows until the listener limits tokens;
    // from then on admission follows compaction and L0 settles between the
    // point where tokens start to bind (5 sub-levels) and the full
    // threshold (20), instead of growing without bound.
    let settled = &sublevels_seen[20..];
    assert!(
        settled.iter().all(|&n| (5..=20).contains(&n)),
        "{sublevels_seen:?}"
    );
    // And the first, unlimited interval did run L0 up past that point.
    assert!(sublevels_seen[0] > 10, "{sublevels_seen:?}");
    let snapshot = queue.snapshot();
    assert!(!snapshot.granter.unlimited, "{snapshot:?}");
}
