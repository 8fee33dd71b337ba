//! A timeout that is cheap to push back. Every request on a kept-alive connection moves its
//! deadlines later; re-registering a timer each time showed in profiles, so the timer here is
//! only re-armed when it fires early (or must fire sooner than it is set for).

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// When nothing is due: far enough away to never fire in practice.
const IDLE: Duration = Duration::from_secs(24 * 3600);

pub struct Deadline {
    sleep: Pin<Box<Sleep>>,
    due: Option<Instant>,
}

impl Deadline {
    pub fn new() -> Self {
        Self {
            sleep: Box::pin(tokio::time::sleep(IDLE)),
            due: None,
        }
    }

    pub fn set(&mut self, due: std::time::Instant) {
        let due = Instant::from_std(due);
        if due < self.sleep.deadline() {
            self.sleep.as_mut().reset(due);
        }
        self.due = Some(due);
    }

    /// Completes once the deadline set last has passed.
    pub async fn expired(&mut self) {
        std::future::poll_fn(|cx| self.poll_expired(cx)).await;
    }

    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            ready!(self.sleep.as_mut().poll(cx));
            let now = Instant::now();
            match self.due {
                Some(due) if now >= due => return Poll::Ready(()),
                Some(due) => self.sleep.as_mut().reset(due),
                None => self.sleep.as_mut().reset(now + IDLE),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fires_at_the_latest_deadline_set() {
        // Paused time moves tokio's clock only, so "now" comes from it.
        let start = Instant::now().into_std();
        let mut d = Deadline::new();
        d.set(start + Duration::from_secs(1));
        d.set(start + Duration::from_secs(3));
        let t = Instant::now();
        d.expired().await;
        assert!(t.elapsed() >= Duration::from_secs(3), "{:?}", t.elapsed());
        // Sooner than the armed timer: re-armed at once.
        let now = Instant::now().into_std();
        d.set(now + Duration::from_secs(10));
        d.set(now + Duration::from_millis(500));
        let t = Instant::now();
        d.expired().await;
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(500) && waited < Duration::from_secs(1),
            "{waited:?}"
        );
    }
}
