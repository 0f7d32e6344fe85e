/*
 * hytra's thin layer over UCP (the `ucx` backend of crates/fabric).
 *
 * It exists so that the Rust side sees a handful of plain functions instead of UCP's
 * parameter structs, callbacks and request lifetimes. Everything here runs on the thread
 * that owns the worker (one hytra worker per UCP worker); nothing is shared between
 * workers except the context.
 *
 * Completions: every operation carries an `hx_op` as its user data: the head of the
 * worker's pool, filled in place and taken from the pool only if UCP keeps the operation
 * in flight (on shared memory most finish inside the call, and those never touch the
 * pool). Its callback, or the post itself for an operation that finished at once,
 * appends an entry to the worker's completion ring when the operation was signaled or
 * failed. Received active messages are copied into a byte ring that Rust drains.
 *
 * The data-path functions return 0, or HX_EP_FAILED without posting when the endpoint's
 * peer has failed (the caller reports that as a completion).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#define HX_AM_ID 7
#define HX_EP_FAILED 1
#define HX_RING_BYTES (1u << 20)

typedef struct hx_cqe {
    uint64_t wr_id;
    uint64_t value;
    uint64_t tag; /* the poster's connection and sequence number */
    int32_t status; /* 0: success, otherwise a ucs_status_t */
    int32_t _pad;
} hx_cqe;

typedef struct hx_ep {
    ucp_ep_h ep;
    uint32_t inflight;
    int32_t failed; /* a ucs_status_t once the peer failed, else 0 */
} hx_ep;

struct hx_worker;

typedef struct hx_op {
    struct hx_worker *w;
    hx_ep *ep;
    uint64_t wr_id;
    uint64_t tag;
    uint64_t *reply; /* atomics: where the old value lands */
    uint64_t operand; /* atomics: the value UCP reads at post time */
    void *owned;      /* a copy of a payload that must outlive the post */
    int32_t report;   /* push a completion on success */
    int32_t silent;   /* push nothing, not even a failure (datagrams; a WRITE whose
                       * flush reports for it) */
    struct hx_op *next;
} hx_op;

typedef struct hx_worker {
    ucp_worker_h worker;
    hx_cqe *cq;
    size_t cq_cap, cq_head, cq_len;
    uint8_t *ring; /* received datagrams: [u32 from][u32 len][data padded to 8] */
    size_t ring_head, ring_tail; /* byte counters, unbounded */
    /* Datagrams sent, handed to the program, and dropped on arrival. Written only by the
     * worker's thread (with `bump`), read by the process's coordinator thread, which ends
     * a run only once every datagram sent was handed over or dropped. */
    uint64_t sent, taken, dropped;
    hx_op *free_ops;
    uint64_t ops_live;
    uint64_t posted;    /* operations posted so far */
    void *flush_req;    /* a worker flush in progress (polled, no callback) */
    uint64_t flush_from; /* `posted` when it started */
    uint64_t clean_at;  /* `posted` when the last finished flush started */
} hx_worker;

/* The completion ring's capacity is a power of two, so positions wrap with a mask (a
 * division here showed in the data path's profile). Out of line, so that op_report, which
 * runs for every operation and rarely pushes, stays small enough to inline. */
static __attribute__((noinline)) void cq_push(hx_worker *w, uint64_t wr_id, uint64_t tag,
                                              int32_t status, uint64_t value)
{
    if (w->cq_len == w->cq_cap) {
        size_t cap = w->cq_cap ? w->cq_cap * 2 : 1024;
        hx_cqe *n = malloc(cap * sizeof *n);
        if (n == NULL) {
            abort();
        }
        for (size_t i = 0; i < w->cq_len; i++) {
            n[i] = w->cq[(w->cq_head + i) & (w->cq_cap - 1)];
        }
        free(w->cq);
        w->cq = n;
        w->cq_cap = cap;
        w->cq_head = 0;
    }
    hx_cqe *e = &w->cq[(w->cq_head + w->cq_len) & (w->cq_cap - 1)];
    e->wr_id = wr_id;
    e->tag = tag;
    e->value = value;
    e->status = status;
    e->_pad = 0;
    w->cq_len++;
}

/* The context of the next operation, filled in: the head of the pool, which stays in the
 * pool until `settle` learns that UCP keeps the operation in flight. */
static hx_op *op_next(hx_worker *w, hx_ep *ep, uint64_t wr_id, uint64_t tag)
{
    hx_op *op = w->free_ops;
    if (op == NULL) {
        op = malloc(sizeof *op);
        if (op == NULL) {
            abort();
        }
        op->next = NULL;
        w->free_ops = op;
    }
    op->w = w;
    op->ep = ep;
    op->wr_id = wr_id;
    op->tag = tag;
    op->reply = NULL;
    op->owned = NULL;
    op->report = 0;
    op->silent = 0;
    w->posted++;
    return op;
}

static void op_put(hx_op *op)
{
    hx_worker *w = op->w;
    free(op->owned);
    op->owned = NULL;
    op->next = w->free_ops;
    w->free_ops = op;
    w->ops_live--;
}

/* Reports a finished operation if it was signaled or failed. Inline: it runs for every
 * operation, and most report nothing. */
static inline void op_report(const hx_op *op, ucs_status_t status)
{
    if (!op->silent && (status != UCS_OK || op->report)) {
        uint64_t value = (status == UCS_OK && op->reply != NULL) ? *op->reply : 0;
        cq_push(op->w, op->wr_id, op->tag, status, value);
    }
}

/* The callback of an operation UCP kept in flight (its context was taken from the pool). */
static void op_done(void *request, ucs_status_t status, void *user_data)
{
    hx_op *op = user_data;
    if (op->ep != NULL && op->ep->inflight > 0) {
        op->ep->inflight--;
    }
    op_report(op, status);
    op_put(op);
    if (request != NULL) {
        ucp_request_free(request);
    }
}

/* Settles the result of an `nbx` call made with `op` (the pool's head, see op_next): an
 * immediate success or failure is reported at once and leaves the context in the pool;
 * a request in flight takes the context out of the pool until op_done. */
static inline void settle(hx_op *op, ucs_status_ptr_t sp)
{
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
        op_report(op, sp == NULL ? UCS_OK : UCS_PTR_STATUS(sp));
        if (op->owned != NULL) {
            free(op->owned);
            op->owned = NULL;
        }
        return;
    }
    hx_worker *w = op->w;
    w->free_ops = op->next;
    w->ops_live++;
    if (op->ep != NULL) {
        op->ep->inflight++;
    }
}

/* Keeps per-connection FIFO order: an operation issued while earlier ones on the same
 * endpoint are still in flight is fenced behind them (UCP does not order RMA otherwise). */
static void order_after_inflight(hx_worker *w, hx_ep *ep)
{
    if (ep->inflight > 0) {
        ucp_worker_fence(w->worker);
    }
}

/* Fills the parameters of an operation whose context is `op`. In place, not returned by
 * value: copying the struct out after zeroing it stalls on store forwarding, which
 * showed as a quarter of the data path's time. Not zeroed either: UCP reads only the
 * fields `op_attr_mask` names, and callers that add a flag set its field. */
static void op_param(ucp_request_param_t *p, hx_op *op)
{
    p->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p->cb.send = op_done;
    p->user_data = op;
}

/* ---- context and memory ---- */

ucp_context_h hx_context_create(const char *tls, char *err, size_t err_len)
{
    ucp_config_t *config = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        snprintf(err, err_len, "ucp_config_read: %s", ucs_status_string(st));
        return NULL;
    }
    if (tls != NULL && tls[0] != '\0') {
        st = ucp_config_modify(config, "TLS", tls);
        if (st != UCS_OK) {
            snprintf(err, err_len, "UCX_TLS=%s: %s", tls, ucs_status_string(st));
            ucp_config_release(config);
            return NULL;
        }
    }
    ucp_params_t params;
    memset(&params, 0, sizeof params);
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_AM;
    params.mt_workers_shared = 1;
    ucp_context_h ctx = NULL;
    st = ucp_init(&params, config, &ctx);
    ucp_config_release(config);
    if (st != UCS_OK) {
        snprintf(err, err_len, "ucp_init: %s", ucs_status_string(st));
        return NULL;
    }
    return ctx;
}

void hx_context_destroy(ucp_context_h ctx)
{
    ucp_cleanup(ctx);
}

/* Regions up to this size are zeroed whole; larger ones only where already resident. */
#define HX_ZERO_ALL_BYTES (64ul << 20)

/* Makes a fresh UCP allocation read as zeros without touching more of it than needed.
 * Some allocation methods (the heap fallback) hand out memory that may hold old data, so
 * it must be zeroed; but the stores size their regions for the most they may ever hold,
 * and writing every page would make all of it resident (gigabytes for TPC-C, where only
 * what is loaded and inserted is ever touched). A page that is not resident in a fresh
 * allocation reads as zeros when first touched: shared-memory and anonymous mappings
 * start empty, and a heap allocation this large is a fresh mapping, not reused memory
 * (glibc's threshold for that is at most 32 MiB). So small regions are zeroed whole and
 * large ones only on their resident pages. */
static void zero_fresh(void *addr, size_t len)
{
    long page = sysconf(_SC_PAGESIZE);
    if (len <= HX_ZERO_ALL_BYTES || page <= 0) {
        memset(addr, 0, len);
        return;
    }
    uintptr_t psz = (uintptr_t)page;
    uintptr_t lo = (uintptr_t)addr, hi = lo + len;
    uintptr_t first = lo & ~(psz - 1);
    size_t pages = (size_t)((hi - first + psz - 1) / psz);
    unsigned char *resident = malloc(pages);
    if (resident == NULL || mincore((void *)first, pages * psz, resident) != 0) {
        free(resident);
        memset(addr, 0, len);
        return;
    }
    for (size_t i = 0; i < pages; i++) {
        if (resident[i] & 1) {
            uintptr_t a = first + i * psz, b = a + psz;
            a = a < lo ? lo : a;
            b = b > hi ? hi : b;
            memset((void *)a, 0, b - a);
        }
    }
    free(resident);
}

/* Allocates and maps `len` bytes through UCP (so that shared-memory peers can map them
 * and complete one-sided operations without this process), zeroes them, and packs the
 * remote key. */
int hx_mem_alloc(ucp_context_h ctx, size_t len, ucp_mem_h *memh, void **addr, void **rkey_buf,
                 size_t *rkey_len, char *err, size_t err_len)
{
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof mp);
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = NULL;
    mp.length = len;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    ucs_status_t st = ucp_mem_map(ctx, &mp, memh);
    if (st != UCS_OK) {
        snprintf(err, err_len, "ucp_mem_map(%zu bytes): %s", len, ucs_status_string(st));
        return -1;
    }
    ucp_mem_attr_t attr;
    memset(&attr, 0, sizeof attr);
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    st = ucp_mem_query(*memh, &attr);
    if (st != UCS_OK || attr.length < len || ((uintptr_t)attr.address % 8) != 0) {
        snprintf(err, err_len, "ucp_mem_query: %s", ucs_status_string(st));
        ucp_mem_unmap(ctx, *memh);
        return -1;
    }
    zero_fresh(attr.address, len);
    st = ucp_rkey_pack(ctx, *memh, rkey_buf, rkey_len);
    if (st != UCS_OK) {
        snprintf(err, err_len, "ucp_rkey_pack: %s", ucs_status_string(st));
        ucp_mem_unmap(ctx, *memh);
        return -1;
    }
    *addr = attr.address;
    return 0;
}

void hx_rkey_buffer_release(void *buf)
{
    ucp_rkey_buffer_release(buf);
}

void hx_mem_free(ucp_context_h ctx, ucp_mem_h memh)
{
    ucp_mem_unmap(ctx, memh);
}

/* ---- workers ---- */

/* Adds `by` to a counter that only this worker's thread writes and other threads read. */
static inline void bump(uint64_t *c, int64_t by)
{
    __atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + (uint64_t)by, __ATOMIC_RELEASE);
}

static ucs_status_t am_arrived(void *arg, const void *header, size_t header_len, void *data,
                               size_t len, const ucp_am_recv_param_t *param)
{
    hx_worker *w = arg;
    uint32_t from = 0;
    if (header_len != sizeof from || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        bump(&w->dropped, 1);
        return UCS_OK;
    }
    memcpy(&from, header, sizeof from);
    size_t need = 8 + ((len + 7) & ~(size_t)7);
    if ((w->ring_tail - w->ring_head) + need > HX_RING_BYTES) {
        bump(&w->dropped, 1);
        return UCS_OK;
    }
    /* Entries never wrap: if one would cross the end, pad to the start. */
    size_t at = w->ring_tail % HX_RING_BYTES;
    if (at + need > HX_RING_BYTES) {
        size_t pad = HX_RING_BYTES - at;
        if ((w->ring_tail - w->ring_head) + pad + need > HX_RING_BYTES) {
            bump(&w->dropped, 1);
            return UCS_OK;
        }
        uint32_t marker[2] = { UINT32_MAX, 0 };
        memcpy(w->ring + at, marker, 8);
        w->ring_tail += pad;
        at = 0;
    }
    uint32_t head[2] = { from, (uint32_t)len };
    memcpy(w->ring + at, head, 8);
    memcpy(w->ring + at + 8, data, len);
    w->ring_tail += need;
    return UCS_OK;
}

hx_worker *hx_worker_create(ucp_context_h ctx, void **addr, size_t *addr_len, char *err,
                            size_t err_len)
{
    hx_worker *w = calloc(1, sizeof *w);
    if (w == NULL) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    w->ring = malloc(HX_RING_BYTES);
    if (w->ring == NULL) {
        free(w);
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    /* One thread at a time, but not always the creating one (workers are created before
     * the run threads start). */
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucs_status_t st = ucp_worker_create(ctx, &wp, &w->worker);
    if (st != UCS_OK) {
        snprintf(err, err_len, "ucp_worker_create: %s", ucs_status_string(st));
        free(w->ring);
        free(w);
        return NULL;
    }
    ucp_am_handler_param_t hp;
    memset(&hp, 0, sizeof hp);
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = HX_AM_ID;
    hp.cb = am_arrived;
    hp.arg = w;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    st = ucp_worker_set_am_recv_handler(w->worker, &hp);
    if (st == UCS_OK) {
        ucp_address_t *a = NULL;
        st = ucp_worker_get_address(w->worker, &a, addr_len);
        *addr = a;
    }
    if (st != UCS_OK) {
        snprintf(err, err_len, "worker setup: %s", ucs_status_string(st));
        ucp_worker_destroy(w->worker);
        free(w->ring);
        free(w);
        return NULL;
    }
    return w;
}

void hx_worker_address_release(hx_worker *w, void *addr)
{
    ucp_worker_release_address(w->worker, addr);
}

void hx_worker_destroy(hx_worker *w)
{
    if (w->flush_req != NULL) {
        ucp_request_free(w->flush_req);
        w->flush_req = NULL;
    }
    /* Operations still in flight hold pooled contexts; let them finish or fail first. */
    for (int i = 0; i < 100000 && w->ops_live > 0; i++) {
        ucp_worker_progress(w->worker);
    }
    ucp_worker_destroy(w->worker);
    while (w->free_ops != NULL) {
        hx_op *n = w->free_ops->next;
        free(w->free_ops);
        w->free_ops = n;
    }
    free(w->cq);
    free(w->ring);
    free(w);
}

unsigned hx_progress(hx_worker *w)
{
    return ucp_worker_progress(w->worker);
}

/* 1 once every operation posted on the worker so far is complete at its target (a
 * worker flush that started after the last post finished), else 0: call again after
 * progress. A flush that fails (a peer is gone) counts as finished: nothing more of it
 * will land, and the failed endpoint reports the error. */
int hx_worker_flush_poll(hx_worker *w)
{
    if (w->flush_req != NULL) {
        if (ucp_request_check_status(w->flush_req) == UCS_INPROGRESS) {
            return 0;
        }
        ucp_request_free(w->flush_req);
        w->flush_req = NULL;
        w->clean_at = w->flush_from;
    }
    if (w->clean_at == w->posted) {
        return 1;
    }
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    w->flush_from = w->posted;
    ucs_status_ptr_t sp = ucp_worker_flush_nbx(w->worker, &p);
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
        w->clean_at = w->flush_from;
        return 1;
    }
    w->flush_req = sp;
    return 0;
}

size_t hx_poll(hx_worker *w, hx_cqe *out, size_t max)
{
    size_t n = 0;
    while (n < max && w->cq_len > 0) {
        out[n++] = w->cq[w->cq_head];
        w->cq_head = (w->cq_head + 1) & (w->cq_cap - 1);
        w->cq_len--;
    }
    return n;
}

/* Copies the oldest received datagram into `buf`; returns its length, or -1 if none. */
int64_t hx_recv(hx_worker *w, uint32_t *from, uint8_t *buf, size_t buf_len)
{
    while (w->ring_head != w->ring_tail) {
        size_t at = w->ring_head % HX_RING_BYTES;
        uint32_t head[2];
        memcpy(head, w->ring + at, 8);
        if (head[0] == UINT32_MAX) {
            w->ring_head += HX_RING_BYTES - at;
            continue;
        }
        size_t len = head[1];
        if (len > buf_len) {
            bump(&w->dropped, 1);
        } else {
            memcpy(buf, w->ring + at + 8, len);
            bump(&w->taken, 1);
        }
        *from = head[0];
        w->ring_head += 8 + ((len + 7) & ~(size_t)7);
        return len > buf_len ? -1 : (int64_t)len;
    }
    return -1;
}

uint64_t hx_dropped(const hx_worker *w)
{
    return __atomic_load_n(&w->dropped, __ATOMIC_ACQUIRE);
}

void hx_datagram_counts(const hx_worker *w, uint64_t *sent, uint64_t *received)
{
    *received = __atomic_load_n(&w->taken, __ATOMIC_ACQUIRE) +
                __atomic_load_n(&w->dropped, __ATOMIC_ACQUIRE);
    *sent = __atomic_load_n(&w->sent, __ATOMIC_ACQUIRE);
}

/* ---- endpoints ---- */

static void ep_failed(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    hx_ep *e = arg;
    e->failed = status;
}

hx_ep *hx_ep_create(hx_worker *w, const void *addr, int peer_errors, char *err, size_t err_len)
{
    hx_ep *e = calloc(1, sizeof *e);
    if (e == NULL) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = addr;
    /* Shared-memory transports cannot report a failed peer (UCX 1.13) and refuse this
     * mode; there the run's bootstrap connections notice a vanished process instead. */
    ep.err_mode = peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = ep_failed;
    ep.err_handler.arg = e;
    ucs_status_t st = ucp_ep_create(w->worker, &ep, &e->ep);
    if (st != UCS_OK) {
        snprintf(err, err_len, "ucp_ep_create: %s", ucs_status_string(st));
        free(e);
        return NULL;
    }
    return e;
}

int32_t hx_ep_failed(const hx_ep *e)
{
    return e->failed;
}

void hx_ep_destroy(hx_worker *w, hx_ep *e)
{
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t sp = ucp_ep_close_nbx(e->ep, &p);
    if (sp != NULL && !UCS_PTR_IS_ERR(sp)) {
        for (int i = 0; i < 100000 && ucp_request_check_status(sp) == UCS_INPROGRESS; i++) {
            ucp_worker_progress(w->worker);
        }
        ucp_request_free(sp);
    }
    free(e);
}

int hx_rkey_unpack(hx_ep *e, const void *buf, ucp_rkey_h *rkey)
{
    return ucp_ep_rkey_unpack(e->ep, buf, rkey) == UCS_OK ? 0 : -1;
}

void hx_rkey_destroy(ucp_rkey_h rkey)
{
    ucp_rkey_destroy(rkey);
}

/* ---- data path ---- */

/* READ `len` bytes at `raddr` into `dst`. */
int hx_get(hx_worker *w, hx_ep *e, void *dst, size_t len, uint64_t raddr, ucp_rkey_h rkey,
           uint64_t wr_id, uint64_t tag, int signaled)
{
    if (e->failed != 0) {
        return HX_EP_FAILED;
    }
    order_after_inflight(w, e);
    hx_op *op = op_next(w, e, wr_id, tag);
    op->report = signaled;
    ucp_request_param_t p;
    op_param(&p, op);
    settle(op, ucp_get_nbx(e->ep, dst, len, raddr, rkey, &p));
    return 0;
}

/* WRITE `len` bytes from `src` to `raddr`. `copy`: the payload may change after this call
 * returns (inline), so keep a copy if UCP still needs it. `signaled` completes once the
 * data is at the target (a flush), not merely when `src` may be reused. */
int hx_put(hx_worker *w, hx_ep *e, const void *src, size_t len, uint64_t raddr, ucp_rkey_h rkey,
           uint64_t wr_id, uint64_t tag, int signaled, int copy)
{
    if (e->failed != 0) {
        return HX_EP_FAILED;
    }
    order_after_inflight(w, e);
    hx_op *op = op_next(w, e, wr_id, tag);
    op->silent = signaled;
    ucp_request_param_t p;
    op_param(&p, op);
    ucs_status_ptr_t sp;
    if (copy) {
        p.op_attr_mask |= UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
        sp = ucp_put_nbx(e->ep, src, len, raddr, rkey, &p);
        if (UCS_PTR_IS_ERR(sp) && UCS_PTR_STATUS(sp) == UCS_ERR_NO_RESOURCE) {
            op->owned = malloc(len);
            if (op->owned == NULL) {
                abort();
            }
            memcpy(op->owned, src, len);
            p.op_attr_mask &= ~(uint32_t)UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
            sp = ucp_put_nbx(e->ep, op->owned, len, raddr, rkey, &p);
        }
    } else {
        sp = ucp_put_nbx(e->ep, src, len, raddr, rkey, &p);
    }
    settle(op, sp);
    if (!signaled) {
        return 0;
    }
    /* Remote completion: a flush completes when everything before it on the endpoint
     * is done at the target. */
    hx_op *fl = op_next(w, e, wr_id, tag);
    fl->report = 1;
    ucp_request_param_t fp;
    op_param(&fp, fl);
    settle(fl, ucp_ep_flush_nbx(e->ep, &fp));
    return 0;
}

/* CAS (`cas` != 0: compare with `compare`, swap in `operand`) or fetch-and-add
 * (`operand` added) on the word at `raddr`; the old value lands in `*result`. */
int hx_atomic(hx_worker *w, hx_ep *e, int cas, uint64_t compare, uint64_t operand,
              uint64_t *result, uint64_t raddr, ucp_rkey_h rkey, uint64_t wr_id, uint64_t tag,
              int signaled)
{
    if (e->failed != 0) {
        return HX_EP_FAILED;
    }
    order_after_inflight(w, e);
    hx_op *op = op_next(w, e, wr_id, tag);
    op->report = signaled;
    op->reply = result;
    ucp_request_param_t p;
    op_param(&p, op);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
    p.datatype = ucp_dt_make_contig(8);
    p.reply_buffer = result;
    ucs_status_ptr_t sp;
    if (cas) {
        /* CSWAP reads the new value from the reply buffer and returns the old one there. */
        op->operand = compare;
        *result = operand;
        sp = ucp_atomic_op_nbx(e->ep, UCP_ATOMIC_OP_CSWAP, &op->operand, 1, raddr, rkey, &p);
    } else {
        op->operand = operand;
        sp = ucp_atomic_op_nbx(e->ep, UCP_ATOMIC_OP_ADD, &op->operand, 1, raddr, rkey, &p);
    }
    settle(op, sp);
    return 0;
}

/* Sends one datagram as an active message with the sender's dense index as header.
 * Nothing is reported: datagrams may be lost. */
int hx_am_send(hx_worker *w, hx_ep *e, uint32_t from, const void *data, size_t len)
{
    hx_op *op = op_next(w, NULL, 0, 0);
    op->silent = 1;
    ucp_request_param_t p;
    op_param(&p, op);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    uint32_t header = from;
    /* Counted before it can arrive, so that no process ever counts a datagram received
     * that its sender has not counted sent; taken back below if UCP refuses it. */
    bump(&w->sent, 1);
    ucs_status_ptr_t sp = ucp_am_send_nbx(e->ep, HX_AM_ID, &header, sizeof header, data, len, &p);
    if (UCS_PTR_IS_ERR(sp) && UCS_PTR_STATUS(sp) == UCS_ERR_NO_RESOURCE) {
        /* UCP will send later from a copy we keep alive until it is done. */
        uint8_t *copy = malloc(8 + len);
        if (copy == NULL) {
            abort();
        }
        memcpy(copy, &header, sizeof header);
        memcpy(copy + 8, data, len);
        op->owned = copy;
        p.op_attr_mask &= ~(uint32_t)UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
        sp = ucp_am_send_nbx(e->ep, HX_AM_ID, copy, sizeof header, copy + 8, len, &p);
    }
    if (UCS_PTR_IS_ERR(sp)) {
        bump(&w->sent, -1);
    }
    settle(op, sp);
    return 0;
}
