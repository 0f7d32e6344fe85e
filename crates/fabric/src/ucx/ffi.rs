//! Declarations of `shim.c`, the C layer over UCP. Every call is `unsafe`; the safe
//! wrappers in this module's parent state why each use is sound.

use std::ffi::{c_char, c_int, c_void};

/// Opaque UCP context (`ucp_context_h`).
#[repr(C)]
pub(crate) struct Context {
    _private: [u8; 0],
}
/// Opaque UCP memory handle (`ucp_mem_h`).
#[repr(C)]
pub(crate) struct MemHandle {
    _private: [u8; 0],
}
/// The shim's worker: a UCP worker with its completion and datagram rings.
#[repr(C)]
pub(crate) struct Worker {
    _private: [u8; 0],
}
/// The shim's endpoint: a UCP endpoint with its in-flight count and failure state.
#[repr(C)]
pub(crate) struct Ep {
    _private: [u8; 0],
}
/// Opaque unpacked remote key (`ucp_rkey_h`).
#[repr(C)]
pub(crate) struct RkeyHandle {
    _private: [u8; 0],
}

/// What `hx_get`, `hx_put` and `hx_atomic` return when the endpoint's peer has failed
/// (`HX_EP_FAILED` in the shim): nothing was posted.
pub(crate) const HX_EP_FAILED: c_int = 1;

/// A completion as the shim reports it.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub(crate) struct Cqe {
    pub(crate) wr_id: u64,
    pub(crate) value: u64,
    /// The connection and sequence number given at post time.
    pub(crate) tag: u64,
    /// 0 on success, else a negative `ucs_status_t`.
    pub(crate) status: i32,
    pub(crate) _pad: i32,
}

extern "C" {
    pub(crate) fn hx_context_create(
        tls: *const c_char,
        atomic_mode: *const c_char,
        wakeup: c_int,
        err: *mut c_char,
        err_len: usize,
    ) -> *mut Context;
    pub(crate) fn hx_context_destroy(ctx: *mut Context);
    pub(crate) fn hx_mem_alloc(
        ctx: *mut Context,
        len: usize,
        huge: c_int,
        memh: *mut *mut MemHandle,
        addr: *mut *mut c_void,
        rkey_buf: *mut *mut c_void,
        rkey_len: *mut usize,
        mapped: *mut usize,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub(crate) fn hx_rkey_buffer_release(buf: *mut c_void);
    pub(crate) fn hx_mem_free(
        ctx: *mut Context,
        memh: *mut MemHandle,
        addr: *mut c_void,
        mapped: usize,
    );

    pub(crate) fn hx_worker_create(
        ctx: *mut Context,
        nodes: u32,
        per_node: u32,
        addr: *mut *mut c_void,
        addr_len: *mut usize,
        err: *mut c_char,
        err_len: usize,
    ) -> *mut Worker;
    pub(crate) fn hx_worker_address_release(w: *mut Worker, addr: *mut c_void);
    pub(crate) fn hx_worker_destroy(w: *mut Worker);
    pub(crate) fn hx_progress(w: *mut Worker) -> u32;
    /// How many `hx_progress` calls the worker has had.
    pub(crate) fn hx_progress_calls(w: *const Worker) -> u64;
    /// 1 if an operation, datagram or endpoint flush was handed to UCP or queued for it
    /// after the last `hx_progress` call, else 0.
    pub(crate) fn hx_submitted_since_progress(w: *const Worker) -> c_int;
    pub(crate) fn hx_worker_flush_poll(w: *mut Worker) -> i32;
    pub(crate) fn hx_poll(w: *mut Worker, out: *mut Cqe, max: usize) -> usize;
    pub(crate) fn hx_recv(w: *mut Worker, from: *mut u32, buf: *mut u8, buf_len: usize) -> i64;
    pub(crate) fn hx_dropped(w: *const Worker) -> u64;
    /// The worker's event fd, or -1 with the reason in `err`.
    pub(crate) fn hx_worker_efd(w: *mut Worker, err: *mut c_char, err_len: usize) -> c_int;
    /// 1: armed with nothing pending (the thread may sleep on the fd); 0: work pending;
    /// -1: a UCP error.
    pub(crate) fn hx_worker_arm(w: *mut Worker) -> c_int;
    /// Adds the worker's datagrams by peer node to `sent` and `received` (`nodes` long
    /// each); callable from any thread while the worker lives.
    pub(crate) fn hx_datagram_counts_by_node(
        w: *const Worker,
        sent: *mut u64,
        received: *mut u64,
        nodes: usize,
    );

    pub(crate) fn hx_ep_create(
        w: *mut Worker,
        addr: *const c_void,
        peer_errors: c_int,
        err: *mut c_char,
        err_len: usize,
    ) -> *mut Ep;
    pub(crate) fn hx_ep_failed(e: *const Ep) -> i32;
    pub(crate) fn hx_ep_info(e: *mut Ep, buf: *mut c_char, buf_len: usize) -> i64;
    pub(crate) fn hx_ep_set_order(e: *mut Ep, order: i32);
    pub(crate) fn hx_ep_cut(w: *mut Worker, e: *mut Ep);
    pub(crate) fn hx_ep_destroy(w: *mut Worker, e: *mut Ep);
    pub(crate) fn hx_rkey_unpack(
        e: *mut Ep,
        buf: *const c_void,
        rkey: *mut *mut RkeyHandle,
    ) -> c_int;
    pub(crate) fn hx_rkey_destroy(rkey: *mut RkeyHandle);

    pub(crate) fn hx_get(
        w: *mut Worker,
        e: *mut Ep,
        dst: *mut c_void,
        len: usize,
        raddr: u64,
        rkey: *mut RkeyHandle,
        wr_id: u64,
        tag: u64,
        signaled: c_int,
    ) -> c_int;
    pub(crate) fn hx_put(
        w: *mut Worker,
        e: *mut Ep,
        src: *const c_void,
        len: usize,
        raddr: u64,
        rkey: *mut RkeyHandle,
        wr_id: u64,
        tag: u64,
        signaled: c_int,
        copy: c_int,
    ) -> c_int;
    pub(crate) fn hx_atomic(
        w: *mut Worker,
        e: *mut Ep,
        cas: c_int,
        compare: u64,
        operand: u64,
        result: *mut u64,
        raddr: u64,
        rkey: *mut RkeyHandle,
        wr_id: u64,
        tag: u64,
        signaled: c_int,
    ) -> c_int;
    pub(crate) fn hx_am_send(
        w: *mut Worker,
        e: *mut Ep,
        from: u32,
        to_node: u32,
        data: *const c_void,
        len: usize,
    ) -> c_int;
}

/// Length of the error buffers handed to the shim.
pub(crate) const ERR_LEN: usize = 256;

/// The text the shim wrote into `err`.
pub(crate) fn err_text(err: &[c_char; ERR_LEN]) -> String {
    let bytes: Vec<u8> = err.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
