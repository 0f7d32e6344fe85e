//! Event-driven waiting ([`UcxWaiting::Event`](super::UcxWaiting::Event)): a thread none
//! of whose workers has had work for [`EVENT_SPIN`](super::EVENT_SPIN) drains UCP's
//! pending events, arms every worker's event file descriptor, and sleeps in `ppoll` on
//! all of them until one is readable, a program's timer is due, or
//! [`EVENT_WAIT_MAX`](super::EVENT_WAIT_MAX) passes. Before that it yields, as a polling
//! thread does.
//!
//! The order matters: UCP arms only a worker with no events left (`ucp_worker_arm` says
//! busy otherwise), and progress may have put completions or datagrams in the shim's
//! rings after the programs last looked, which UCP knows nothing of; the shim's arm
//! checks those too. A thread that finds either goes back to stepping instead of
//! sleeping.

use std::time::Duration;

use super::endpoint::Progress;
use crate::endpoint::BackendError;
use crate::stepper::Rest;

/// Progress calls per worker before arming: UCP refuses to arm while events remain, and a
/// worker that keeps producing them has work, so the thread steps again instead.
const PROGRESS_BEFORE_ARM_MAX: usize = 8;

/// The event fds of one thread's workers.
pub(crate) struct Sleeper {
    workers: Vec<Progress>,
    fds: Vec<libc::pollfd>,
    /// Longest sleep.
    cap: Duration,
    /// When the thread may sleep.
    spin: Spin,
    /// Sleeps, and those an event ended.
    pub(crate) sleeps: u64,
    pub(crate) wakeups: u64,
}

impl Sleeper {
    /// A sleeper over `workers` (whose context was made for event waiting), sleeping at
    /// most `cap` at a time, once its thread has been idle for `spin`.
    pub(crate) fn new(
        workers: &[Progress],
        cap: Duration,
        spin: Duration,
    ) -> Result<Sleeper, BackendError> {
        assert!(!cap.is_zero(), "an event wait needs a positive bound");
        let fds = workers
            .iter()
            .map(|w| Ok(libc::pollfd { fd: w.efd()?, events: libc::POLLIN, revents: 0 }))
            .collect::<Result<Vec<_>, BackendError>>()?;
        Ok(Sleeper {
            workers: workers.to_vec(),
            fds,
            cap,
            spin: Spin::new(spin),
            sleeps: 0,
            wakeups: 0,
        })
    }

    /// Yields while the thread has been idle for less than the spin, then sleeps until an
    /// event, `rest.wake_at` (on the run's clock, whose time is `now_ns`) or the cap,
    /// unless work is pending.
    pub(crate) fn rest(&mut self, rest: Rest, now_ns: u64) -> Result<(), BackendError> {
        if !self.spin.may_sleep(rest, now_ns) {
            std::thread::yield_now();
            return Ok(());
        }
        let mut timeout_ns = u64::try_from(self.cap.as_nanos()).unwrap_or(u64::MAX);
        if let Some(at) = rest.wake_at {
            if at <= now_ns {
                return Ok(());
            }
            timeout_ns = timeout_ns.min(at - now_ns);
        }
        for w in &self.workers {
            for _ in 0..PROGRESS_BEFORE_ARM_MAX {
                if w.run() == 0 {
                    break;
                }
            }
            if !w.arm()? {
                return Ok(());
            }
        }
        for f in &mut self.fds {
            f.revents = 0;
        }
        let ts = libc::timespec {
            tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: `fds` is a live array of `fds.len()` pollfd entries that ppoll may write
        // `revents` into; `ts` is a live timespec; a null signal mask leaves it unchanged.
        let n = unsafe {
            libc::ppoll(
                self.fds.as_mut_ptr(),
                self.fds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        self.sleeps += 1;
        if n > 0 {
            self.wakeups += 1;
        } else if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(BackendError::Config(format!("UCX event wait: ppoll: {e}")));
            }
        }
        Ok(())
    }
}

/// When an idle thread may sleep: once its idle rounds in a row have lasted the spin. A
/// reply is usually a few microseconds away, and a sleep before it arrives costs a
/// wake-up that yielding does not (docs/PERFORMANCE.md §50).
#[derive(Debug)]
struct Spin {
    spin_ns: u64,
    /// When the current run of idle rounds began (on the run's clock).
    idle_since_ns: u64,
}

impl Spin {
    fn new(spin: Duration) -> Spin {
        let spin_ns = u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX);
        Spin { spin_ns, idle_since_ns: 0 }
    }

    /// Whether the thread, idle again in `rest` at `now_ns`, has been idle long enough.
    fn may_sleep(&mut self, rest: Rest, now_ns: u64) -> bool {
        assert!(rest.idle_rounds >= 1, "a thread rests only after an idle round");
        if rest.idle_rounds == 1 {
            self.idle_since_ns = now_ns;
        }
        now_ns >= self.idle_since_ns.saturating_add(self.spin_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(rounds: u64) -> Rest {
        Rest { wake_at: None, idle_rounds: rounds }
    }

    #[test]
    fn a_thread_sleeps_only_once_idle_for_the_spin_in_a_row() {
        let mut s = Spin::new(Duration::from_micros(50));
        assert!(!s.may_sleep(idle(1), 1_000));
        assert!(!s.may_sleep(idle(2), 50_999));
        assert!(s.may_sleep(idle(3), 51_000));
        assert!(s.may_sleep(idle(4), 52_000));
        // Work between (the count starts again) restarts the spin.
        assert!(!s.may_sleep(idle(1), 60_000));
        assert!(!s.may_sleep(idle(2), 109_999));
        assert!(s.may_sleep(idle(3), 110_000));
    }

    #[test]
    fn without_a_spin_the_first_idle_round_sleeps_and_a_long_one_never_ends() {
        assert!(Spin::new(Duration::ZERO).may_sleep(idle(1), 5));
        let mut forever = Spin::new(Duration::MAX);
        assert!(!forever.may_sleep(idle(1), 0));
        assert!(!forever.may_sleep(idle(1_000_000), u64::MAX - 1));
    }
}
