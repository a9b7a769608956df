//! A rolling token rate: tokens per second over the last few seconds, so
//! the ETA follows the current speed rather than the whole run's average.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How far back the rate looks.
const WINDOW: Duration = Duration::from_secs(10);
/// Fewest token times needed before a rate is given.
const MIN_SAMPLES: usize = 2;

#[derive(Debug, Default)]
pub struct RollingRate {
    times: VecDeque<Instant>,
}

impl RollingRate {
    pub fn tick(&mut self, at: Instant) {
        self.times.push_back(at);
        while self
            .times
            .front()
            .is_some_and(|&t| at.duration_since(t) > WINDOW)
        {
            self.times.pop_front();
        }
    }

    /// Tokens per second over the window, once there is enough to say.
    pub fn per_second(&self) -> Option<f64> {
        if self.times.len() < MIN_SAMPLES {
            return None;
        }
        let (first, last) = (self.times.front()?, self.times.back()?);
        let span = last.duration_since(*first).as_secs_f64();
        (span > 0.0).then(|| (self.times.len() - 1) as f64 / span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_covers_the_recent_window() {
        let start = Instant::now();
        let mut r = RollingRate::default();
        assert_eq!(r.per_second(), None);
        for i in 0..5 {
            r.tick(start + Duration::from_millis(500 * i));
        }
        assert!((r.per_second().unwrap() - 2.0).abs() < 1e-9);
        // Much later, only recent ticks count.
        r.tick(start + Duration::from_secs(60));
        r.tick(start + Duration::from_millis(60_100));
        assert!((r.per_second().unwrap() - 10.0).abs() < 1e-6);
    }
}
