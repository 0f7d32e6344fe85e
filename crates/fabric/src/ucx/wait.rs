//! Event-driven waiting ([`UcxWaiting::Event`](super::UcxWaiting::Event)): a thread none
//! of whose workers has work drains UCP's pending events, arms every worker's event file
//! descriptor, and sleeps in `ppoll` on all of them until one is readable, a program's
//! timer is due, or [`EVENT_WAIT_MAX`](super::EVENT_WAIT_MAX) passes.
//!
//! The order matters: UCP arms only a worker with no events left (`ucp_worker_arm` says
//! busy otherwise), and progress may have put completions or datagrams in the shim's
//! rings after the programs last looked, which UCP knows nothing of; the shim's arm
//! checks those too. A thread that finds either goes back to stepping instead of
//! sleeping.

use std::time::Duration;

use super::endpoint::Progress;
use crate::endpoint::BackendError;

/// Progress calls per worker before arming: UCP refuses to arm while events remain, and a
/// worker that keeps producing them has work, so the thread steps again instead.
const PROGRESS_BEFORE_ARM_MAX: usize = 8;

/// The event fds of one thread's workers.
pub(crate) struct Sleeper {
    workers: Vec<Progress>,
    fds: Vec<libc::pollfd>,
    /// Longest sleep.
    cap: Duration,
    /// Sleeps, and those an event ended.
    pub(crate) sleeps: u64,
    pub(crate) wakeups: u64,
}

impl Sleeper {
    /// A sleeper over `workers` (whose context was made for event waiting), sleeping at
    /// most `cap` at a time.
    pub(crate) fn new(workers: &[Progress], cap: Duration) -> Result<Sleeper, BackendError> {
        assert!(!cap.is_zero(), "an event wait needs a positive bound");
        let fds = workers
            .iter()
            .map(|w| Ok(libc::pollfd { fd: w.efd()?, events: libc::POLLIN, revents: 0 }))
            .collect::<Result<Vec<_>, BackendError>>()?;
        Ok(Sleeper { workers: workers.to_vec(), fds, cap, sleeps: 0, wakeups: 0 })
    }

    /// Sleeps until an event, `wake_at_ns` (on the run's clock, whose time is `now_ns`)
    /// or the cap, unless work is pending.
    pub(crate) fn rest(
        &mut self,
        wake_at_ns: Option<u64>,
        now_ns: u64,
    ) -> Result<(), BackendError> {
        let mut timeout_ns = u64::try_from(self.cap.as_nanos()).unwrap_or(u64::MAX);
        if let Some(at) = wake_at_ns {
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
