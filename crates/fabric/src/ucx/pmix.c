/*
 * hytra's thin layer over PMIx (the launcher's key-value store: Put / Commit / Fence /
 * Get), for the `pmix` feature of crates/fabric. Not for: anything of UCX.
 *
 * The library is loaded with dlopen at run time, not linked: a binary built with the
 * feature still starts on a host without libpmix, and a process started by a launcher
 * on such a host gets a clear message instead of the dynamic loader's. Only plain
 * functions of the PMIx standard (v2 and later) are called; none of pmix.h's macros
 * that call into the library are used, since those would need the library at link
 * time.
 *
 * Fences are started non-blocking and polled, so that every wait of the Rust side has
 * its own deadline: a peer that never comes makes an error, not a hang.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pmix.h>

typedef pmix_status_t (*init_fn)(pmix_proc_t *, pmix_info_t *, size_t);
typedef pmix_status_t (*finalize_fn)(const pmix_info_t *, size_t);
typedef pmix_status_t (*put_fn)(pmix_scope_t, const pmix_key_t, pmix_value_t *);
typedef pmix_status_t (*commit_fn)(void);
typedef pmix_status_t (*fence_nb_fn)(const pmix_proc_t *, size_t, const pmix_info_t *, size_t,
                                     pmix_op_cbfunc_t, void *);
typedef pmix_status_t (*get_fn)(const pmix_proc_t *, const pmix_key_t, const pmix_info_t *,
                                size_t, pmix_value_t **);
typedef const char *(*error_string_fn)(pmix_status_t);

/* One fence in progress: written by PMIx's progress thread, read by the caller. */
typedef struct hx_fence {
    atomic_int done;
    atomic_int status;
} hx_fence;

typedef struct hx_pmix {
    void *lib;
    init_fn init;
    finalize_fn finalize;
    put_fn put;
    commit_fn commit;
    fence_nb_fn fence_nb;
    get_fn get;
    error_string_fn error_string;
    pmix_proc_t me;
    pmix_proc_t all; /* the whole job: rank wildcard */
    /* The fence's attribute; PMIx reads it until the callback, so it lives here. */
    pmix_info_t collect;
    hx_fence *fence; /* the fence in progress, if any (owned: see hx_pmix_fence_poll) */
} hx_pmix;

static const char *status_text(const hx_pmix *p, pmix_status_t st)
{
    const char *s = p->error_string != NULL ? p->error_string(st) : NULL;
    return s != NULL ? s : "unknown PMIx status";
}

static void *sym(void *lib, const char *name, char *err, size_t err_len)
{
    void *f = dlsym(lib, name);
    if (f == NULL) {
        snprintf(err, err_len, "libpmix has no %s: is it PMIx 2 or newer?", name);
    }
    return f;
}

/* Loads libpmix (`lib`, or the system's libpmix.so.2 when NULL), joins the job and
 * learns this process's rank and the job's size. NULL on failure, with `err` set. */
hx_pmix *hx_pmix_init(const char *lib, uint32_t *rank, uint32_t *size, char *err, size_t err_len)
{
    const char *names[] = { lib, "libpmix.so.2", "libpmix.so" };
    void *handle = NULL;
    const char *tried = NULL;
    for (size_t i = (lib != NULL ? 0 : 1); i < (lib != NULL ? 1 : 3) && handle == NULL; i++) {
        tried = names[i];
        handle = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    }
    if (handle == NULL) {
        const char *why = dlerror();
        snprintf(err, err_len, "cannot load %s (%s): install libpmix2 or point HYTRA_PMIX_LIB at the launcher's libpmix",
                 tried, why != NULL ? why : "not found");
        return NULL;
    }
    hx_pmix *p = calloc(1, sizeof *p);
    if (p == NULL) {
        snprintf(err, err_len, "out of memory");
        dlclose(handle);
        return NULL;
    }
    p->lib = handle;
    if ((p->init = (init_fn)sym(handle, "PMIx_Init", err, err_len)) == NULL ||
        (p->finalize = (finalize_fn)sym(handle, "PMIx_Finalize", err, err_len)) == NULL ||
        (p->put = (put_fn)sym(handle, "PMIx_Put", err, err_len)) == NULL ||
        (p->commit = (commit_fn)sym(handle, "PMIx_Commit", err, err_len)) == NULL ||
        (p->fence_nb = (fence_nb_fn)sym(handle, "PMIx_Fence_nb", err, err_len)) == NULL ||
        (p->get = (get_fn)sym(handle, "PMIx_Get", err, err_len)) == NULL ||
        (p->error_string = (error_string_fn)sym(handle, "PMIx_Error_string", err, err_len)) ==
            NULL) {
        dlclose(handle);
        free(p);
        return NULL;
    }
    pmix_status_t st = p->init(&p->me, NULL, 0);
    if (st != PMIX_SUCCESS) {
        snprintf(err, err_len, "PMIx_Init: %s (is a PMIx server running: srun --mpi=pmix, mpirun?)",
                 status_text(p, st));
        dlclose(handle);
        free(p);
        return NULL;
    }
    memset(&p->all, 0, sizeof p->all);
    memcpy(p->all.nspace, p->me.nspace, sizeof p->all.nspace);
    p->all.rank = PMIX_RANK_WILDCARD;
    pmix_value_t *v = NULL;
    st = p->get(&p->all, PMIX_JOB_SIZE, NULL, 0, &v);
    if (st != PMIX_SUCCESS || v == NULL || v->type != PMIX_UINT32) {
        snprintf(err, err_len, "PMIx_Get(%s): %s", PMIX_JOB_SIZE,
                 st != PMIX_SUCCESS ? status_text(p, st) : "not a uint32");
        free(v);
        p->finalize(NULL, 0);
        dlclose(handle);
        free(p);
        return NULL;
    }
    *size = v->data.uint32;
    free(v);
    *rank = p->me.rank;
    return p;
}

/* Publishes `len` bytes under `key` for every process of the job (seen by others once
 * committed and fenced). */
int hx_pmix_put(hx_pmix *p, const char *key, const void *data, size_t len, char *err,
                size_t err_len)
{
    pmix_value_t v;
    memset(&v, 0, sizeof v);
    v.type = PMIX_BYTE_OBJECT;
    /* PMIx copies the bytes during the call; it never writes through the pointer. */
    v.data.bo.bytes = (char *)data;
    v.data.bo.size = len;
    pmix_status_t st = p->put(PMIX_GLOBAL, key, &v);
    if (st != PMIX_SUCCESS) {
        snprintf(err, err_len, "PMIx_Put(%s, %zu bytes): %s", key, len, status_text(p, st));
        return -1;
    }
    return 0;
}

/* Hands what was put so far to the local PMIx server. */
int hx_pmix_commit(hx_pmix *p, char *err, size_t err_len)
{
    pmix_status_t st = p->commit();
    if (st != PMIX_SUCCESS) {
        snprintf(err, err_len, "PMIx_Commit: %s", status_text(p, st));
        return -1;
    }
    return 0;
}

static void fence_done(pmix_status_t status, void *cbdata)
{
    hx_fence *f = cbdata;
    atomic_store(&f->status, status);
    atomic_store(&f->done, 1);
}

/* Starts a fence over the whole job; `collect`: every process gets every other's data
 * with it (else a later Get fetches it from the owner's server). One at a time. */
int hx_pmix_fence_start(hx_pmix *p, int collect, char *err, size_t err_len)
{
    if (p->fence != NULL) {
        snprintf(err, err_len, "a PMIx fence is already in progress");
        return -1;
    }
    hx_fence *f = calloc(1, sizeof *f);
    if (f == NULL) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    memset(&p->collect, 0, sizeof p->collect);
    snprintf(p->collect.key, sizeof p->collect.key, "%s", PMIX_COLLECT_DATA);
    p->collect.value.type = PMIX_BOOL;
    p->collect.value.data.flag = collect != 0;
    pmix_status_t st = p->fence_nb(&p->all, 1, &p->collect, 1, fence_done, f);
    if (st == PMIX_OPERATION_SUCCEEDED) {
        /* Done inside the call; the callback will not run. */
        fence_done(PMIX_SUCCESS, f);
    } else if (st != PMIX_SUCCESS) {
        snprintf(err, err_len, "PMIx_Fence_nb: %s", status_text(p, st));
        free(f);
        return -1;
    }
    p->fence = f;
    return 0;
}

/* 1 once the fence in progress finished well, 0 while it runs, -1 if it failed. */
int hx_pmix_fence_poll(hx_pmix *p, char *err, size_t err_len)
{
    hx_fence *f = p->fence;
    if (f == NULL) {
        snprintf(err, err_len, "no PMIx fence is in progress");
        return -1;
    }
    if (!atomic_load(&f->done)) {
        return 0;
    }
    pmix_status_t st = atomic_load(&f->status);
    p->fence = NULL;
    free(f);
    if (st != PMIX_SUCCESS) {
        snprintf(err, err_len, "PMIx fence: %s", status_text(p, st));
        return -1;
    }
    return 1;
}

/* Copies the bytes `rank` published under `key` into a fresh malloc'd buffer
 * (`*data`, `*len`; release with hx_pmix_free). `timeout_s` bounds a fetch from another
 * host's server. */
int hx_pmix_get(hx_pmix *p, uint32_t rank, const char *key, int timeout_s, void **data,
                size_t *len, char *err, size_t err_len)
{
    pmix_proc_t who = p->all;
    who.rank = rank;
    pmix_info_t t;
    memset(&t, 0, sizeof t);
    snprintf(t.key, sizeof t.key, "%s", PMIX_TIMEOUT);
    t.value.type = PMIX_INT;
    t.value.data.integer = timeout_s;
    pmix_value_t *v = NULL;
    pmix_status_t st = p->get(&who, key, &t, 1, &v);
    if (st != PMIX_SUCCESS || v == NULL) {
        snprintf(err, err_len, "PMIx_Get(rank %u, %s): %s", rank, key,
                 st != PMIX_SUCCESS ? status_text(p, st) : "no value");
        return -1;
    }
    if (v->type != PMIX_BYTE_OBJECT) {
        snprintf(err, err_len, "PMIx_Get(rank %u, %s): not bytes (type %d)", rank, key,
                 (int)v->type);
        free(v);
        return -1;
    }
    /* The value and its bytes were allocated by libpmix with the C library's malloc;
     * the bytes are handed to the caller as they are. */
    *data = v->data.bo.bytes;
    *len = v->data.bo.size;
    free(v);
    return 0;
}

void hx_pmix_free(void *data)
{
    free(data);
}

/* Leaves the job. A fence still in progress keeps its record (its callback may yet
 * run); the process is about to exit. */
void hx_pmix_finalize(hx_pmix *p)
{
    p->finalize(NULL, 0);
    /* The library stays loaded: its threads may still be winding down. */
    free(p);
}
