//! The drain estimator behind early rejection: how fast admitted work
//! completes and how long each priority holds its slot. Apart from the
//! state machine because it is arithmetic over completions with rules of
//! its own; the state machine only feeds it holds and asks it for a rate.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::work::Priority;

/// The shortest window over which the completion rate is measured.
pub(super) const RATE_WINDOW: Duration = Duration::from_millis(10);

/// How fast the queue drains, for early rejection: the rate at which
/// admitted work completes, smoothed over windows of at least
/// [`RATE_WINDOW`]; how long admitted work of each priority holds its
/// slot (an EWMA per priority: bulk work that holds slots for milliseconds
/// says nothing about how long a short user request will); and how long
/// any admitted work holds one (an EWMA over every completion), for the
/// rate at which busy slots free up.
#[derive(Debug)]
pub(super) struct Drain {
    pub(super) since: Instant,
    /// `since + RATE_WINDOW` (`None` past the clock's range), so that the
    /// check on every enqueue is a comparison, not a subtraction.
    pub(super) window_ends: Option<Instant>,
    pub(super) completions: u64,
    pub(super) per_sec: f64,
    pub(super) hold: BTreeMap<Priority, Duration>,
    pub(super) any_hold: Option<Duration>,
    /// When a timed hold last began or ended.
    pub(super) last_event: Option<Instant>,
}

/// How many typical holds may pass without a hold beginning or ending
/// before the slots count as stalled: their holds then say nothing about
/// how fast they will free up (an exponential hold lasts four times its
/// mean once in fifty).
const STALLED_AFTER_HOLDS: u32 = 4;

/// How much longer than regular work's an elastic priority's typical hold
/// may be and still not be held to the elastic share (see
/// `QueueState::held_to_share`).
const LIKE_REGULAR_HOLDS: u32 = 2;

/// The EWMA of holds, weight 0.1. In integer nanoseconds: a hold may be as
/// long as the uptime, and nine tenths of one plus a tenth of another
/// never overflows there.
fn mix_hold(hold: &mut Duration, held: Duration) {
    let mixed = (hold.as_nanos() * 9 + held.as_nanos()) / 10;
    *hold = Duration::from_nanos(u64::try_from(mixed).unwrap_or(u64::MAX));
}

impl Drain {
    pub(super) fn held(&mut self, priority: Priority, held: Duration, now: Instant) {
        self.last_event = Some(now);
        self.hold
            .entry(priority)
            .and_modify(|hold| mix_hold(hold, held))
            .or_insert(held);
        match &mut self.any_hold {
            Some(hold) => mix_hold(hold, held),
            None => self.any_hold = Some(held),
        }
    }

    pub(super) fn hold(&self, priority: Priority) -> Option<Duration> {
        self.hold.get(&priority).copied()
    }

    /// Whether elastic work of `priority` holds its slots about as long as
    /// regular work holds theirs: its typical hold at most
    /// [`LIKE_REGULAR_HOLDS`] times the longest typical hold of a regular
    /// priority. `false` while either is unknown.
    pub(super) fn holds_like_regular(&self, priority: Priority) -> bool {
        let Some(elastic) = self.hold(priority) else {
            return false;
        };
        self.hold
            .range(Priority::NORMAL..)
            .map(|(_, &hold)| hold)
            .max()
            .is_some_and(|regular| elastic <= regular.saturating_mul(LIKE_REGULAR_HOLDS))
    }

    /// Grants a second that a request which has to wait can count on.
    ///
    /// A request waits only while every unit is taken, and then, by
    /// Little's law, `capacity` units each held for the typical hold free
    /// up at `capacity / hold` a second, however fast work happened to
    /// complete lately. The completion rate alone is the drain rate only
    /// under overload: at light load it is the arrival rate, far below
    /// what the slots drain at, and a short queue would then look hours
    /// long (one slot, 0.3 of its capacity offered, and two requests ahead
    /// read as 5 ms of wait for 1.5 ms of work, refusing high-priority
    /// work that would have made its deadline). So the faster of the two:
    /// the completion rate still counts where the hold is unknown (no
    /// slots: tokens are never returned) and where work completes faster
    /// than its holds say (holds that overlap on more units than the total,
    /// bypass work). And the completion rate alone where no hold has begun
    /// or ended for [`STALLED_AFTER_HOLDS`] typical holds: slots held far
    /// past their typical hold (stalled work, a dependency that hangs) free
    /// up at no rate the typical hold could tell, and the completion rate,
    /// falling window by window, is then the one that knows.
    pub(super) fn grants_per_sec(&self, capacity: Option<u64>, now: Instant) -> f64 {
        let freed = match (capacity, self.any_hold, self.last_event) {
            (Some(capacity), Some(hold), Some(last))
                if capacity > 0
                    && !hold.is_zero()
                    && now.saturating_duration_since(last)
                        <= hold.saturating_mul(STALLED_AFTER_HOLDS) =>
            {
                capacity as f64 / hold.as_secs_f64()
            }
            _ => 0.0,
        };
        self.per_sec.max(freed)
    }

    /// A request of `priority` was refused because of the typical hold (the
    /// wait ahead of it alone would have left it time). The estimate learns only from completions,
    /// and refused work never completes: one long hold would otherwise
    /// refuse the priority for good (high-priority work starved while lower
    /// priorities ran). Each such refusal takes a tenth off the estimate;
    /// an estimate that is right is pulled back up by the next completions.
    pub(super) fn refused_on_hold(&mut self, priority: Priority) {
        if let Some(hold) = self.hold.get_mut(&priority) {
            *hold = *hold * 9 / 10;
        }
    }

    /// Closes the current window if it is long enough. `busy` says whether
    /// work is waiting or holds capacity now: a window in which nothing
    /// completed and nothing was busy measured a lack of demand, not the
    /// drain rate, so it is skipped, keeping the last busy rate; otherwise an idle stretch would
    /// halve the rate toward zero every window and the next request to
    /// queue would be refused as if nothing ever completed.
    #[inline]
    pub(super) fn update(&mut self, now: Instant, busy: bool) {
        if self.window_ends.is_some_and(|ends| now >= ends) {
            self.close_window(now, busy);
        }
    }

    fn close_window(&mut self, now: Instant, busy: bool) {
        let elapsed = now.saturating_duration_since(self.since);
        if self.completions == 0 && !busy {
            self.start_window(now);
            return;
        }
        let observed = self.completions as f64 / elapsed.as_secs_f64();
        self.per_sec = if self.per_sec == 0.0 {
            observed
        } else {
            0.5 * self.per_sec + 0.5 * observed
        };
        self.start_window(now);
        self.completions = 0;
    }

    fn start_window(&mut self, now: Instant) {
        self.since = now;
        self.window_ends = now.checked_add(RATE_WINDOW);
    }
}
