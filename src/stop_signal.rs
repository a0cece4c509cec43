//! A stop flag for periodic background threads (a lease heartbeat, the
//! cancel watcher): they sleep on it between rounds and wake at once when
//! told to stop, instead of finishing their sleep.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Shared between an owner, which calls [`StopSignal::stop`], and a thread,
/// which sleeps with [`StopSignal::wait`]. Clones share the flag.
#[derive(Debug, Clone, Default)]
pub struct StopSignal(Arc<(Mutex<bool>, Condvar)>);

impl StopSignal {
    /// A signal not yet given.
    pub fn new() -> StopSignal {
        StopSignal::default()
    }

    /// Gives the signal: every current and later [`StopSignal::wait`]
    /// returns `true` at once.
    pub fn stop(&self) {
        let (stopped, wake) = &*self.0;
        *stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        wake.notify_all();
    }

    /// Sleeps up to `timeout`; `true` when the signal was given (before or
    /// during the sleep).
    pub fn wait(&self, timeout: Duration) -> bool {
        let (stopped, wake) = &*self.0;
        let guard = stopped.lock().unwrap_or_else(|p| p.into_inner());
        let (guard, _) = wake
            .wait_timeout_while(guard, timeout, |stopped| !*stopped)
            .unwrap_or_else(|p| p.into_inner());
        *guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_wait_ends_at_the_signal_or_the_timeout() {
        let signal = StopSignal::new();
        let started = Instant::now();
        assert!(!signal.wait(Duration::from_millis(50)));
        assert!(started.elapsed() >= Duration::from_millis(50));
        let sleeper = {
            let signal = signal.clone();
            std::thread::spawn(move || signal.wait(Duration::from_secs(3600)))
        };
        std::thread::sleep(Duration::from_millis(50));
        signal.stop();
        assert!(sleeper.join().unwrap());
        // Given before the wait: no sleep at all.
        let started = Instant::now();
        assert!(signal.wait(Duration::from_secs(3600)));
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
