/*
 * A minimal UCP program: the yardstick of `hytra micro --backend ucx --ucp-baseline`.
 *
 * It measures the operations the `ucx` backend is built on (READ = ucp_get_nbx, WRITE =
 * ucp_put_nbx + ucp_ep_flush_nbx, CAS/FAA = ucp_atomic_op_nbx, RPC = an active-message
 * round trip) with nothing of hytra in between, so that the ratio "minimal / hytra" is
 * what hytra's layers cost. It is for that comparison only: it shares no code and no
 * state with shim.c, and it has no hytra logic (no verbs rules, no per-connection FIFO
 * fences, no completion queue, no coroutines).
 *
 * Shape: one UCP context; `nodes` UCP workers, each created, driven and destroyed by its
 * own pthread (UCS_THREAD_MODE_SINGLE); each worker owns a region from ucp_mem_map
 * (ALLOCATE), and keeps `outstanding` operations in flight to the next worker
 * ((me + 1) % nodes), reposting each as it completes, while its progress loop also
 * answers the active-message requests of the others (every worker both issues and
 * serves, as in hytra's micro benchmark).
 *
 * Time is read once per turn of the loop (after progress), not per operation: that keeps
 * the clock out of the measured cost, and makes a latency sample "post to the first loop
 * turn that saw the completion" (resolution: one turn).
 *
 * Like-for-like with hytra (crates/fabric/src/ucx/shim.c, crates/workloads/src/micro.rs):
 * - a WRITE in hytra's micro benchmark is a group of `batch` puts of which only the last
 *   is signaled, and hx_put follows a signaled put with ucp_ep_flush_nbx (so that its
 *   completion means "at the target", as with RC). Here a WRITE slot is the same:
 *   `signal_every` puts, then one endpoint flush; the slot completes with the flush.
 * - READ, CAS and FAA complete on their own in UCP; hytra reports them when the request
 *   completes, and so does this program.
 * - RPC: a request active message carrying the offset; the peer's progress loop answers
 *   with a reply active message carrying `payload` bytes of its region (a two-sided
 *   read). Both are sent eagerly, as hx_am_send does.
 * - endpoints get the error mode hytra's endpoints get (the caller passes it), and the
 *   loop yields its core after the same number of idle turns as hytra's run loop.
 *
 * Every failure is returned as an error code with a message; nothing aborts.
 */
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucp/api/ucp.h>

/* Limits. The Rust side mirrors NODES_MAX (the result layout) and OUTSTANDING_MAX (the
 * CLI refuses larger windows up front) and checks them through hytra_ucp_minimal_abi;
 * the others are checked here only, and the message says which one was exceeded. */
#define HYTRA_UCP_MINIMAL_NODES_MAX 8
#define MIN_OUTSTANDING_MAX 1024
#define MIN_PAYLOAD_MAX (64u * 1024)
/* Active messages are sent eagerly (as hytra's datagrams are); keep them small. */
#define MIN_AM_PAYLOAD_MAX 8192u
/* Payload-sized slots of each region: enough to spread accesses, few enough to stay in
 * cache (hytra's micro benchmark uses the same count). */
#define MIN_REGION_SLOTS 1024u
/* A stride coprime with MIN_REGION_SLOTS: successive operations visit every slot in a
 * scattered order without drawing random numbers. */
#define MIN_SLOT_STRIDE 389u
/* After the window, how long operations in flight may take to finish before the run is
 * declared stuck (TCP under a busy machine can be slow, but not this slow). */
#define MIN_DRAIN_MAX_NS 5000000000ull
/* Bound on waiting for an endpoint to close at teardown. */
#define MIN_CLOSE_MAX_NS 1000000000ull
/* At most one hour of measurement: a bound on the loop, far beyond any benchmark. */
#define MIN_RUN_MAX_NS 3600000000000ull
#define MIN_ERR_LEN 256
/* Two cache lines: the unit of false sharing with adjacent-line prefetch. */
#define MIN_CACHE_PAIR 128
/* Idle loop turns before a worker yields its core (hytra's stepper uses the same). */
#define MIN_IDLE_SPINS_MAX 64

#define AM_REQUEST_ID 11
#define AM_REPLY_ID 12

/* Latency histogram: log2 buckets split into 8 sub-buckets (12.5% resolution). */
#define HIST_SUB_BITS 3
#define HIST_BUCKETS ((64 - HIST_SUB_BITS + 1) << HIST_SUB_BITS)

enum hytra_ucp_minimal_op {
    MIN_OP_GET = 0,
    MIN_OP_PUT = 1,
    MIN_OP_CSWAP = 2,
    MIN_OP_FADD = 3,
    MIN_OP_AM = 4,
};

struct hytra_ucp_minimal_params {
    const char *transports; /* UCX_TLS syntax; NULL or "": UCX's choice */
    uint32_t op;            /* enum hytra_ucp_minimal_op */
    uint32_t nodes;         /* workers (one per thread), 2..=NODES_MAX */
    uint32_t payload;       /* bytes per operation; 8 for atomics */
    uint32_t outstanding;   /* operations in flight per worker */
    uint32_t signal_every;  /* PUT: puts per flush; divides `outstanding` */
    uint32_t peer_errors;   /* endpoints in UCP_ERR_HANDLING_MODE_PEER (else NONE) */
    uint64_t warmup_ns;
    uint64_t measure_ns;
};

struct hytra_ucp_minimal_node {
    uint64_t completed;     /* operations this worker issued that completed, any time */
    uint64_t in_window;     /* ... that completed inside the measurement window */
    uint64_t failed;        /* operations that completed with an error */
    uint64_t bad_data;      /* READ/RPC data or PUT slots that did not hold the pattern */
    uint64_t cas_won;       /* CSWAPs that found the expected value */
    uint64_t am_served;     /* requests this worker answered */
    uint64_t word0;         /* word 0 of this worker's region after the run (atomics) */
    uint64_t slots_written; /* slots of this region that hold the writer's PUT image */
};

struct hytra_ucp_minimal_result {
    uint64_t ops; /* completed inside the window, all workers */
    uint64_t latency_samples;
    uint64_t latency_mean_ns;
    uint64_t latency_p50_ns;
    uint64_t latency_p99_ns;
    struct hytra_ucp_minimal_node node[HYTRA_UCP_MINIMAL_NODES_MAX];
    char error[MIN_ERR_LEN];
};

/* An AM request: who asks, which of its slots waits, and where to read. */
typedef struct am_request {
    uint32_t from;
    uint32_t slot;
    uint64_t offset;
} am_request;

/* An AM reply's header: the requester's slot. */
typedef struct am_reply {
    uint32_t slot;
    uint32_t _pad;
} am_reply;

struct min_thread;

/* One unit of in-flight work: one operation, or for PUT a group of puts and a flush. */
typedef struct min_slot {
    struct min_thread *t;
    uint32_t index;
    uint32_t pending;        /* completions still to come (plus a guard while posting) */
    int32_t failed;
    int32_t awaiting_reply;  /* AM: the reply has not arrived yet */
    uint64_t t_post;
    uint64_t offset;         /* remote offset of the last operation */
    uint64_t operand;        /* atomics: read by UCP at post time */
    uint64_t compare;        /* CSWAP: the value it expects */
    uint64_t reply;          /* atomics: the old value lands here */
    am_request request;      /* AM: the header, alive until the send completes */
    uint8_t *buf;            /* `payload` bytes of this worker's scratch region */
} min_slot;

/* A reply this worker owes or is sending; alive until UCP is done with it. */
typedef struct min_reply {
    struct min_thread *t;
    uint32_t index;
    uint32_t from;
    uint64_t offset;
    am_reply header;
} min_reply;

typedef struct min_region {
    ucp_mem_h memh;
    uint8_t *base;
    size_t len;
    void *rkey_buf;
    size_t rkey_len;
} min_region;

typedef struct min_shared {
    struct hytra_ucp_minimal_params p;
    ucp_context_h ctx;
    min_region region[HYTRA_UCP_MINIMAL_NODES_MAX];  /* served by worker i */
    min_region scratch[HYTRA_UCP_MINIMAL_NODES_MAX]; /* worker i's local buffers */
    ucp_address_t *addr[HYTRA_UCP_MINIMAL_NODES_MAX];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t live;     /* threads that run and take part in the barriers */
    uint32_t arrived;
    uint64_t generation;
    uint64_t start_ns; /* set when the last thread reaches a barrier */
    int failed;        /* a thread failed: skip the remaining work, still tear down */
    atomic_int stop;   /* a thread failed during the run: leave the loop */
    atomic_uint drained;
    char error[MIN_ERR_LEN];
} min_shared;

/* Aligned (and allocated aligned) so that two workers' hot fields never share a cache
 * line, nor an adjacent-line prefetch pair: the threads would slow each other down. */
typedef struct __attribute__((aligned(MIN_CACHE_PAIR))) min_thread {
    min_shared *s;
    pthread_t tid;
    uint32_t me;
    uint32_t target;
    ucp_worker_h worker;
    ucp_ep_h ep[HYTRA_UCP_MINIMAL_NODES_MAX];
    ucp_rkey_h rkey; /* the target's region key, unpacked on ep[target] */
    uint64_t target_base;
    min_slot *slots;
    uint32_t nslots;
    uint32_t ops_per_slot;
    uint32_t *done; /* slots whose operations all completed, not yet accounted */
    uint32_t ndone;
    uint32_t *turn; /* the done list being accounted this turn */
    uint32_t busy;  /* slots in flight */
    uint32_t next_slot;
    uint64_t cas_known; /* CSWAP: the value the target word is believed to hold */
    min_reply *replies;
    uint32_t nreplies;
    uint32_t *free_replies;
    uint32_t nfree;
    uint32_t *queue; /* replies to send, FIFO */
    uint32_t qhead, qlen;
    uint32_t replies_busy; /* replies taken from the free list, not yet returned */
    int drained;
    int running; /* between connecting and the end of the drain */
    uint64_t lat_sum_ns;
    uint64_t lat_n;
    uint64_t hist[HIST_BUCKETS];
    struct hytra_ucp_minimal_node res;
} min_thread;

/* ---- helpers ---- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Records the first failure; later ones are consequences and would hide the cause. */
static void fail(min_shared *s, const char *fmt, ...)
{
    pthread_mutex_lock(&s->mu);
    if (s->error[0] == '\0') {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->error, sizeof s->error, fmt, ap);
        va_end(ap);
    }
    s->failed = 1;
    atomic_store(&s->stop, 1);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* A barrier of the live threads that also says whether everyone is still fine. Every
 * thread calls it the same number of times on every path (failure included), so the
 * counts always match; `live` shrinks if a thread could not be started. */
static int sync_all(min_shared *s, int ok)
{
    pthread_mutex_lock(&s->mu);
    if (!ok) {
        s->failed = 1;
    }
    uint64_t gen = s->generation;
    s->arrived++;
    while (gen == s->generation) {
        if (s->arrived >= s->live) {
            s->arrived = 0;
            s->generation++;
            s->start_ns = now_ns();
            pthread_cond_broadcast(&s->cv);
            break;
        }
        pthread_cond_wait(&s->cv, &s->mu);
    }
    int all_ok = !s->failed;
    pthread_mutex_unlock(&s->mu);
    return all_ok;
}

/* The word the owner of region `node` wrote at word index `k` (READ and RPC check it). */
static uint64_t pattern(uint32_t node, uint64_t k)
{
    return 0x5a5a000000000000ull ^ ((uint64_t)(node + 1) << 40) ^ k;
}

/* The word a PUT from `writer` leaves in every word of the slots it writes. */
static uint64_t put_tag(uint32_t writer)
{
    return 0xc0de000000000000ull | (uint64_t)(writer + 1);
}

static unsigned hist_bucket(uint64_t v)
{
    if (v < (1u << HIST_SUB_BITS)) {
        return (unsigned)v;
    }
    unsigned k = 63u - (unsigned)__builtin_clzll(v);
    unsigned sub = (unsigned)(v >> (k - HIST_SUB_BITS)) & ((1u << HIST_SUB_BITS) - 1);
    return ((k - HIST_SUB_BITS + 1) << HIST_SUB_BITS) + sub;
}

/* The middle of a bucket's range. */
static uint64_t hist_value(unsigned b)
{
    unsigned group = b >> HIST_SUB_BITS;
    uint64_t sub = b & ((1u << HIST_SUB_BITS) - 1);
    if (group == 0) {
        return sub;
    }
    unsigned shift = group - 1;
    uint64_t low = (((uint64_t)1 << HIST_SUB_BITS) | sub) << shift;
    return low + (((uint64_t)1 << shift) >> 1);
}

static uint64_t hist_quantile(const uint64_t *hist, uint64_t n, double q)
{
    if (n == 0) {
        return 0;
    }
    uint64_t want = (uint64_t)(q * (double)n);
    if (want == 0) {
        want = 1;
    }
    uint64_t seen = 0;
    for (unsigned b = 0; b < HIST_BUCKETS; b++) {
        seen += hist[b];
        if (seen >= want) {
            return hist_value(b);
        }
    }
    return hist_value(HIST_BUCKETS - 1);
}

static const char *op_name(uint32_t op)
{
    static const char *names[] = { "get", "put", "cswap", "fadd", "am" };
    return op < 5 ? names[op] : "?";
}

/* ---- completions ---- */

static void slot_release(min_slot *slot)
{
    if (--slot->pending == 0) {
        min_thread *t = slot->t;
        t->done[t->ndone++] = slot->index;
    }
}

static void op_done(void *request, ucs_status_t status, void *user_data)
{
    min_slot *slot = user_data;
    if (status != UCS_OK) {
        slot->failed = 1;
    }
    ucp_request_free(request);
    slot_release(slot);
}

/* Settles what an nbx call returned: done at once, failed at once, or in flight (then
 * op_done releases it). */
static void track(min_slot *slot, ucs_status_ptr_t sp)
{
    if (sp == NULL) {
        return;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        slot->failed = 1;
        return;
    }
    slot->pending++;
}

static ucs_status_t am_request_arrived(void *arg, const void *header, size_t header_len,
                                       void *data, size_t len, const ucp_am_recv_param_t *param)
{
    (void)data;
    (void)param;
    min_thread *t = arg;
    am_request rq;
    if (header_len != sizeof rq || len != 0) {
        t->res.failed++;
        return UCS_OK;
    }
    memcpy(&rq, header, sizeof rq);
    uint64_t payload = t->s->p.payload;
    if (rq.from >= t->s->p.nodes || rq.from == t->me || rq.offset % 8 != 0 ||
        rq.offset + payload > t->s->region[t->me].len || t->nfree == 0) {
        /* Cannot happen with a well-formed peer: every requester has at most `nslots`
         * requests out, and there are `nreplies` entries for all of them. */
        t->res.failed++;
        return UCS_OK;
    }
    uint32_t i = t->free_replies[--t->nfree];
    t->replies_busy++;
    min_reply *r = &t->replies[i];
    r->from = rq.from;
    r->offset = rq.offset;
    r->header.slot = rq.slot;
    r->header._pad = 0;
    t->queue[(t->qhead + t->qlen) % t->nreplies] = i;
    t->qlen++;
    return UCS_OK;
}

static ucs_status_t am_reply_arrived(void *arg, const void *header, size_t header_len,
                                     void *data, size_t len, const ucp_am_recv_param_t *param)
{
    min_thread *t = arg;
    am_reply rp;
    if (header_len != sizeof rp) {
        t->res.failed++;
        return UCS_OK;
    }
    memcpy(&rp, header, sizeof rp);
    if (rp.slot >= t->nslots || !t->slots[rp.slot].awaiting_reply) {
        t->res.failed++;
        return UCS_OK;
    }
    min_slot *slot = &t->slots[rp.slot];
    slot->awaiting_reply = 0;
    if (len != t->s->p.payload || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        slot->failed = 1;
    } else {
        memcpy(slot->buf, data, len);
    }
    slot_release(slot);
    return UCS_OK;
}

static void reply_put_back(min_reply *r)
{
    min_thread *t = r->t;
    t->free_replies[t->nfree++] = r->index;
    t->replies_busy--;
}

static void reply_done(void *request, ucs_status_t status, void *user_data)
{
    min_reply *r = user_data;
    if (status != UCS_OK) {
        r->t->res.failed++;
    }
    ucp_request_free(request);
    reply_put_back(r);
}

/* Answers the requests that arrived during progress: the reply carries `payload` bytes
 * of this worker's region, sent from the region itself (it does not change). */
static void serve(min_thread *t)
{
    min_shared *s = t->s;
    while (t->qlen > 0) {
        min_reply *r = &t->replies[t->queue[t->qhead]];
        t->qhead = (t->qhead + 1) % t->nreplies;
        t->qlen--;
        ucp_request_param_t p; /* only the fields op_attr_mask names, as in slot_param */
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_FLAGS;
        p.cb.send = reply_done;
        p.user_data = r;
        p.flags = UCP_AM_SEND_FLAG_EAGER;
        ucs_status_ptr_t sp =
            ucp_am_send_nbx(t->ep[r->from], AM_REPLY_ID, &r->header, sizeof r->header,
                            s->region[t->me].base + r->offset, s->p.payload, &p);
        if (UCS_PTR_IS_ERR(sp)) {
            t->res.failed++;
            reply_put_back(r);
            continue;
        }
        t->res.am_served++;
        if (sp == NULL) {
            reply_put_back(r);
        }
    }
}

/* ---- posting ---- */

static uint64_t next_offset(min_thread *t)
{
    t->next_slot = (t->next_slot + MIN_SLOT_STRIDE) % MIN_REGION_SLOTS;
    return (uint64_t)t->next_slot * t->s->p.payload;
}

/* Fills an operation's parameters in place, only the fields `op_attr_mask` names (UCP
 * reads no others). Zeroing the struct and returning it by value made every post stall
 * on store forwarding (the copy's loads overlap the zeroing's stores), which cost this
 * program half of its time on a READ: a yardstick must not be slower than it needs to be. */
static void slot_param(ucp_request_param_t *p, min_slot *slot)
{
    p->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p->cb.send = op_done;
    p->user_data = slot;
}

static void post(min_thread *t, min_slot *slot, uint64_t now)
{
    const struct hytra_ucp_minimal_params *prm = &t->s->p;
    ucp_ep_h ep = t->ep[t->target];
    slot->t_post = now;
    slot->failed = 0;
    slot->pending = 1; /* the guard: no completion counts until everything is posted */
    t->busy++;
    ucp_request_param_t p;
    slot_param(&p, slot);
    switch (prm->op) {
    case MIN_OP_GET:
        slot->offset = next_offset(t);
        track(slot, ucp_get_nbx(ep, slot->buf, prm->payload, t->target_base + slot->offset,
                                t->rkey, &p));
        break;
    case MIN_OP_PUT:
        /* hytra's WRITE: `signal_every` puts, the last signaled, which hx_put turns into
         * a flush so that completion means the data reached the target. */
        for (uint32_t j = 0; j < prm->signal_every; j++) {
            slot->offset = next_offset(t);
            track(slot, ucp_put_nbx(ep, slot->buf, prm->payload,
                                    t->target_base + slot->offset, t->rkey, &p));
        }
        track(slot, ucp_ep_flush_nbx(ep, &p));
        break;
    case MIN_OP_CSWAP:
    case MIN_OP_FADD:
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
        p.datatype = ucp_dt_make_contig(8);
        p.reply_buffer = &slot->reply;
        if (prm->op == MIN_OP_CSWAP) {
            /* CSWAP compares with the operand and swaps in the reply buffer's value. */
            slot->compare = t->cas_known;
            slot->operand = slot->compare;
            slot->reply = slot->compare + 1;
            track(slot, ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_CSWAP, &slot->operand, 1,
                                          t->target_base, t->rkey, &p));
        } else {
            slot->operand = 1;
            track(slot, ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_ADD, &slot->operand, 1,
                                          t->target_base, t->rkey, &p));
        }
        break;
    case MIN_OP_AM:
        slot->offset = next_offset(t);
        slot->request.from = t->me;
        slot->request.slot = slot->index;
        slot->request.offset = slot->offset;
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_AM_SEND_FLAG_EAGER;
        {
            ucs_status_ptr_t sp = ucp_am_send_nbx(ep, AM_REQUEST_ID, &slot->request,
                                                  sizeof slot->request, NULL, 0, &p);
            if (!UCS_PTR_IS_ERR(sp)) {
                /* The reply is one more completion; the slot is reused only after both
                 * it and the send (which owns `request` until then) are done. */
                slot->awaiting_reply = 1;
                slot->pending++;
            }
            track(slot, sp);
        }
        break;
    }
    slot_release(slot);
}

/* Accounts a completed slot at time `now`. */
static void finish(min_thread *t, min_slot *slot, uint64_t now, uint64_t w0, uint64_t w1)
{
    const struct hytra_ucp_minimal_params *prm = &t->s->p;
    uint64_t ops = t->ops_per_slot;
    t->busy--;
    if (slot->failed) {
        t->res.failed += ops;
        return;
    }
    t->res.completed += ops;
    switch (prm->op) {
    case MIN_OP_GET:
    case MIN_OP_AM: {
        /* The first and last word of what arrived must be what the owner wrote there. */
        uint64_t first, last, k = slot->offset / 8, words = prm->payload / 8;
        memcpy(&first, slot->buf, 8);
        memcpy(&last, slot->buf + prm->payload - 8, 8);
        if (first != pattern(t->target, k) || last != pattern(t->target, k + words - 1)) {
            t->res.bad_data++;
        }
        break;
    }
    case MIN_OP_CSWAP:
        if (slot->reply == slot->compare) {
            t->res.cas_won++;
            if (t->cas_known <= slot->compare) {
                t->cas_known = slot->compare + 1;
            }
        } else if (slot->reply > t->cas_known) {
            t->cas_known = slot->reply;
        }
        break;
    default:
        break;
    }
    if (now >= w0 && now < w1) {
        t->res.in_window += ops;
        uint64_t lat = now - slot->t_post;
        t->hist[hist_bucket(lat)]++;
        t->lat_sum_ns += lat;
        t->lat_n++;
    }
}

/* Accounts the slots that completed since the last turn and, while the window is open,
 * reposts them. Returns how many there were. */
static uint32_t account(min_thread *t, uint64_t now, uint64_t w0, uint64_t w1)
{
    uint32_t n = t->ndone;
    memcpy(t->turn, t->done, n * sizeof *t->turn);
    t->ndone = 0;
    for (uint32_t i = 0; i < n; i++) {
        min_slot *slot = &t->slots[t->turn[i]];
        finish(t, slot, now, w0, w1);
        if (now < w1) {
            post(t, slot, now);
        }
    }
    return n;
}

/* The measurement: keep every slot busy until the window closes, then drain while still
 * answering the others' requests until every worker is drained. */
static void run_loop(min_thread *t)
{
    min_shared *s = t->s;
    uint64_t w0 = s->start_ns + s->p.warmup_ns;
    uint64_t w1 = w0 + s->p.measure_ns;
    uint64_t deadline = w1 + MIN_DRAIN_MAX_NS;
    for (uint32_t i = 0; i < t->nslots; i++) {
        post(t, &t->slots[i], s->start_ns);
    }
    uint32_t idle_turns = 0;
    for (;;) {
        unsigned events = ucp_worker_progress(t->worker);
        uint32_t requests = t->qlen;
        serve(t);
        uint64_t now = now_ns();
        if (events == 0 && requests == 0 && account(t, now, w0, w1) == 0) {
            /* Nothing happened: spin a while, then give the core away. On a machine with
             * fewer free cores than busy threads, a thread that only spins holds the core
             * its peer needs to answer (TCP, active messages). hytra's run loop
             * (crates/fabric/src/stepper.rs) does the same, so neither side is penalised
             * for sharing cores. */
            if (++idle_turns > MIN_IDLE_SPINS_MAX) {
                sched_yield();
            }
        } else {
            idle_turns = 0;
        }
        if (atomic_load_explicit(&s->stop, memory_order_relaxed)) {
            return;
        }
        if (now < w1) {
            continue;
        }
        if (!t->drained && t->busy == 0) {
            t->drained = 1;
            atomic_fetch_add(&s->drained, 1);
        }
        if (t->drained && t->replies_busy == 0 && atomic_load(&s->drained) == s->live) {
            return;
        }
        if (now > deadline) {
            fail(s, "worker %u: %u %s operations still in flight %.1f s after the window",
                 t->me, t->busy * t->ops_per_slot, op_name(s->p.op),
                 (double)MIN_DRAIN_MAX_NS / 1e9);
            return;
        }
    }
}

/* ---- setup and teardown of one worker (on its own thread) ---- */

static int thread_alloc(min_thread *t)
{
    const struct hytra_ucp_minimal_params *prm = &t->s->p;
    t->ops_per_slot = prm->op == MIN_OP_PUT ? prm->signal_every : 1;
    t->nslots = prm->outstanding / t->ops_per_slot;
    t->nreplies = t->nslots * (prm->nodes - 1);
    t->slots = calloc(t->nslots, sizeof *t->slots);
    t->done = calloc(t->nslots, sizeof *t->done);
    t->turn = calloc(t->nslots, sizeof *t->turn);
    t->replies = calloc(t->nreplies, sizeof *t->replies);
    t->free_replies = calloc(t->nreplies, sizeof *t->free_replies);
    t->queue = calloc(t->nreplies, sizeof *t->queue);
    if (!t->slots || !t->done || !t->turn || !t->replies || !t->free_replies || !t->queue) {
        fail(t->s, "worker %u: out of memory", t->me);
        return 0;
    }
    uint8_t *scratch = t->s->scratch[t->me].base;
    for (uint32_t i = 0; i < t->nslots; i++) {
        t->slots[i].t = t;
        t->slots[i].index = i;
        t->slots[i].buf = scratch + (size_t)i * prm->payload;
    }
    for (uint32_t i = 0; i < t->nreplies; i++) {
        t->replies[i].t = t;
        t->replies[i].index = i;
        t->free_replies[i] = t->nreplies - 1 - i;
    }
    t->nfree = t->nreplies;
    return 1;
}

static int set_handler(min_thread *t, unsigned id, ucp_am_recv_callback_t cb)
{
    ucp_am_handler_param_t hp;
    memset(&hp, 0, sizeof hp);
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = id;
    hp.cb = cb;
    hp.arg = t;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    ucs_status_t st = ucp_worker_set_am_recv_handler(t->worker, &hp);
    if (st != UCS_OK) {
        fail(t->s, "worker %u: ucp_worker_set_am_recv_handler: %s", t->me, ucs_status_string(st));
        return 0;
    }
    return 1;
}

static int worker_create(min_thread *t)
{
    min_shared *s = t->s;
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucs_status_t st = ucp_worker_create(s->ctx, &wp, &t->worker);
    if (st != UCS_OK) {
        t->worker = NULL;
        fail(s, "worker %u: ucp_worker_create: %s", t->me, ucs_status_string(st));
        return 0;
    }
    if (!set_handler(t, AM_REQUEST_ID, am_request_arrived) ||
        !set_handler(t, AM_REPLY_ID, am_reply_arrived)) {
        return 0;
    }
    size_t len = 0;
    st = ucp_worker_get_address(t->worker, &s->addr[t->me], &len);
    if (st != UCS_OK) {
        s->addr[t->me] = NULL;
        fail(s, "worker %u: ucp_worker_get_address: %s", t->me, ucs_status_string(st));
        return 0;
    }
    return 1;
}

/* A peer failed (only reported in peer mode). During the run that is a failed run;
 * at teardown it is the other side closing first. */
static void ep_failed(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    min_thread *t = arg;
    if (t->running) {
        fail(t->s, "worker %u: endpoint failed: %s", t->me, ucs_status_string(status));
    }
}

static int connect_all(min_thread *t)
{
    min_shared *s = t->s;
    for (uint32_t n = 0; n < s->p.nodes; n++) {
        if (n == t->me) {
            continue;
        }
        ucp_ep_params_t ep;
        memset(&ep, 0, sizeof ep);
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.address = s->addr[n];
        /* The error mode can change which protocols UCP picks, so it follows the caller,
         * who sets it as hytra's backend does: peer failures reported unless shared
         * memory is among the transports (whose UCX 1.13 transports refuse that mode). */
        ep.err_mode = s->p.peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
        ep.err_handler.cb = ep_failed;
        ep.err_handler.arg = t;
        ucs_status_t st = ucp_ep_create(t->worker, &ep, &t->ep[n]);
        if (st != UCS_OK) {
            t->ep[n] = NULL;
            fail(s, "worker %u: ucp_ep_create to worker %u: %s", t->me, n,
                 ucs_status_string(st));
            return 0;
        }
    }
    ucs_status_t st = ucp_ep_rkey_unpack(t->ep[t->target], s->region[t->target].rkey_buf,
                                         &t->rkey);
    if (st != UCS_OK) {
        t->rkey = NULL;
        fail(s, "worker %u: ucp_ep_rkey_unpack: %s", t->me, ucs_status_string(st));
        return 0;
    }
    t->target_base = (uint64_t)(uintptr_t)s->region[t->target].base;
    return 1;
}

static void ep_close(min_thread *t, ucp_ep_h ep)
{
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    /* Everything is drained (or the run failed): nothing is left to flush, and a forced
     * close needs nothing from the peer. */
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t sp = ucp_ep_close_nbx(ep, &p);
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
        return;
    }
    uint64_t until = now_ns() + MIN_CLOSE_MAX_NS;
    while (ucp_request_check_status(sp) == UCS_INPROGRESS && now_ns() < until) {
        ucp_worker_progress(t->worker);
    }
    ucp_request_free(sp);
}

static void *thread_main(void *arg)
{
    min_thread *t = arg;
    min_shared *s = t->s;
    /* Four barriers on every path: worker up, connected, run over, endpoints closed. */
    int ok = thread_alloc(t) && worker_create(t);
    ok = sync_all(s, ok);
    if (ok) {
        ok = connect_all(t);
    }
    ok = sync_all(s, ok);
    if (ok) {
        t->running = 1;
        run_loop(t);
        t->running = 0;
    }
    sync_all(s, 1);
    if (t->rkey != NULL) {
        ucp_rkey_destroy(t->rkey);
    }
    for (uint32_t n = 0; n < s->p.nodes; n++) {
        if (t->ep[n] != NULL) {
            ep_close(t, t->ep[n]);
        }
    }
    /* Nobody destroys a worker while another still has an endpoint open to it. */
    sync_all(s, 1);
    if (t->worker != NULL) {
        if (s->addr[t->me] != NULL) {
            ucp_worker_release_address(t->worker, s->addr[t->me]);
            s->addr[t->me] = NULL;
        }
        ucp_worker_destroy(t->worker);
    }
    return NULL;
}

static void thread_free(min_thread *t)
{
    free(t->slots);
    free(t->done);
    free(t->turn);
    free(t->replies);
    free(t->free_replies);
    free(t->queue);
}

/* ---- the process side: context, memory, threads, results ---- */

static int check_params(const struct hytra_ucp_minimal_params *p, char *err)
{
    int atomic = p->op == MIN_OP_CSWAP || p->op == MIN_OP_FADD;
    if (p->op > MIN_OP_AM) {
        snprintf(err, MIN_ERR_LEN, "unknown operation %u", p->op);
    } else if (p->nodes < 2 || p->nodes > HYTRA_UCP_MINIMAL_NODES_MAX) {
        snprintf(err, MIN_ERR_LEN, "nodes %u: must be in 2..=%u", p->nodes,
                 HYTRA_UCP_MINIMAL_NODES_MAX);
    } else if (p->payload == 0 || p->payload % 8 != 0 || p->payload > MIN_PAYLOAD_MAX) {
        snprintf(err, MIN_ERR_LEN, "payload %u B: must be a positive multiple of 8 up to %u",
                 p->payload, MIN_PAYLOAD_MAX);
    } else if (atomic && p->payload != 8) {
        snprintf(err, MIN_ERR_LEN, "payload %u B: atomics move 8 bytes", p->payload);
    } else if (p->op == MIN_OP_AM && p->payload > MIN_AM_PAYLOAD_MAX) {
        snprintf(err, MIN_ERR_LEN, "payload %u B: active messages carry at most %u B here",
                 p->payload, MIN_AM_PAYLOAD_MAX);
    } else if (p->outstanding == 0 || p->outstanding > MIN_OUTSTANDING_MAX) {
        snprintf(err, MIN_ERR_LEN, "outstanding %u: must be in 1..=%u", p->outstanding,
                 MIN_OUTSTANDING_MAX);
    } else if (p->op == MIN_OP_PUT &&
               (p->signal_every == 0 || p->outstanding % p->signal_every != 0)) {
        snprintf(err, MIN_ERR_LEN,
                 "signal_every %u: must be positive and divide outstanding (%u)",
                 p->signal_every, p->outstanding);
    } else if (p->measure_ns == 0 || p->measure_ns > MIN_RUN_MAX_NS ||
               p->warmup_ns > MIN_RUN_MAX_NS) {
        snprintf(err, MIN_ERR_LEN, "warmup %llu ns, window %llu ns: the window must be "
                 "positive and each at most an hour",
                 (unsigned long long)p->warmup_ns, (unsigned long long)p->measure_ns);
    } else {
        return 1;
    }
    return 0;
}

static ucp_context_h context_create(const char *tls, char *err)
{
    ucp_config_t *config = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        snprintf(err, MIN_ERR_LEN, "ucp_config_read: %s", ucs_status_string(st));
        return NULL;
    }
    if (tls != NULL && tls[0] != '\0') {
        st = ucp_config_modify(config, "TLS", tls);
        if (st != UCS_OK) {
            snprintf(err, MIN_ERR_LEN, "UCX_TLS=%s: %s", tls, ucs_status_string(st));
            ucp_config_release(config);
            return NULL;
        }
    }
    ucp_params_t params;
    memset(&params, 0, sizeof params);
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_AM;
    /* Workers of this context run on different threads at once (context-level state such
     * as the registration cache is then locked); hytra's context is created alike. */
    params.mt_workers_shared = 1;
    ucp_context_h ctx = NULL;
    st = ucp_init(&params, config, &ctx);
    ucp_config_release(config);
    if (st != UCS_OK) {
        snprintf(err, MIN_ERR_LEN, "ucp_init: %s", ucs_status_string(st));
        return NULL;
    }
    return ctx;
}

static int region_map(ucp_context_h ctx, min_region *r, size_t len, int pack, char *err)
{
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof mp);
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = NULL;
    mp.length = len;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    ucs_status_t st = ucp_mem_map(ctx, &mp, &r->memh);
    if (st != UCS_OK) {
        r->memh = NULL;
        snprintf(err, MIN_ERR_LEN, "ucp_mem_map(%zu B): %s", len, ucs_status_string(st));
        return 0;
    }
    ucp_mem_attr_t attr;
    memset(&attr, 0, sizeof attr);
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    st = ucp_mem_query(r->memh, &attr);
    if (st != UCS_OK || attr.length < len || (uintptr_t)attr.address % 8 != 0) {
        snprintf(err, MIN_ERR_LEN, "ucp_mem_query: %s", ucs_status_string(st));
        return 0;
    }
    r->base = attr.address;
    r->len = len;
    memset(r->base, 0, len);
    if (pack) {
        st = ucp_rkey_pack(ctx, r->memh, &r->rkey_buf, &r->rkey_len);
        if (st != UCS_OK) {
            r->rkey_buf = NULL;
            snprintf(err, MIN_ERR_LEN, "ucp_rkey_pack: %s", ucs_status_string(st));
            return 0;
        }
    }
    return 1;
}

static void region_unmap(ucp_context_h ctx, min_region *r)
{
    if (r->rkey_buf != NULL) {
        ucp_rkey_buffer_release(r->rkey_buf);
    }
    if (r->memh != NULL) {
        ucp_mem_unmap(ctx, r->memh);
    }
    memset(r, 0, sizeof *r);
}

/* Writes what READ and RPC will check, or leaves zeroes for PUT and the atomics. */
static void region_fill(min_shared *s, uint32_t node)
{
    if (s->p.op != MIN_OP_GET && s->p.op != MIN_OP_AM) {
        return;
    }
    min_region *r = &s->region[node];
    for (uint64_t k = 0; k < r->len / 8; k++) {
        uint64_t v = pattern(node, k);
        memcpy(r->base + k * 8, &v, 8);
    }
}

/* After the run: what the others' operations left in each region. */
static void region_inspect(min_shared *s, uint32_t node, struct hytra_ucp_minimal_node *out)
{
    min_region *r = &s->region[node];
    memcpy(&out->word0, r->base, 8);
    if (s->p.op != MIN_OP_PUT) {
        return;
    }
    uint32_t writer = (node + s->p.nodes - 1) % s->p.nodes;
    uint64_t tag = put_tag(writer);
    for (uint64_t slot = 0; slot < MIN_REGION_SLOTS; slot++) {
        const uint8_t *at = r->base + slot * s->p.payload;
        uint64_t first;
        memcpy(&first, at, 8);
        if (first == 0) {
            continue;
        }
        int whole = first == tag;
        for (uint32_t j = 8; whole && j < s->p.payload; j += 8) {
            uint64_t w;
            memcpy(&w, at + j, 8);
            whole = w == tag;
        }
        if (whole) {
            out->slots_written++;
        } else {
            out->bad_data++;
        }
    }
}

static void collect(min_shared *s, min_thread *threads, struct hytra_ucp_minimal_result *r)
{
    uint64_t hist[HIST_BUCKETS];
    memset(hist, 0, sizeof hist);
    uint64_t sum = 0, n = 0;
    for (uint32_t i = 0; i < s->p.nodes; i++) {
        min_thread *t = &threads[i];
        r->node[i] = t->res;
        region_inspect(s, i, &r->node[i]);
        r->ops += t->res.in_window;
        sum += t->lat_sum_ns;
        n += t->lat_n;
        for (unsigned b = 0; b < HIST_BUCKETS; b++) {
            hist[b] += t->hist[b];
        }
    }
    r->latency_samples = n;
    r->latency_mean_ns = n ? sum / n : 0;
    r->latency_p50_ns = hist_quantile(hist, n, 0.5);
    r->latency_p99_ns = hist_quantile(hist, n, 0.99);
}

/* Lets the caller check that its declarations have this file's layout. */
void hytra_ucp_minimal_abi(size_t *params_size, size_t *result_size, uint32_t *nodes_max,
                           uint32_t *outstanding_max)
{
    *params_size = sizeof(struct hytra_ucp_minimal_params);
    *result_size = sizeof(struct hytra_ucp_minimal_result);
    *nodes_max = HYTRA_UCP_MINIMAL_NODES_MAX;
    *outstanding_max = MIN_OUTSTANDING_MAX;
}

/* Runs the whole program; 0 on success, otherwise -1 with `r->error` set. Blocks for
 * warmup + window + drain. */
int hytra_ucp_minimal_run(const struct hytra_ucp_minimal_params *p,
                          struct hytra_ucp_minimal_result *r)
{
    memset(r, 0, sizeof *r);
    if (!check_params(p, r->error)) {
        return -1;
    }
    min_shared *s = calloc(1, sizeof *s);
    min_thread *threads = NULL;
    if (posix_memalign((void **)&threads, MIN_CACHE_PAIR, p->nodes * sizeof *threads) == 0) {
        memset(threads, 0, p->nodes * sizeof *threads);
    } else {
        threads = NULL;
    }
    if (s == NULL || threads == NULL) {
        free(s);
        free(threads);
        snprintf(r->error, MIN_ERR_LEN, "out of memory");
        return -1;
    }
    s->p = *p;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int ok = 1;
    s->ctx = context_create(p->transports, r->error);
    ok = s->ctx != NULL;
    size_t region_len = (size_t)MIN_REGION_SLOTS * p->payload;
    uint32_t slot_ops = p->op == MIN_OP_PUT ? p->signal_every : 1;
    size_t scratch_len = (size_t)(p->outstanding / slot_ops) * p->payload;
    for (uint32_t i = 0; ok && i < p->nodes; i++) {
        ok = region_map(s->ctx, &s->region[i], region_len, 1, r->error) &&
             region_map(s->ctx, &s->scratch[i], scratch_len, 0, r->error);
        if (ok) {
            region_fill(s, i);
            if (p->op == MIN_OP_PUT) {
                /* Every slot buffer is the worker's PUT image. */
                uint64_t tag = put_tag(i);
                for (size_t k = 0; k < scratch_len / 8; k++) {
                    memcpy(s->scratch[i].base + k * 8, &tag, 8);
                }
            }
        }
    }
    if (ok) {
        s->live = p->nodes;
        for (uint32_t i = 0; i < p->nodes; i++) {
            threads[i].s = s;
            threads[i].me = i;
            threads[i].target = (i + 1) % p->nodes;
        }
        uint32_t started = 0;
        for (; started < p->nodes; started++) {
            if (pthread_create(&threads[started].tid, NULL, thread_main, &threads[started]) != 0) {
                break;
            }
        }
        if (started < p->nodes) {
            /* The started threads meet at the barriers without the missing ones. */
            pthread_mutex_lock(&s->mu);
            s->live = started;
            pthread_mutex_unlock(&s->mu);
            fail(s, "pthread_create failed for worker %u of %u", started, p->nodes);
        }
        for (uint32_t i = 0; i < started; i++) {
            pthread_join(threads[i].tid, NULL);
        }
        if (s->failed || s->error[0] != '\0') {
            ok = 0;
            snprintf(r->error, MIN_ERR_LEN, "%s", s->error[0] ? s->error : "a worker failed");
        } else {
            collect(s, threads, r);
        }
        for (uint32_t i = 0; i < p->nodes; i++) {
            thread_free(&threads[i]);
        }
    }
    for (uint32_t i = 0; i < p->nodes; i++) {
        if (s->ctx != NULL) {
            region_unmap(s->ctx, &s->region[i]);
            region_unmap(s->ctx, &s->scratch[i]);
        }
    }
    if (s->ctx != NULL) {
        ucp_cleanup(s->ctx);
    }
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    free(threads);
    return ok ? 0 : -1;
}
