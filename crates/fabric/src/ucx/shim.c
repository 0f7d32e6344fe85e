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
 *
 * Order per connection (docs/INVARIANTS.md R1): UCP orders nothing unless told, and its
 * fence (UCX 1.13 has only the weak one) orders operations of one transport lane, not
 * across lanes. Each endpoint gets a mode from the lanes UCP chose for it (see
 * ucx/lanes.rs): shared memory completes operations inside the call, so only one still
 * in flight needs a fence; one network lane executes in order at the target except that
 * a later WRITE or atomic may pass an earlier READ or atomic there, which a fence
 * forbids; RMA and atomics on different lanes need a flush between the two kinds; and
 * where RMA is emulated in software (tcp), the target copies a READ's data only when it
 * sends the reply, so a WRITE or atomic waits until the READs before it are back. An
 * operation that must wait for a flush is kept in the endpoint's `waiting` list and
 * issued when the flush completes, so that no thread ever blocks on a peer it may be
 * the one to progress.
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

/* Ordering modes of an endpoint (hx_ep_set_order; the same numbers in ucx/lanes.rs). */
#define HX_ORDER_SYNC 0  /* shared memory: fence only behind an operation in flight */
#define HX_ORDER_QUEUE 1 /* one network lane: also fence a write or atomic behind a fetch */
#define HX_ORDER_LANES 2 /* RMA and atomics on different lanes: flush between the kinds */
#define HX_ORDER_FLUSH 3 /* every operation waits for the previous ones at the target */
#define HX_ORDER_EMULATED 4 /* software RMA: a write or atomic waits for the READs in flight */

/* Kinds of operation, as bits of hx_ep.kinds. */
#define HX_KIND_RMA 1
#define HX_KIND_AMO 2

typedef struct hx_cqe {
    uint64_t wr_id;
    uint64_t value;
    uint64_t tag; /* the poster's connection and sequence number */
    int32_t status; /* 0: success, otherwise a ucs_status_t */
    int32_t _pad;
} hx_cqe;

struct hx_worker;
struct hx_deferred;

typedef struct hx_ep {
    ucp_ep_h ep;
    struct hx_worker *w;
    uint32_t inflight;
    int32_t failed;   /* a ucs_status_t once the peer failed, else 0 */
    int32_t order;    /* HX_ORDER_* */
    int32_t fetched;  /* a READ or atomic was issued since the last fence */
    int32_t kinds;    /* HX_KIND_* issued since the last flush */
    int32_t flushing; /* a flush is in progress: later operations wait */
    int32_t closed;   /* the UCP endpoint is closed (hx_ep_cut): post nothing on it */
    int32_t stuck;    /* a flush of a cut endpoint never ended: its callback may still
                       * come, so the endpoint is never freed */
    struct hx_op *live; /* operations in flight, newest first (see abandon_live) */
    void *quiesce;    /* this endpoint's flush of a worker's quiesce (polled, no callback) */
    uint32_t gets;    /* READs in flight (HX_ORDER_EMULATED) */
    struct hx_deferred *wait_head, *wait_tail;
} hx_ep;

/* An operation held back until a flush of its endpoint completes, with everything needed
 * to issue it then. At most a send queue's depth per connection (the poster counts). */
typedef struct hx_deferred {
    int kind; /* 0 READ, 1 WRITE, 2 atomic */
    void *local;      /* READ destination, WRITE source, atomic result */
    size_t len;
    uint64_t raddr;
    ucp_rkey_h rkey;
    uint64_t wr_id, tag;
    int signaled, copy, cas;
    uint64_t compare, operand;
    void *owned; /* the copy of an inline WRITE's payload */
    struct hx_deferred *next;
} hx_deferred;

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
    int32_t get;      /* a READ, counted in its endpoint's `gets` while in flight */
    int32_t abandoned; /* reported failed when its endpoint was cut (abandon_live) */
    struct hx_op *next;
    struct hx_op *live_prev, *live_next; /* in its endpoint's `live` list while in flight */
} hx_op;

typedef struct hx_worker {
    ucp_worker_h worker;
    hx_cqe *cq;
    size_t cq_cap, cq_head, cq_len;
    uint8_t *ring; /* received datagrams: [u32 from][u32 len][data padded to 8] */
    size_t ring_head, ring_tail; /* byte counters, unbounded */
    /* Datagrams dropped on arrival; and by peer node, those sent to it and those from it
     * handed to the program or dropped. Written only by the worker's thread (with `bump`),
     * read by the process's coordinator thread, which ends a run only once every datagram
     * sent was handed over or dropped (counted by node, so that a run whose node died can
     * end on the survivors' traffic alone). `per_node` workers per node; a datagram whose
     * sender is unknown counts as node 0's. */
    uint64_t dropped;
    uint32_t nodes, per_node;
    uint64_t *sent_to, *got_from;
    hx_op *free_ops;
    uint64_t ops_live;
    uint64_t posted;    /* operations posted so far */
    uint64_t deferred;  /* operations waiting in endpoints for a flush */
    /* The worker's endpoints (each leaves when destroyed), whose flushes make a quiesce
     * (hx_worker_flush_poll). */
    struct hx_ep **eps;
    size_t eps_len, eps_cap;
    int32_t quiescing;  /* flushes of the endpoints are in progress */
    uint64_t flush_from; /* `posted` when they started */
    uint64_t clean_at;  /* `posted` when the last finished quiesce started */
    /* hx_progress calls so far; and what was handed to UCP or queued for it (operations,
     * datagrams, deferred operations, endpoint flushes), in all and at the last call: the
     * run loop adds a progress call after a program's idle step only if the step made
     * none or submitted since. */
    uint64_t progress_calls;
    uint64_t submits;
    uint64_t submits_at_progress;
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
    op->get = 0;
    op->abandoned = 0;
    w->posted++;
    w->submits++;
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
    hx_ep *e = op->ep;
    if (e != NULL) {
        if (e->inflight > 0) {
            e->inflight--;
        }
        if (op->get && e->gets > 0) {
            e->gets--;
        }
        if (op->live_prev != NULL) {
            op->live_prev->live_next = op->live_next;
        } else {
            e->live = op->live_next;
        }
        if (op->live_next != NULL) {
            op->live_next->live_prev = op->live_prev;
        }
    }
    if (!op->abandoned) {
        op_report(op, status);
    }
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
    hx_ep *e = op->ep;
    if (e != NULL) {
        e->inflight++;
        e->gets += (uint32_t)op->get;
        op->live_prev = NULL;
        op->live_next = e->live;
        if (e->live != NULL) {
            e->live->live_prev = op;
        }
        e->live = op;
    }
}

/* Fences an operation of `kind` (0 READ, 1 WRITE, 2 atomic) behind the earlier ones of
 * its endpoint where its mode asks for it (see the top of this file), and records it. */
static void fence_before(hx_worker *w, hx_ep *ep, int kind)
{
    int need = ep->inflight > 0;
    if (ep->order != HX_ORDER_SYNC && kind != 0 && ep->fetched) {
        need = 1;
    }
    if (need) {
        ucp_worker_fence(w->worker);
        ep->fetched = 0;
    }
    ep->fetched |= kind != 1;
    ep->kinds |= kind == 2 ? HX_KIND_AMO : HX_KIND_RMA;
}

static void drain(hx_ep *e);

/* Whether an operation of `kind` must wait until what the endpoint issued before it is
 * complete at the target. */
static int needs_flush(const hx_ep *ep, int kind)
{
    int bit = kind == 2 ? HX_KIND_AMO : HX_KIND_RMA;
    switch (ep->order) {
    case HX_ORDER_FLUSH:
        return ep->kinds != 0;
    case HX_ORDER_LANES:
        return (ep->kinds & ~bit) != 0;
    case HX_ORDER_EMULATED:
        /* UCP's software GET copies the data when the target sends the reply, which can
         * wait behind a full socket while later requests of this endpoint execute. */
        return kind != 0 && ep->gets > 0;
    default:
        return 0;
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

/* `atomic_mode`: UCX_ATOMIC_MODE for this context (NULL: the environment's or UCX's
 * guess). "device" makes every endpoint, a worker's own included, execute atomics in the
 * one NIC chosen for them, so that no lock word sees both NIC and CPU atomics. */
ucp_context_h hx_context_create(const char *tls, const char *atomic_mode, int wakeup,
                                char *err, size_t err_len)
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
    if (atomic_mode != NULL) {
        st = ucp_config_modify(config, "ATOMIC_MODE", atomic_mode);
        if (st != UCS_OK) {
            snprintf(err, err_len, "UCX_ATOMIC_MODE=%s: %s", atomic_mode, ucs_status_string(st));
            ucp_config_release(config);
            return NULL;
        }
    }
    ucp_params_t params;
    memset(&params, 0, sizeof params);
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_AM;
    if (wakeup) {
        /* Only when asked: it makes UCP prefer transports that can signal events, which
         * may change the lanes a busy-polling run would get. */
        params.features |= UCP_FEATURE_WAKEUP;
    }
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

/* Huge pages are 2 MiB on the hosts this targets; a region on them is rounded up. */
#define HX_HUGE_BYTES (2ul << 20)

/* Maps `len` bytes of explicit huge pages (hugetlbfs, zeroed by the kernel) and registers
 * them with UCP; 0 on success with `*mapped` the mapping's length, -1 (nothing left
 * behind) when the host has none to give or UCP refuses them. */
static int mem_huge(ucp_context_h ctx, size_t len, ucp_mem_h *memh, void **addr, size_t *mapped)
{
    size_t n = (len + HX_HUGE_BYTES - 1) & ~(HX_HUGE_BYTES - 1);
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB,
                   -1, 0);
    if (p == MAP_FAILED) {
        return -1;
    }
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof mp);
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = p;
    mp.length = n;
    if (ucp_mem_map(ctx, &mp, memh) != UCS_OK) {
        munmap(p, n);
        return -1;
    }
    *addr = p;
    *mapped = n;
    return 0;
}

/* Allocates and maps `len` bytes through UCP (so that shared-memory peers can map them
 * and complete one-sided operations without this process), zeroes them, and packs the
 * remote key. `huge`: try explicit huge pages first (fewer translations for the NIC to
 * cache; only where no shared-memory peer needs UCP's own allocation); `*mapped` is then
 * the length hytra mapped itself (0 when UCP allocated), for hx_mem_free. */
int hx_mem_alloc(ucp_context_h ctx, size_t len, int huge, ucp_mem_h *memh, void **addr,
                 void **rkey_buf, size_t *rkey_len, size_t *mapped, char *err, size_t err_len)
{
    *mapped = 0;
    ucs_status_t st;
    if (huge && mem_huge(ctx, len, memh, addr, mapped) == 0) {
        st = ucp_rkey_pack(ctx, *memh, rkey_buf, rkey_len);
        if (st != UCS_OK) {
            snprintf(err, err_len, "ucp_rkey_pack: %s", ucs_status_string(st));
            ucp_mem_unmap(ctx, *memh);
            munmap(*addr, *mapped);
            return -1;
        }
        return 0;
    }
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof mp);
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = NULL;
    mp.length = len;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    st = ucp_mem_map(ctx, &mp, memh);
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
    if (len >= HX_HUGE_BYTES) {
        /* Transparent huge pages where the kernel gives them for this kind of memory;
         * a refusal changes nothing. */
        (void)madvise(attr.address, len, MADV_HUGEPAGE);
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

/* Unregisters (and, if hytra mapped it: `mapped` > 0, unmaps) a region. */
void hx_mem_free(ucp_context_h ctx, ucp_mem_h memh, void *addr, size_t mapped)
{
    ucp_mem_unmap(ctx, memh);
    if (mapped > 0) {
        munmap(addr, mapped);
    }
}

/* ---- workers ---- */

/* Adds `by` to a counter that only this worker's thread writes and other threads read. */
static inline void bump(uint64_t *c, int64_t by)
{
    __atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + (uint64_t)by, __ATOMIC_RELEASE);
}

/* Counts a datagram from dense worker `from` as taken (or dropped) by node. */
static inline void got_from(hx_worker *w, uint32_t from)
{
    uint32_t n = w->per_node ? from / w->per_node : 0;
    bump(&w->got_from[n < w->nodes ? n : 0], 1);
}

static ucs_status_t am_arrived(void *arg, const void *header, size_t header_len, void *data,
                               size_t len, const ucp_am_recv_param_t *param)
{
    hx_worker *w = arg;
    uint32_t from = 0;
    if (header_len != sizeof from || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        bump(&w->dropped, 1);
        got_from(w, 0);
        return UCS_OK;
    }
    memcpy(&from, header, sizeof from);
    size_t need = 8 + ((len + 7) & ~(size_t)7);
    if ((w->ring_tail - w->ring_head) + need > HX_RING_BYTES) {
        bump(&w->dropped, 1);
        got_from(w, from);
        return UCS_OK;
    }
    /* Entries never wrap: if one would cross the end, pad to the start. */
    size_t at = w->ring_tail % HX_RING_BYTES;
    if (at + need > HX_RING_BYTES) {
        size_t pad = HX_RING_BYTES - at;
        if ((w->ring_tail - w->ring_head) + pad + need > HX_RING_BYTES) {
            bump(&w->dropped, 1);
            got_from(w, from);
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

hx_worker *hx_worker_create(ucp_context_h ctx, uint32_t nodes, uint32_t per_node, void **addr,
                            size_t *addr_len, char *err, size_t err_len)
{
    hx_worker *w = calloc(1, sizeof *w);
    if (w == NULL) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    w->nodes = nodes ? nodes : 1;
    w->per_node = per_node;
    w->sent_to = calloc(w->nodes, sizeof *w->sent_to);
    w->got_from = calloc(w->nodes, sizeof *w->got_from);
    w->ring = malloc(HX_RING_BYTES);
    if (w->ring == NULL || w->sent_to == NULL || w->got_from == NULL) {
        free(w->ring);
        free(w->sent_to);
        free(w->got_from);
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
        free(w->sent_to);
        free(w->got_from);
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
        free(w->sent_to);
        free(w->got_from);
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
    /* Every endpoint was destroyed first, and released its part of a quiesce. */
    free(w->eps);
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
    free(w->sent_to);
    free(w->got_from);
    free(w);
}

unsigned hx_progress(hx_worker *w)
{
    w->progress_calls++;
    w->submits_at_progress = w->submits;
    return ucp_worker_progress(w->worker);
}

uint64_t hx_progress_calls(const hx_worker *w)
{
    return w->progress_calls;
}

int hx_submitted_since_progress(const hx_worker *w)
{
    return w->submits != w->submits_at_progress;
}

/* 1 once every operation posted on the worker so far is complete at its target (a flush
 * of each open endpoint, started after the last post, finished), else 0: call again
 * after progress. Endpoint by endpoint, not one worker flush: a flush that covers an
 * endpoint to a peer that died waits for it forever over shared memory (UCX 1.13 fails
 * nothing there), even once the endpoint is closed; a cut endpoint's part is dropped
 * (hx_ep_cut), and nothing posted on it will land. A flush that fails (a peer is gone)
 * counts as finished: the failed endpoint reports the error. */
int hx_worker_flush_poll(hx_worker *w)
{
    if (w->deferred > 0) {
        /* Operations still wait in endpoints for their flush: not posted yet. */
        return 0;
    }
    if (w->quiescing) {
        for (size_t i = 0; i < w->eps_len; i++) {
            hx_ep *e = w->eps[i];
            if (e->quiesce != NULL && ucp_request_check_status(e->quiesce) != UCS_INPROGRESS) {
                ucp_request_free(e->quiesce);
                e->quiesce = NULL;
            }
            if (e->quiesce != NULL) {
                return 0;
            }
        }
        w->quiescing = 0;
        w->clean_at = w->flush_from;
    }
    if (w->clean_at == w->posted) {
        return 1;
    }
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    w->flush_from = w->posted;
    int pending = 0;
    for (size_t i = 0; i < w->eps_len; i++) {
        hx_ep *e = w->eps[i];
        /* A failed endpoint's peer is gone: UCX promises only to close it. */
        if (e->closed || e->failed != 0) {
            continue;
        }
        ucs_status_ptr_t sp = ucp_ep_flush_nbx(e->ep, &p);
        if (sp != NULL && !UCS_PTR_IS_ERR(sp)) {
            e->quiesce = sp;
            pending = 1;
        }
    }
    if (!pending) {
        w->clean_at = w->flush_from;
        return 1;
    }
    w->quiescing = 1;
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
        }
        got_from(w, head[0]);
        *from = head[0];
        w->ring_head += 8 + ((len + 7) & ~(size_t)7);
        return len > buf_len ? -1 : (int64_t)len;
    }
    return -1;
}

/* The worker's event file descriptor (readable when the worker has events once armed),
 * or -1 with the reason in `err` (the context was made without wakeup). */
int hx_worker_efd(hx_worker *w, char *err, size_t err_len)
{
    int fd = -1;
    ucs_status_t st = ucp_worker_get_efd(w->worker, &fd);
    if (st != UCS_OK) {
        snprintf(err, err_len, "ucp_worker_get_efd: %s", ucs_status_string(st));
        return -1;
    }
    return fd;
}

/* Prepares the worker to sleep: 1 when it is armed and nothing waits to be taken (its
 * completion and datagram rings are empty), so that the thread may block on its event
 * fd; 0 when there is work (call progress and step again); -1 on a UCP error. The rings
 * matter because progress may have filled them after the program last looked, and UCP
 * knows nothing of them. */
int hx_worker_arm(hx_worker *w)
{
    if (w->cq_len > 0 || w->ring_head != w->ring_tail) {
        return 0;
    }
    ucs_status_t st = ucp_worker_arm(w->worker);
    if (st == UCS_ERR_BUSY) {
        return 0;
    }
    return st == UCS_OK ? 1 : -1;
}

uint64_t hx_dropped(const hx_worker *w)
{
    return __atomic_load_n(&w->dropped, __ATOMIC_ACQUIRE);
}

/* Adds the worker's datagrams by peer node to `sent` and `received` (`nodes` long). */
void hx_datagram_counts_by_node(const hx_worker *w, uint64_t *sent, uint64_t *received,
                                size_t nodes)
{
    for (size_t n = 0; n < nodes && n < w->nodes; n++) {
        sent[n] += __atomic_load_n(&w->sent_to[n], __ATOMIC_ACQUIRE);
        received[n] += __atomic_load_n(&w->got_from[n], __ATOMIC_ACQUIRE);
    }
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
    if (w->eps_len == w->eps_cap) {
        size_t cap = w->eps_cap ? w->eps_cap * 2 : 16;
        hx_ep **n = realloc(w->eps, cap * sizeof *n);
        if (n == NULL) {
            abort();
        }
        w->eps = n;
        w->eps_cap = cap;
    }
    w->eps[w->eps_len++] = e;
    e->w = w;
    e->order = HX_ORDER_SYNC;
    return e;
}

/* Releases `e`'s part of a quiesce in progress: UCP frees the request once it is done,
 * and nothing waits for it any more. */
static void quiesce_release(hx_ep *e)
{
    if (e->quiesce != NULL) {
        ucp_request_free(e->quiesce);
        e->quiesce = NULL;
    }
}

/* Writes UCP's description of the endpoint's lanes (ucp_ep_print_info) into `buf`,
 * NUL-terminated and cut to fit; returns its full length, or -1. UCX 1.13 has no query
 * of an endpoint's transports, and this text is what `ucx_info -e` shows. */
int64_t hx_ep_info(hx_ep *e, char *buf, size_t buf_len)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL) {
        return -1;
    }
    ucp_ep_print_info(e->ep, f);
    if (fclose(f) != 0 || text == NULL) {
        free(text);
        return -1;
    }
    if (buf_len > 0) {
        size_t n = len < buf_len - 1 ? len : buf_len - 1;
        memcpy(buf, text, n);
        buf[n] = '\0';
    }
    free(text);
    return (int64_t)len;
}

/* Sets how operations of the endpoint are kept in order (HX_ORDER_*), before any. */
void hx_ep_set_order(hx_ep *e, int32_t order)
{
    e->order = order;
}

int32_t hx_ep_failed(const hx_ep *e)
{
    return e->failed;
}

/* Closes `e`'s UCP endpoint by force, once: operations in flight on it complete in error,
 * those waiting for a flush fail. `e->failed` must be set, so that nothing is issued
 * on it any more. */
static void close_forced(hx_worker *w, hx_ep *e)
{
    if (e->closed) {
        return;
    }
    e->closed = 1;
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
    for (int i = 0; i < 100000 && e->flushing; i++) {
        ucp_worker_progress(w->worker);
    }
    if (!e->flushing) {
        drain(e);
    }
}

/* Reports every operation of `e` still in flight as failed now, oldest first, and
 * forgets it: its context leaves the endpoint, and a late callback, if UCP ever makes
 * one, only returns it to the pool. */
static void abandon_live(hx_ep *e)
{
    hx_op *oldest = e->live;
    while (oldest != NULL && oldest->live_next != NULL) {
        oldest = oldest->live_next;
    }
    for (hx_op *op = oldest; op != NULL; op = op->live_prev) {
        op->abandoned = 1;
        op->ep = NULL;
        op_report(op, e->failed);
    }
    e->live = NULL;
    e->inflight = 0;
    e->gets = 0;
}

/* Cuts `e` off its peer, which left the run: what is in flight on it completes in error
 * and every later operation fails at once (datagrams are dropped). On shared memory a
 * dead peer never fails an endpoint, and operations towards it could wait forever. */
void hx_ep_cut(hx_worker *w, hx_ep *e)
{
    if (e->failed == 0) {
        e->failed = UCS_ERR_CONNECTION_RESET;
    }
    close_forced(w, e);
    /* What the close did not end (UCX 1.13 ends nothing in flight to a dead
     * shared-memory peer) fails here, so that no poster waits for it forever. */
    abandon_live(e);
    if (e->flushing) {
        e->stuck = 1;
        e->flushing = 0;
        drain(e);
    }
    quiesce_release(e);
}

void hx_ep_destroy(hx_worker *w, hx_ep *e)
{
    /* Whatever still waits for a flush fails instead of being issued on a closing
     * endpoint (the run is over; nobody polls for it). */
    if (e->failed == 0) {
        e->failed = UCS_ERR_CANCELED;
    }
    close_forced(w, e);
    quiesce_release(e);
    for (size_t i = 0; i < w->eps_len; i++) {
        if (w->eps[i] == e) {
            w->eps[i] = w->eps[--w->eps_len];
            break;
        }
    }
    /* A callback that still comes (as the worker is destroyed) must not reach the freed
     * endpoint. */
    abandon_live(e);
    if (!e->stuck) {
        free(e);
    }
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

static void issue_get(hx_worker *w, hx_ep *e, void *dst, size_t len, uint64_t raddr,
                      ucp_rkey_h rkey, uint64_t wr_id, uint64_t tag, int signaled)
{
    fence_before(w, e, 0);
    hx_op *op = op_next(w, e, wr_id, tag);
    op->report = signaled;
    op->get = 1;
    ucp_request_param_t p;
    op_param(&p, op);
    settle(op, ucp_get_nbx(e->ep, dst, len, raddr, rkey, &p));
}

/* `owned`: a copy of the payload that this call takes over (a deferred inline WRITE). */
static void issue_put(hx_worker *w, hx_ep *e, const void *src, size_t len, uint64_t raddr,
                      ucp_rkey_h rkey, uint64_t wr_id, uint64_t tag, int signaled, int copy,
                      void *owned)
{
    fence_before(w, e, 1);
    hx_op *op = op_next(w, e, wr_id, tag);
    op->silent = signaled;
    op->owned = owned;
    ucp_request_param_t p;
    op_param(&p, op);
    ucs_status_ptr_t sp;
    if (copy && owned == NULL) {
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
        sp = ucp_put_nbx(e->ep, owned != NULL ? owned : src, len, raddr, rkey, &p);
    }
    settle(op, sp);
    if (!signaled) {
        return;
    }
    /* Remote completion: a flush completes when everything before it on the endpoint
     * is done at the target. */
    hx_op *fl = op_next(w, e, wr_id, tag);
    fl->report = 1;
    ucp_request_param_t fp;
    op_param(&fp, fl);
    settle(fl, ucp_ep_flush_nbx(e->ep, &fp));
}

static void issue_atomic(hx_worker *w, hx_ep *e, int cas, uint64_t compare, uint64_t operand,
                         uint64_t *result, uint64_t raddr, ucp_rkey_h rkey, uint64_t wr_id,
                         uint64_t tag, int signaled)
{
    fence_before(w, e, 2);
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
}

static void issue(hx_worker *w, hx_ep *e, hx_deferred *d)
{
    switch (d->kind) {
    case 0:
        issue_get(w, e, d->local, d->len, d->raddr, d->rkey, d->wr_id, d->tag, d->signaled);
        break;
    case 1:
        issue_put(w, e, d->local, d->len, d->raddr, d->rkey, d->wr_id, d->tag, d->signaled,
                  d->copy, d->owned);
        break;
    default:
        issue_atomic(w, e, d->cas, d->compare, d->operand, d->local, d->raddr, d->rkey,
                     d->wr_id, d->tag, d->signaled);
        break;
    }
}

static void flush_done(void *request, ucs_status_t status, void *user_data);

/* Starts a flush of `e`; 1 if it completed at once. Operations issued later wait. */
static int flush_start(hx_ep *e)
{
    e->kinds = 0;
    e->fetched = 0;
    e->w->submits++;
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = flush_done;
    p.user_data = e;
    ucs_status_ptr_t sp = ucp_ep_flush_nbx(e->ep, &p);
    if (sp == NULL) {
        return 1;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        e->failed = UCS_PTR_STATUS(sp);
        return 1;
    }
    e->flushing = 1;
    return 0;
}

/* Issues the waiting operations of `e` in order, each after the flush it needs; fails
 * them once the peer has failed. Called when a flush completes. */
static void drain(hx_ep *e)
{
    hx_worker *w = e->w;
    while (e->wait_head != NULL && !e->flushing) {
        hx_deferred *d = e->wait_head;
        if (e->failed == 0 && needs_flush(e, d->kind) && !flush_start(e)) {
            return;
        }
        e->wait_head = d->next;
        if (e->wait_head == NULL) {
            e->wait_tail = NULL;
        }
        w->deferred--;
        if (e->failed != 0) {
            free(d->owned);
            cq_push(w, d->wr_id, d->tag, e->failed, 0);
        } else {
            issue(w, e, d);
        }
        free(d);
    }
}

static void flush_done(void *request, ucs_status_t status, void *user_data)
{
    hx_ep *e = user_data;
    e->flushing = 0;
    if (status != UCS_OK && e->failed == 0) {
        e->failed = status;
    }
    ucp_request_free(request);
    drain(e);
}

/* Whether an operation of `kind` must wait in `e`'s list (behind a flush, or behind
 * others waiting); starts the flush it needs. */
static int must_wait(hx_ep *e, int kind)
{
    if (e->flushing || e->wait_head != NULL) {
        return 1;
    }
    return needs_flush(e, kind) && !flush_start(e);
}

static void wait_push(hx_worker *w, hx_ep *e, hx_deferred d)
{
    hx_deferred *n = malloc(sizeof *n);
    if (n == NULL) {
        abort();
    }
    *n = d;
    n->next = NULL;
    if (e->wait_tail != NULL) {
        e->wait_tail->next = n;
    } else {
        e->wait_head = n;
    }
    e->wait_tail = n;
    w->deferred++;
    w->submits++;
}

/* READ `len` bytes at `raddr` into `dst`. */
int hx_get(hx_worker *w, hx_ep *e, void *dst, size_t len, uint64_t raddr, ucp_rkey_h rkey,
           uint64_t wr_id, uint64_t tag, int signaled)
{
    if (e->failed != 0) {
        return HX_EP_FAILED;
    }
    if (must_wait(e, 0)) {
        hx_deferred d = { .kind = 0, .local = dst, .len = len, .raddr = raddr, .rkey = rkey,
                          .wr_id = wr_id, .tag = tag, .signaled = signaled };
        wait_push(w, e, d);
        return 0;
    }
    issue_get(w, e, dst, len, raddr, rkey, wr_id, tag, signaled);
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
    if (must_wait(e, 1)) {
        hx_deferred d = { .kind = 1, .local = (void *)src, .len = len, .raddr = raddr,
                          .rkey = rkey, .wr_id = wr_id, .tag = tag, .signaled = signaled,
                          .copy = copy };
        if (copy) {
            /* An inline payload may change once this call returns. */
            d.owned = malloc(len > 0 ? len : 1);
            if (d.owned == NULL) {
                abort();
            }
            memcpy(d.owned, src, len);
        }
        wait_push(w, e, d);
        return 0;
    }
    issue_put(w, e, src, len, raddr, rkey, wr_id, tag, signaled, copy, NULL);
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
    if (must_wait(e, 2)) {
        hx_deferred d = { .kind = 2, .local = result, .raddr = raddr, .rkey = rkey,
                          .wr_id = wr_id, .tag = tag, .signaled = signaled, .cas = cas,
                          .compare = compare, .operand = operand };
        wait_push(w, e, d);
        return 0;
    }
    issue_atomic(w, e, cas, compare, operand, result, raddr, rkey, wr_id, tag, signaled);
    return 0;
}

/* Sends one datagram as an active message with the sender's dense index as header.
 * Nothing is reported: datagrams may be lost. */
int hx_am_send(hx_worker *w, hx_ep *e, uint32_t from, uint32_t to_node, const void *data,
               size_t len)
{
    if (e->closed) {
        return 0; /* a datagram to a peer that left is lost, uncounted */
    }
    uint64_t *to = &w->sent_to[to_node < w->nodes ? to_node : 0];
    hx_op *op = op_next(w, NULL, 0, 0);
    op->silent = 1;
    ucp_request_param_t p;
    op_param(&p, op);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    uint32_t header = from;
    /* Counted before it can arrive, so that no process ever counts a datagram received
     * that its sender has not counted sent; taken back below if UCP refuses it. */
    bump(to, 1);
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
        bump(to, -1);
    }
    settle(op, sp);
    return 0;
}
