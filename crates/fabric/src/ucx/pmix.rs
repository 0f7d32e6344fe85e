//! The PMIx bootstrap (feature `pmix`): an [`Exchange`] over the key-value store of the
//! launcher that started this process (`srun --mpi=pmix`, `mpirun`). Every process
//! publishes its blob with Put/Commit, a Fence over the whole job makes it visible, and
//! each reads what it needs with Get. No process listens on a port and none is a single
//! point of failure: the launcher's servers carry everything, the results of a run
//! included. Not for: hosts without a launcher (see [`super::TcpExchange`]).
//!
//! Every collective of the job has a number, the same in every process since all call
//! them in the same order; a blob is published under `hytra.<number>`. The end of a
//! run is decided as with TCP, by [`Waves`]: while it is done, each process publishes
//! its [`Quiescence`] and joins a non-blocking fence; every process sees the same
//! snapshots and so stops at the same wave.
//!
//! `libpmix` is loaded when [`PmixExchange::join`] is called, not linked: the binary
//! runs without it, and a launcher-started process on a host without it gets a clear
//! error. `HYTRA_PMIX_LIB` names another library (a site's own PMIx).

use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use super::exchange::{Exchange, Quiescence, Waves};
use crate::endpoint::BackendError;

mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    /// The shim's handle: the loaded library and this process's place in the job.
    #[repr(C)]
    pub(super) struct Pmix {
        _private: [u8; 0],
    }

    extern "C" {
        pub(super) fn hx_pmix_init(
            lib: *const c_char,
            rank: *mut u32,
            size: *mut u32,
            err: *mut c_char,
            err_len: usize,
        ) -> *mut Pmix;
        pub(super) fn hx_pmix_put(
            p: *mut Pmix,
            key: *const c_char,
            data: *const c_void,
            len: usize,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
        pub(super) fn hx_pmix_commit(p: *mut Pmix, err: *mut c_char, err_len: usize) -> c_int;
        pub(super) fn hx_pmix_fence_start(
            p: *mut Pmix,
            collect: c_int,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
        pub(super) fn hx_pmix_fence_poll(p: *mut Pmix, err: *mut c_char, err_len: usize) -> c_int;
        pub(super) fn hx_pmix_get(
            p: *mut Pmix,
            rank: u32,
            key: *const c_char,
            timeout_s: c_int,
            data: *mut *mut c_void,
            len: *mut usize,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
        pub(super) fn hx_pmix_free(data: *mut c_void);
        pub(super) fn hx_pmix_finalize(p: *mut Pmix);
    }
}

/// Length of the error buffers handed to the shim.
const ERR_LEN: usize = 512;
/// The largest value put under one key: larger blobs (a node's results) are cut into
/// pieces of this size. PMIx's shared-memory store (`gds/ds21`, Open MPI's default) keeps
/// a value in one data segment and fails on a value larger than one (4 MiB there).
const PIECE_BYTES: usize = 1 << 20;
/// The most pieces a blob may have (4 GiB, as the TCP bootstrap's largest frame).
const PIECES_MAX: u32 = 4096;
/// Bytes of a published [`Quiescence`]: done, sent, received.
const QUIESCENCE_BYTES: usize = 17;
/// How long a wait sleeps between two polls of a fence: short next to a fence's round
/// trip through the launcher's servers, long enough not to take a core from workers.
const FENCE_POLL: Duration = Duration::from_micros(200);
/// The first gap between two quiescence waves, and the largest. A wave costs a fence
/// through the launcher and leaves a key in its store, so waves that find the cluster
/// still busy come further and further apart (x1.25 each): a 60 s drain makes at most a
/// few thousand.
const WAVE_GAP_FIRST: Duration = Duration::from_millis(1);
const WAVE_GAP_MAX: Duration = Duration::from_millis(50);
const _: () = assert!(WAVE_GAP_FIRST.as_nanos() < WAVE_GAP_MAX.as_nanos());

fn err(msg: impl Into<String>) -> BackendError {
    BackendError::Cluster(msg.into())
}

fn text(buf: &[c_char; ERR_LEN]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A quiescence wave in progress: the key this process published its state under.
struct Wave {
    key: String,
}

/// This process's membership of a PMIx job, as an [`Exchange`].
pub struct PmixExchange {
    raw: NonNull<ffi::Pmix>,
    rank: u32,
    size: u32,
    timeout: Duration,
    /// Collectives so far (the number in the next key).
    seq: u64,
    wave: Option<Wave>,
    waves: Waves,
    wave_gap: Duration,
    next_wave: Instant,
    stopped: bool,
}

// SAFETY: the PMIx client library is thread-safe (its own progress thread serves every
// call), and the shim's handle is only used through `&mut self`, so by one thread at a
// time; nothing in it is tied to the thread that created it.
unsafe impl Send for PmixExchange {}

impl std::fmt::Debug for PmixExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmixExchange").field("rank", &self.rank).field("size", &self.size).finish()
    }
}

impl PmixExchange {
    /// Loads libpmix (`HYTRA_PMIX_LIB`, else the system's `libpmix.so.2`) and joins the
    /// launcher's job. `timeout` bounds every later collective.
    pub fn join(timeout: Duration) -> Result<PmixExchange, BackendError> {
        let lib = std::env::var("HYTRA_PMIX_LIB").ok().filter(|l| !l.is_empty());
        let lib = lib
            .map(CString::new)
            .transpose()
            .map_err(|_| err("HYTRA_PMIX_LIB holds a NUL byte"))?;
        let (mut rank, mut size) = (0u32, 0u32);
        let mut e = [0; ERR_LEN];
        // SAFETY: `lib` is a valid C string or null; the out-pointers are live locals;
        // `e` is a writable buffer of ERR_LEN bytes.
        let raw = unsafe {
            ffi::hx_pmix_init(
                lib.as_ref().map_or(std::ptr::null(), |l| l.as_ptr()),
                &mut rank,
                &mut size,
                e.as_mut_ptr(),
                e.len(),
            )
        };
        let raw = NonNull::new(raw).ok_or_else(|| err(format!("PMIx: {}", text(&e))))?;
        Ok(PmixExchange {
            raw,
            rank,
            size,
            timeout,
            seq: 0,
            wave: None,
            waves: Waves::default(),
            wave_gap: WAVE_GAP_FIRST,
            next_wave: Instant::now(),
            stopped: false,
        })
    }

    /// This process's rank in the job.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// How many processes the job has.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Checks that every process of the job presents `token` (they read the same
    /// cluster file); a collective, so every process must call it.
    pub fn check_token(&mut self, token: &str) -> Result<(), BackendError> {
        let all = self.allgather(token.as_bytes().to_vec())?;
        match all.iter().position(|t| t != token.as_bytes()) {
            Some(r) => Err(err(format!(
                "rank {r} presented another cluster token than rank {}: do all processes read the same cluster file?",
                self.rank
            ))),
            None => Ok(()),
        }
    }

    fn next_key(&mut self) -> String {
        self.seq += 1;
        format!("hytra.{}", self.seq)
    }

    /// Publishes `data` under `key` and commits it: the first key holds the number of
    /// pieces and the first piece, `key.1`, `key.2`, ... the others.
    fn put(&mut self, key: &str, data: &[u8]) -> Result<(), BackendError> {
        let pieces: Vec<&[u8]> =
            if data.is_empty() { vec![data] } else { data.chunks(PIECE_BYTES).collect() };
        let count =
            u32::try_from(pieces.len()).ok().filter(|&c| c <= PIECES_MAX).ok_or_else(|| {
                err(format!("a blob of {} bytes is too large to publish", data.len()))
            })?;
        let mut first = Vec::with_capacity(4 + pieces[0].len());
        first.extend_from_slice(&count.to_le_bytes());
        first.extend_from_slice(pieces[0]);
        self.put_one(key, &first)?;
        for (i, piece) in pieces.iter().enumerate().skip(1) {
            self.put_one(&format!("{key}.{i}"), piece)?;
        }
        let mut e = [0; ERR_LEN];
        // SAFETY: the handle is alive (dropped only with self); `e` is a writable buffer.
        let rc = unsafe { ffi::hx_pmix_commit(self.raw.as_ptr(), e.as_mut_ptr(), e.len()) };
        if rc != 0 {
            return Err(err(text(&e)));
        }
        Ok(())
    }

    fn put_one(&mut self, key: &str, data: &[u8]) -> Result<(), BackendError> {
        let k = CString::new(key).expect("keys are ASCII");
        let mut e = [0; ERR_LEN];
        // SAFETY: the handle is alive (dropped only with self); `data` is readable for
        // its length and only read during the call; `k` and `e` are valid buffers.
        let rc = unsafe {
            ffi::hx_pmix_put(
                self.raw.as_ptr(),
                k.as_ptr(),
                data.as_ptr().cast(),
                data.len(),
                e.as_mut_ptr(),
                e.len(),
            )
        };
        if rc != 0 {
            return Err(err(text(&e)));
        }
        Ok(())
    }

    fn fence_start(&mut self, collect: bool) -> Result<(), BackendError> {
        let mut e = [0; ERR_LEN];
        // SAFETY: the handle is alive; `e` is a writable buffer of ERR_LEN bytes.
        let rc = unsafe {
            ffi::hx_pmix_fence_start(
                self.raw.as_ptr(),
                c_int::from(collect),
                e.as_mut_ptr(),
                e.len(),
            )
        };
        if rc != 0 {
            return Err(err(text(&e)));
        }
        Ok(())
    }

    /// Whether the fence in progress is over.
    fn fence_poll(&mut self) -> Result<bool, BackendError> {
        let mut e = [0; ERR_LEN];
        // SAFETY: as for `fence_start`.
        let rc = unsafe { ffi::hx_pmix_fence_poll(self.raw.as_ptr(), e.as_mut_ptr(), e.len()) };
        match rc {
            1 => Ok(true),
            0 => Ok(false),
            _ => Err(err(text(&e))),
        }
    }

    /// Waits for the fence in progress, at most the exchange's timeout.
    fn fence_wait(&mut self) -> Result<(), BackendError> {
        let deadline = Instant::now() + self.timeout;
        while !self.fence_poll()? {
            if Instant::now() > deadline {
                return Err(err(format!(
                    "the other processes of the PMIx job did not reach the same point within {} s",
                    self.timeout.as_secs()
                )));
            }
            std::thread::sleep(FENCE_POLL);
        }
        Ok(())
    }

    fn fence(&mut self, collect: bool) -> Result<(), BackendError> {
        self.fence_start(collect)?;
        self.fence_wait()
    }

    /// What `rank` published under `key` with [`PmixExchange::put`].
    fn get(&mut self, rank: u32, key: &str) -> Result<Vec<u8>, BackendError> {
        let first = self.get_one(rank, key)?;
        let malformed = || err(format!("rank {rank} published a malformed blob under {key}"));
        let (count, piece) = first.split_first_chunk::<4>().ok_or_else(malformed)?;
        let count = u32::from_le_bytes(*count);
        if count == 0 || count > PIECES_MAX {
            return Err(malformed());
        }
        let mut data = piece.to_vec();
        for i in 1..count {
            data.extend_from_slice(&self.get_one(rank, &format!("{key}.{i}"))?);
        }
        Ok(data)
    }

    fn get_one(&mut self, rank: u32, key: &str) -> Result<Vec<u8>, BackendError> {
        let k = CString::new(key).expect("keys are ASCII");
        let mut data: *mut c_void = std::ptr::null_mut();
        let mut len = 0usize;
        let mut e = [0; ERR_LEN];
        let timeout_s = c_int::try_from(self.timeout.as_secs().max(1)).unwrap_or(c_int::MAX);
        // SAFETY: the handle is alive; every pointer refers to a live local.
        let rc = unsafe {
            ffi::hx_pmix_get(
                self.raw.as_ptr(),
                rank,
                k.as_ptr(),
                timeout_s,
                &mut data,
                &mut len,
                e.as_mut_ptr(),
                e.len(),
            )
        };
        if rc != 0 {
            return Err(err(text(&e)));
        }
        if len == 0 {
            // SAFETY: a buffer the shim handed over (or null), released once.
            unsafe { ffi::hx_pmix_free(data) };
            return Ok(Vec::new());
        }
        // SAFETY: on success the shim handed over a malloc'd buffer of `len` bytes that
        // only this call owns; it is copied, then released exactly once.
        let v = unsafe {
            let v = std::slice::from_raw_parts(data.cast::<u8>(), len).to_vec();
            ffi::hx_pmix_free(data);
            v
        };
        Ok(v)
    }

    /// A wave left over from a run that ended early (time limit): finish it, so that
    /// the next collective is matched with the same one everywhere.
    fn settle_wave(&mut self) -> Result<(), BackendError> {
        if self.wave.take().is_some() {
            self.fence_wait()?;
        }
        Ok(())
    }

    fn start_wave(&mut self, local: Quiescence) -> Result<(), BackendError> {
        let key = self.next_key();
        let mut q = [0u8; QUIESCENCE_BYTES];
        q[0] = u8::from(local.done);
        q[1..9].copy_from_slice(&local.sent.to_le_bytes());
        q[9..].copy_from_slice(&local.received.to_le_bytes());
        self.put(&key, &q)?;
        self.fence_start(true)?;
        self.wave = Some(Wave { key });
        Ok(())
    }

    fn finish_wave(&mut self, key: &str) -> Result<bool, BackendError> {
        let mut parts = Vec::with_capacity(self.size as usize);
        for r in 0..self.size {
            let b = self.get(r, key)?;
            let b: [u8; QUIESCENCE_BYTES] = b
                .try_into()
                .map_err(|_| err(format!("rank {r} published a malformed run state")))?;
            parts.push(Quiescence {
                done: b[0] != 0,
                sent: u64::from_le_bytes(b[1..9].try_into().expect("8 bytes")),
                received: u64::from_le_bytes(b[9..].try_into().expect("8 bytes")),
                by_node: Vec::new(),
            });
        }
        Ok(self.waves.observe(parts))
    }
}

impl Exchange for PmixExchange {
    fn allgather(&mut self, mine: Vec<u8>) -> Result<Vec<Vec<u8>>, BackendError> {
        self.settle_wave()?;
        self.stopped = false;
        self.waves = Waves::default();
        self.wave_gap = WAVE_GAP_FIRST;
        let key = self.next_key();
        self.put(&key, &mine)?;
        self.fence(true)?;
        (0..self.size)
            .map(|r| if r == self.rank { Ok(mine.clone()) } else { self.get(r, &key) })
            .collect()
    }

    fn gather(&mut self, mine: Vec<u8>) -> Result<Option<Vec<Vec<u8>>>, BackendError> {
        self.settle_wave()?;
        let key = self.next_key();
        self.put(&key, &mine)?;
        // Only rank 0 reads the blobs: they are fetched from their owners' servers
        // instead of being copied to every process.
        self.fence(false)?;
        let all = if self.rank == 0 {
            let mut all = vec![mine];
            for r in 1..self.size {
                all.push(self.get(r, &key)?);
            }
            Some(all)
        } else {
            None
        };
        // Nobody leaves the job (and so perhaps takes its data along) before rank 0
        // has everything.
        self.fence(false)?;
        Ok(all)
    }

    fn poll_done(&mut self, local: Quiescence) -> Result<bool, BackendError> {
        if self.stopped {
            return Ok(true);
        }
        if self.wave.is_some() {
            if !self.fence_poll()? {
                return Ok(false);
            }
            let key = self.wave.take().expect("a wave in progress").key;
            if self.finish_wave(&key)? {
                self.stopped = true;
                return Ok(true);
            }
            self.next_wave = Instant::now() + self.wave_gap;
            self.wave_gap = (self.wave_gap * 5 / 4).min(WAVE_GAP_MAX);
            return Ok(false);
        }
        if local.done && Instant::now() >= self.next_wave {
            self.start_wave(local)?;
        }
        Ok(false)
    }
}

impl Drop for PmixExchange {
    fn drop(&mut self) {
        // SAFETY: the handle came from hx_pmix_init and is released exactly once, here.
        unsafe { ffi::hx_pmix_finalize(self.raw.as_ptr()) }
    }
}
