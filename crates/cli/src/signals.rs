//! Signals at the command's edge: a closed output pipe ends the process as it ends any
//! Unix filter, and Ctrl-C or SIGTERM removes the temporary file a command made.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering};

/// Restores the default action of SIGPIPE, which the Rust runtime ignores: `hytra ... |
/// head` then ends quietly when `head` exits, instead of panicking in `println!`.
pub fn default_sigpipe() {
    // SAFETY: SIG_DFL is a valid disposition for SIGPIPE and no handler code runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The stop signal that arrived (0: none yet).
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);

/// Whether a second stop signal ends the process at once ([`exit_on_second_signal`]).
static EXIT_ON_SECOND: AtomicBool = AtomicBool::new(false);

/// The NUL-terminated path the handler removes (null: none). Leaked on purpose: the
/// handler may read it at any moment until the process ends.
static TEMP_FILE: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_signal(sig: libc::c_int) {
    let again = INTERRUPTED.swap(sig, Ordering::SeqCst) != 0;
    let path = TEMP_FILE.load(Ordering::SeqCst);
    if !path.is_null() {
        // SAFETY: `path` came from `CString::into_raw` and is never freed; unlink(2) and
        // _exit(2) are async-signal-safe.
        unsafe {
            libc::unlink(path);
            libc::_exit(128 + sig);
        }
    }
    if again && EXIT_ON_SECOND.load(Ordering::SeqCst) {
        // SAFETY: _exit(2) is async-signal-safe.
        unsafe { libc::_exit(128 + sig) }
    }
}

/// Catches SIGINT and SIGTERM: [`interrupted`] turns true, and if a temporary file is
/// registered ([`remove_on_signal`]) it is removed and the process exits at once (128 +
/// the signal), since the run it feeds cannot be stopped sooner.
pub fn catch_stop_signals() {
    // SAFETY: `on_signal` only stores to atomics and makes async-signal-safe calls, and
    // has the signature signal(2) expects.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// As [`catch_stop_signals`], and a second signal ends the process at once (128 + the
/// signal): for a command whose first signal only stops it starting work (`hytra
/// swarm`), not for one that must clean up what it started (`hytra cluster` stops its
/// nodes).
pub fn exit_on_second_signal() {
    EXIT_ON_SECOND.store(true, Ordering::SeqCst);
    catch_stop_signals();
}

/// Whether SIGINT or SIGTERM arrived since [`catch_stop_signals`].
pub fn interrupted() -> bool {
    stop_signal().is_some()
}

/// The stop signal that arrived since [`catch_stop_signals`], if one did.
pub fn stop_signal() -> Option<i32> {
    Some(INTERRUPTED.load(Ordering::SeqCst)).filter(|&s| s != 0)
}

/// Registers the one temporary file a signal removes (before the file is created, so
/// that no instant leaves it behind), and installs the handlers.
pub fn remove_on_signal(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).expect("a temp path has no NUL byte");
    let old = TEMP_FILE.swap(c.into_raw(), Ordering::SeqCst);
    assert!(old.is_null(), "one temporary file per process");
    catch_stop_signals();
}
