//! Handing an interval's tokens out in ticks.

/// Distributes `total` tokens over `ticks` ticks: each tick gives
/// `ceil(remaining / remaining ticks)`, recomputed every tick, so the
/// interval's total is exact and never exceeded, and early ticks are never
/// starved by rounding (upstream's rule): 1,250 tokens over 60 ticks are
/// 50 ticks of 21 and 10 of 20.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TokenDrip {
    total: u64,
    ticks: u64,
    given: u64,
    tick: u64,
}

impl TokenDrip {
    /// A drip of `total` tokens over `ticks` ticks (zero ticks give nothing).
    pub(crate) fn new(total: u64, ticks: u64) -> Self {
        TokenDrip {
            total,
            ticks,
            given: 0,
            tick: 0,
        }
    }

    /// The next tick's tokens, or `None` once every tick has been given.
    #[cfg(test)]
    pub(crate) fn next_tick(&mut self) -> Option<u64> {
        let remaining_ticks = self.ticks.checked_sub(self.tick).filter(|&n| n > 0)?;
        let remaining = self.total - self.given;
        let now = remaining.div_ceil(remaining_ticks);
        self.given += now;
        self.tick += 1;
        Some(now)
    }

    /// The next tick's tokens when the caller knows how many ticks are left
    /// (from the time left in the interval, so a ticker that runs late does
    /// not leave tokens undistributed): `ceil(remaining / ticks_left)`, and
    /// everything on the last.
    pub(crate) fn take(&mut self, ticks_left: u64) -> u64 {
        let remaining = self.total - self.given;
        let now = remaining.div_ceil(ticks_left.max(1));
        self.given += now;
        self.tick = self.tick.saturating_add(1);
        now
    }

    /// Tokens still to be given this interval.
    #[cfg(test)]
    pub(crate) fn remaining(&self) -> u64 {
        self.total - self.given
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_is_exact_for_any_split() {
        for (total, ticks) in [
            (0, 5),
            (1, 60),
            (59, 60),
            (61, 60),
            (u64::MAX, 15_000),
            (7, 1),
        ] {
            let mut drip = TokenDrip::new(total, ticks);
            let given: Vec<u64> = std::iter::from_fn(|| drip.next_tick()).collect();
            assert_eq!(given.len() as u64, ticks);
            let sum = given
                .iter()
                .fold(0u64, |sum, &n| sum.checked_add(n).unwrap());
            assert_eq!(sum, total, "{total} over {ticks}");
            assert!(
                given.windows(2).all(|w| w[0] >= w[1]),
                "never more later than earlier"
            );
            assert_eq!(drip.remaining(), 0);
        }
        assert_eq!(TokenDrip::new(10, 0).next_tick(), None);
    }

    #[test]
    fn a_late_ticker_still_gives_the_whole_total() {
        // 100 tokens planned over 10 ticks, but the ticker only managed 4:
        // it said 10, 7, 3 and 1 ticks were left.
        let mut drip = TokenDrip::new(100, 10);
        let given: Vec<u64> = [10, 7, 3, 1].iter().map(|&left| drip.take(left)).collect();
        assert_eq!(given, [10, 13, 26, 51]);
        assert_eq!(drip.remaining(), 0);
        assert_eq!(drip.take(5), 0);
    }

    #[test]
    fn drips_of_any_size_give_their_total_without_panicking() {
        let mut drip = TokenDrip::new(u64::MAX, u64::MAX);
        assert_eq!(drip.next_tick(), Some(1));
        assert_eq!(drip.take(0), u64::MAX - 1, "zero ticks left: everything");
        assert_eq!(drip.remaining(), 0);
        assert_eq!(drip.take(u64::MAX), 0);
        let mut empty = TokenDrip::new(0, u64::MAX);
        assert_eq!(empty.take(1), 0);
    }

    #[test]
    fn an_interval_is_cut_into_ticks_that_round_up() {
        let mut drip = TokenDrip::new(1250, 60);
        let ticks: Vec<u64> = std::iter::from_fn(|| drip.next_tick()).collect();
        assert_eq!(ticks.len(), 60);
        assert_eq!(ticks.iter().filter(|&&n| n == 21).count(), 50);
        assert_eq!(ticks.iter().filter(|&&n| n == 20).count(), 10);
        assert_eq!(ticks.iter().sum::<u64>(), 1250);
    }
}
