/* CUDA device runtime: device selection, streams and events, caching allocators, copies, timers.
 * Without CUDA every entry point that needs a GPU fails with "built without CUDA". */
#include "runtime/device_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dev_built_with_cuda(void) { return FSDP_HAVE_CUDA; }

int dev_err_no_cuda(fsdp_err *err, const char *what) {
    return fsdp_err_set(err, FSDP_E_DEVICE,
                        "%s: fsdp-run was built without CUDA (FSDP_HAVE_CUDA=0: nvcc was not found at build time "
                        "or `make CUDA=0` was used); rebuild with the CUDA toolkit to use a GPU",
                        what);
}

int dev_env_local_rank(int *local_rank, fsdp_err *err) {
    static const char *const vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                                       "MPI_LOCALRANKID", "PMI_LOCAL_RANK"};
    *local_rank = -1;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (!v || !*v) continue;
        char *end = NULL;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end != '\0' || x < 0 || x > INT_MAX)
            return fsdp_err_set(err, FSDP_E_INVALID, "environment variable %s=\"%s\" is not a non-negative integer",
                                vars[i], v);
        *local_rank = (int)x;
        return FSDP_OK;
    }
    return FSDP_OK;
}

#if FSDP_HAVE_CUDA

int dev_cuda_fail(fsdp_err *err, cudaError_t e, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    (void)cudaGetLastError(); /* clear a non-sticky error so that later calls are not blamed */
    return fsdp_err_set(err, FSDP_E_DEVICE, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define CU_TRY(call, ...)                                              \
    do {                                                               \
        cudaError_t cu_e_ = (call);                                    \
        if (cu_e_ != cudaSuccess) return dev_cuda_fail(err, cu_e_, __VA_ARGS__); \
    } while (0)

int dev_count(int *count, fsdp_err *err) {
    int n = 0;
    *count = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return dev_cuda_fail(err, e, "no usable CUDA device (cudaGetDeviceCount failed)");
    if (n <= 0)
        return fsdp_err_set(err, FSDP_E_DEVICE,
                            "no CUDA device is visible (cudaGetDeviceCount returned 0; check CUDA_VISIBLE_DEVICES)");
    *count = n;
    return FSDP_OK;
}

/* ---- allocator backends -------------------------------------------------------------------- */

static int device_alloc(void *user, size_t bytes, void **ptr, fsdp_err *err) {
    (void)user;
    cudaError_t e = cudaMalloc(ptr, bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return fsdp_err_set(err, FSDP_E_NOMEM, "cudaMalloc(%zu bytes): %s", bytes, cudaGetErrorString(e));
    }
    if (e != cudaSuccess) return dev_cuda_fail(err, e, "cudaMalloc(%zu bytes)", bytes);
    return FSDP_OK;
}

static void device_release(void *user, void *ptr) {
    (void)user;
    if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
}

static int host_alloc(void *user, size_t bytes, void **ptr, fsdp_err *err) {
    (void)user;
    cudaError_t e = cudaHostAlloc(ptr, bytes, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return fsdp_err_set(err, FSDP_E_NOMEM, "cudaHostAlloc(%zu bytes): %s", bytes, cudaGetErrorString(e));
    }
    if (e != cudaSuccess) return dev_cuda_fail(err, e, "cudaHostAlloc(%zu bytes)", bytes);
    return FSDP_OK;
}

static void host_release(void *user, void *ptr) {
    (void)user;
    if (cudaFreeHost(ptr) != cudaSuccess) (void)cudaGetLastError();
}

static int fence_ready(void *user, void *fence) {
    (void)user;
    cudaError_t e = cudaEventQuery((cudaEvent_t)fence);
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) return 0;
    (void)cudaGetLastError();
    return -1;
}

static void fence_release(void *user, void *fence) {
    dev_ctx *d = user;
    cudaEvent_t ev = (cudaEvent_t)fence;
    if (d->event_pool_len == d->event_pool_cap) {
        int cap = d->event_pool_cap ? 2 * d->event_pool_cap : 16;
        cudaEvent_t *p = realloc(d->event_pool, (size_t)cap * sizeof *p);
        if (!p) {
            cudaEventDestroy(ev);
            return;
        }
        d->event_pool = p;
        d->event_pool_cap = cap;
    }
    d->event_pool[d->event_pool_len++] = ev;
}

static int event_get(dev_ctx *d, cudaEvent_t *ev, fsdp_err *err) {
    if (d->event_pool_len > 0) {
        *ev = d->event_pool[--d->event_pool_len];
        return FSDP_OK;
    }
    CU_TRY(cudaEventCreateWithFlags(ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return FSDP_OK;
}

/* ---- context ------------------------------------------------------------------------------------ */

/* The GPU of this process: its local rank's (from the options, else the environment, else 0);
 * with one GPU visible every local rank shares it. Nonzero (err filled) when there is none. */
static int dev_pick_ordinal(const dev_options *o, int *ord, fsdp_err *err) {
    int count = 0;
    if (dev_count(&count, err)) return FSDP_E_DEVICE;
    int lr = o->local_rank;
    if (lr < 0) {
        if (dev_env_local_rank(&lr, err)) return FSDP_E_DEVICE;
        if (lr < 0) lr = 0;
    }
    *ord = lr;
    if (lr >= count) {
        if (count != 1)
            return fsdp_err_set(err, FSDP_E_DEVICE, "local rank %d needs GPU %d but only %d GPUs are visible", lr, lr,
                                count);
        *ord = 0;
    }
    return FSDP_OK;
}

/* Selects the device d->ordinal, reads its properties and creates the streams with their
 * ordering events. */
static int dev_open_device(dev_ctx *d, fsdp_err *err) {
    int ord = d->ordinal;
    struct cudaDeviceProp prop;
    cudaError_t e;
    if ((e = cudaSetDevice(ord)) != cudaSuccess) return dev_cuda_fail(err, e, "cudaSetDevice(%d)", ord);
    if ((e = cudaGetDeviceProperties(&prop, ord)) != cudaSuccess)
        return dev_cuda_fail(err, e, "cudaGetDeviceProperties(%d)", ord);
    snprintf(d->name, sizeof d->name, "%s", prop.name);
    d->sm_count = prop.multiProcessorCount;
    d->cc = prop.major * 10 + prop.minor;
    d->total_mem = prop.totalGlobalMem;
    for (int k = 0; k < DEV_STREAM_COUNT; k++) {
        if ((e = cudaStreamCreateWithFlags(&d->streams[k], cudaStreamNonBlocking)) != cudaSuccess)
            return dev_cuda_fail(err, e, "cudaStreamCreateWithFlags");
        if ((e = cudaEventCreateWithFlags(&d->order_events[k], cudaEventDisableTiming)) != cudaSuccess)
            return dev_cuda_fail(err, e, "cudaEventCreateWithFlags");
    }
    return FSDP_OK;
}

/* The error code of a creation that failed (err's, and never 0, so that the failure stands). */
static int dev_failed_code(const fsdp_err *err) {
    return err && err->code ? err->code : FSDP_E_NOMEM;
}

/* The caching allocators of device memory (fenced by events) and of pinned host memory. */
static int dev_open_caches(dev_ctx *d, fsdp_err *err) {
    dev_cache_backend mem_be = {.user = d, .what = "device", .alloc = device_alloc, .release = device_release,
                                .fence_ready = fence_ready, .fence_release = fence_release};
    dev_cache_backend host_be = {.user = d, .what = "pinned host", .alloc = host_alloc, .release = host_release};
    if (!(d->mem = dev_cache_create(&mem_be, err)) || !(d->host = dev_cache_create(&host_be, err)))
        return dev_failed_code(err);
    return FSDP_OK;
}

/* cuBLAS and cuBLASLt handles, the cuBLAS workspace (ws_bytes) on the compute stream, and the
 * GEMM plan cache. */
static int dev_open_blas(dev_ctx *d, size_t ws_bytes, fsdp_err *err) {
    int rc;
    if ((rc = dev_blas_load(&d->bl, err))) return rc;
    cublasStatus_t bs;
    if ((bs = d->bl.cublasCreate(&d->blas)) != CUBLAS_STATUS_SUCCESS) {
        d->blas = NULL;
        return fsdp_err_set(err, FSDP_E_DEVICE, "cublasCreate: %s", d->bl.cublasGetStatusString(bs));
    }
    if ((bs = d->bl.cublasLtCreate(&d->lt)) != CUBLAS_STATUS_SUCCESS) {
        d->lt = NULL;
        return fsdp_err_set(err, FSDP_E_DEVICE, "cublasLtCreate: %s", d->bl.cublasLtGetStatusString(bs));
    }
    cudaError_t e;
    if ((e = cudaMalloc(&d->blas_ws, ws_bytes)) != cudaSuccess) {
        d->blas_ws = NULL;
        return dev_cuda_fail(err, e, "cudaMalloc(%zu bytes) for the cuBLAS workspace", ws_bytes);
    }
    d->blas_ws_bytes = ws_bytes;
    if ((bs = d->bl.cublasSetStream(d->blas, d->streams[DEV_STREAM_COMPUTE])) != CUBLAS_STATUS_SUCCESS ||
        (bs = d->bl.cublasSetWorkspace(d->blas, d->blas_ws, d->blas_ws_bytes)) != CUBLAS_STATUS_SUCCESS ||
        (bs = d->bl.cublasSetMathMode(d->blas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS)
        return fsdp_err_set(err, FSDP_E_DEVICE, "cuBLAS handle setup: %s", d->bl.cublasGetStatusString(bs));
    if (!(d->gemm = dev_gemm_cache_create(&d->bl, err))) return dev_failed_code(err);
    return FSDP_OK;
}

dev_ctx *dev_ctx_create(const dev_options *opt, fsdp_err *err) {
    dev_options o = {.local_rank = -1, .blas_workspace_bytes = 0};
    if (opt) o = *opt;
    if (!o.blas_workspace_bytes) o.blas_workspace_bytes = (size_t)32 << 20;
    int ord = 0;
    if (dev_pick_ordinal(&o, &ord, err)) return NULL;
    dev_ctx *d = calloc(1, sizeof *d);
    if (!d) {
        fsdp_err_set(err, FSDP_E_NOMEM, "device context: out of host memory");
        return NULL;
    }
    d->ordinal = ord;
    int rc = dev_open_device(d, err);
    if (!rc) rc = dev_open_caches(d, err);
    if (!rc) rc = dev_open_blas(d, o.blas_workspace_bytes, err);
    if (!rc) return d;
    dev_ctx_free(d);
    return NULL;
}

void dev_ctx_free(dev_ctx *d) {
    if (!d) return;
    cudaSetDevice(d->ordinal);
    for (int k = 0; k < DEV_STREAM_COUNT; k++)
        if (d->streams[k]) cudaStreamSynchronize(d->streams[k]);
    dev_gemm_cache_free(d->gemm);
    if (d->lt) d->bl.cublasLtDestroy(d->lt);
    if (d->blas) d->bl.cublasDestroy(d->blas);
    dev_blas_unload(&d->bl);
    if (d->blas_ws) cudaFree(d->blas_ws);
    dev_cache_free(d->mem); /* releases pending fences into the pool first */
    dev_cache_free(d->host);
    for (int i = 0; i < d->event_pool_len; i++) cudaEventDestroy(d->event_pool[i]);
    free(d->event_pool);
    for (int k = 0; k < DEV_STREAM_COUNT; k++) {
        if (d->order_events[k]) cudaEventDestroy(d->order_events[k]);
        if (d->streams[k]) cudaStreamDestroy(d->streams[k]);
    }
    (void)cudaGetLastError();
    free(d);
}

int dev_ctx_bind(dev_ctx *d, fsdp_err *err) {
    CU_TRY(cudaSetDevice(d->ordinal), "cudaSetDevice(%d)", d->ordinal);
    return FSDP_OK;
}

int dev_ctx_ordinal(const dev_ctx *d) { return d ? d->ordinal : -1; }
const char *dev_ctx_name(const dev_ctx *d) { return d ? d->name : ""; }
int dev_ctx_sm_count(const dev_ctx *d) { return d ? d->sm_count : 0; }
int dev_ctx_cc(const dev_ctx *d) { return d ? d->cc : 0; }
size_t dev_ctx_total_mem(const dev_ctx *d) { return d ? d->total_mem : 0; }

dev_stream dev_ctx_stream(const dev_ctx *d, dev_stream_kind k) {
    return d && k >= 0 && k < DEV_STREAM_COUNT ? d->streams[k] : NULL;
}
void *dev_ctx_cublas(const dev_ctx *d) { return d ? (void *)d->blas : NULL; }
void *dev_ctx_cublaslt(const dev_ctx *d) { return d ? (void *)d->lt : NULL; }

static int check_kind(dev_stream_kind k, fsdp_err *err) {
    if (k < 0 || k >= DEV_STREAM_COUNT) return fsdp_err_set(err, FSDP_E_INVALID, "device: stream kind %d is not valid", (int)k);
    return FSDP_OK;
}

/* ---- ordering ---------------------------------------------------------------------------------- */

int dev_stream_wait(dev_ctx *d, dev_stream_kind waiter, dev_stream_kind producer, fsdp_err *err) {
    if (check_kind(waiter, err) || check_kind(producer, err)) return FSDP_E_INVALID;
    if (waiter == producer) return FSDP_OK;
    CU_TRY(cudaEventRecord(d->order_events[producer], d->streams[producer]), "cudaEventRecord");
    CU_TRY(cudaStreamWaitEvent(d->streams[waiter], d->order_events[producer], 0), "cudaStreamWaitEvent");
    return FSDP_OK;
}

int dev_stream_sync(dev_ctx *d, dev_stream_kind k, fsdp_err *err) {
    if (check_kind(k, err)) return FSDP_E_INVALID;
    CU_TRY(cudaStreamSynchronize(d->streams[k]), "cudaStreamSynchronize (stream %d)", (int)k);
    return FSDP_OK;
}

int dev_sync(dev_ctx *d, fsdp_err *err) {
    for (int k = 0; k < DEV_STREAM_COUNT; k++) {
        int rc = dev_stream_sync(d, (dev_stream_kind)k, err);
        if (rc) return rc;
    }
    return FSDP_OK;
}

/* ---- memory ------------------------------------------------------------------------------------ */

/* The cache reports an out-of-memory backend as FSDP_E_NOMEM; a CUDA allocation failure is a
 * device error to callers. */
static int as_device_error(int rc, fsdp_err *err) {
    if (rc == FSDP_E_NOMEM && err) err->code = FSDP_E_DEVICE;
    return rc == FSDP_E_NOMEM ? FSDP_E_DEVICE : rc;
}

int dev_alloc(dev_ctx *d, size_t bytes, void **ptr, fsdp_err *err) {
    return as_device_error(dev_cache_alloc(d->mem, bytes, ptr, err), err);
}

int dev_free(dev_ctx *d, void *ptr, fsdp_err *err) { return dev_cache_release(d->mem, ptr, NULL, err); }

int dev_free_after(dev_ctx *d, void *ptr, dev_stream_kind k, fsdp_err *err) {
    if (check_kind(k, err)) return FSDP_E_INVALID;
    if (!ptr) return FSDP_OK;
    if (k == DEV_STREAM_COMPUTE) return dev_free(d, ptr, err);
    cudaEvent_t ev;
    int rc = event_get(d, &ev, err);
    if (rc) return rc;
    cudaError_t e = cudaEventRecord(ev, d->streams[k]);
    if (e != cudaSuccess) {
        fence_release(d, ev);
        return dev_cuda_fail(err, e, "cudaEventRecord (dev_free_after)");
    }
    rc = dev_cache_release(d->mem, ptr, ev, err);
    if (rc) fence_release(d, ev);
    return rc;
}

int dev_host_alloc(dev_ctx *d, size_t bytes, void **ptr, fsdp_err *err) {
    return as_device_error(dev_cache_alloc(d->host, bytes, ptr, err), err);
}

int dev_host_free(dev_ctx *d, void *ptr, fsdp_err *err) { return dev_cache_release(d->host, ptr, NULL, err); }

int dev_empty_cache(dev_ctx *d, fsdp_err *err) {
    int rc = dev_sync(d, err);
    if (rc) return rc;
    dev_cache_poll(d->mem, 1);
    dev_cache_trim(d->mem);
    dev_cache_trim(d->host);
    return FSDP_OK;
}

void dev_mem_stats_get(const dev_ctx *d, dev_mem_stats *device, dev_mem_stats *pinned) {
    if (device) dev_cache_stats(d ? d->mem : NULL, device);
    if (pinned) dev_cache_stats(d ? d->host : NULL, pinned);
}

void dev_mem_reset_peak(dev_ctx *d) {
    if (!d) return;
    dev_cache_reset_peak(d->mem);
    dev_cache_reset_peak(d->host);
}

/* ---- copies ------------------------------------------------------------------------------------ */

static int copy(dev_ctx *d, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, dev_stream_kind k,
                const char *what, fsdp_err *err) {
    if (check_kind(k, err)) return FSDP_E_INVALID;
    if (!bytes) return FSDP_OK;
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, kind, d->streams[k]), "cudaMemcpyAsync %s (%zu bytes)", what, bytes);
    return FSDP_OK;
}

int dev_copy_h2d(dev_ctx *d, void *dst, const void *src, size_t bytes, dev_stream_kind k, fsdp_err *err) {
    return copy(d, dst, src, bytes, cudaMemcpyHostToDevice, k, "host to device", err);
}
int dev_copy_d2h(dev_ctx *d, void *dst, const void *src, size_t bytes, dev_stream_kind k, fsdp_err *err) {
    return copy(d, dst, src, bytes, cudaMemcpyDeviceToHost, k, "device to host", err);
}
int dev_copy_d2d(dev_ctx *d, void *dst, const void *src, size_t bytes, dev_stream_kind k, fsdp_err *err) {
    return copy(d, dst, src, bytes, cudaMemcpyDeviceToDevice, k, "device to device", err);
}

int dev_memset0(dev_ctx *d, void *dst, size_t bytes, dev_stream_kind k, fsdp_err *err) {
    if (check_kind(k, err)) return FSDP_E_INVALID;
    if (!bytes) return FSDP_OK;
    CU_TRY(cudaMemsetAsync(dst, 0, bytes, d->streams[k]), "cudaMemsetAsync (%zu bytes)", bytes);
    return FSDP_OK;
}

int dev_upload(dev_ctx *d, void *dst, const void *src, size_t bytes, fsdp_err *err) {
    int rc = dev_copy_h2d(d, dst, src, bytes, DEV_STREAM_COMPUTE, err);
    return rc ? rc : dev_stream_sync(d, DEV_STREAM_COMPUTE, err);
}

int dev_download(dev_ctx *d, void *dst, const void *src, size_t bytes, fsdp_err *err) {
    int rc = dev_copy_d2h(d, dst, src, bytes, DEV_STREAM_COMPUTE, err);
    return rc ? rc : dev_stream_sync(d, DEV_STREAM_COMPUTE, err);
}

/* ---- timing ------------------------------------------------------------------------------------- */

int dev_timer_start(dev_ctx *d, dev_timer *t, dev_stream_kind k, fsdp_err *err) {
    memset(t, 0, sizeof *t);
    if (check_kind(k, err)) return FSDP_E_INVALID;
    cudaEvent_t a = NULL, b = NULL;
    cudaError_t e = cudaEventCreate(&a);
    if (e == cudaSuccess) e = cudaEventCreate(&b);
    if (e == cudaSuccess) e = cudaEventRecord(a, d->streams[k]);
    if (e != cudaSuccess) {
        if (a) cudaEventDestroy(a);
        if (b) cudaEventDestroy(b);
        return dev_cuda_fail(err, e, "dev_timer_start (cudaEventCreate/cudaEventRecord)");
    }
    t->start = a;
    t->stop = b;
    t->stream = d->streams[k];
    return FSDP_OK;
}

int dev_timer_stop(dev_timer *t, float *ms, fsdp_err *err) {
    *ms = 0.0f;
    if (!t->start || !t->stop) return fsdp_err_set(err, FSDP_E_INVALID, "dev_timer_stop: the timer was not started");
    cudaError_t e = cudaEventRecord(t->stop, t->stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(t->stop);
    if (e == cudaSuccess) e = cudaEventElapsedTime(ms, t->start, t->stop);
    cudaEventDestroy(t->start);
    cudaEventDestroy(t->stop);
    t->start = t->stop = NULL;
    if (e != cudaSuccess) return dev_cuda_fail(err, e, "dev_timer_stop (cudaEventRecord/Synchronize/ElapsedTime)");
    return FSDP_OK;
}

#else /* !FSDP_HAVE_CUDA */

int dev_count(int *count, fsdp_err *err) {
    *count = 0;
    return dev_err_no_cuda(err, "dev_count");
}

dev_ctx *dev_ctx_create(const dev_options *opt, fsdp_err *err) {
    (void)opt;
    dev_err_no_cuda(err, "dev_ctx_create");
    return NULL;
}

void dev_ctx_free(dev_ctx *d) { (void)d; }
int dev_ctx_bind(dev_ctx *d, fsdp_err *err) {
    (void)d;
    return dev_err_no_cuda(err, "dev_ctx_bind");
}
int dev_ctx_ordinal(const dev_ctx *d) {
    (void)d;
    return -1;
}
const char *dev_ctx_name(const dev_ctx *d) {
    (void)d;
    return "";
}
int dev_ctx_sm_count(const dev_ctx *d) {
    (void)d;
    return 0;
}
int dev_ctx_cc(const dev_ctx *d) {
    (void)d;
    return 0;
}
size_t dev_ctx_total_mem(const dev_ctx *d) {
    (void)d;
    return 0;
}
dev_stream dev_ctx_stream(const dev_ctx *d, dev_stream_kind k) {
    (void)d;
    (void)k;
    return NULL;
}
void *dev_ctx_cublas(const dev_ctx *d) {
    (void)d;
    return NULL;
}
void *dev_ctx_cublaslt(const dev_ctx *d) {
    (void)d;
    return NULL;
}

#define DEV_NO_CUDA_2(name, T1, T2)                                                       \
    int name(dev_ctx *d, T1 a, T2 b, fsdp_err *err) {                                     \
        (void)d;                                                                          \
        (void)a;                                                                          \
        (void)b;                                                                          \
        return dev_err_no_cuda(err, #name);                                               \
    }

DEV_NO_CUDA_2(dev_stream_wait, dev_stream_kind, dev_stream_kind)
DEV_NO_CUDA_2(dev_alloc, size_t, void **)
DEV_NO_CUDA_2(dev_free_after, void *, dev_stream_kind)
DEV_NO_CUDA_2(dev_host_alloc, size_t, void **)

int dev_stream_sync(dev_ctx *d, dev_stream_kind k, fsdp_err *err) {
    (void)d;
    (void)k;
    return dev_err_no_cuda(err, "dev_stream_sync");
}
int dev_sync(dev_ctx *d, fsdp_err *err) {
    (void)d;
    return dev_err_no_cuda(err, "dev_sync");
}
int dev_free(dev_ctx *d, void *ptr, fsdp_err *err) {
    (void)d;
    (void)ptr;
    return dev_err_no_cuda(err, "dev_free");
}
int dev_host_free(dev_ctx *d, void *ptr, fsdp_err *err) {
    (void)d;
    (void)ptr;
    return dev_err_no_cuda(err, "dev_host_free");
}
int dev_empty_cache(dev_ctx *d, fsdp_err *err) {
    (void)d;
    return dev_err_no_cuda(err, "dev_empty_cache");
}
void dev_mem_stats_get(const dev_ctx *d, dev_mem_stats *device, dev_mem_stats *pinned) {
    (void)d;
    if (device) dev_cache_stats(NULL, device);
    if (pinned) dev_cache_stats(NULL, pinned);
}
void dev_mem_reset_peak(dev_ctx *d) { (void)d; }

#define DEV_NO_CUDA_COPY(name)                                                                       \
    int name(dev_ctx *d, void *dst, const void *src, size_t bytes, dev_stream_kind k, fsdp_err *err) { \
        (void)d;                                                                                     \
        (void)dst;                                                                                   \
        (void)src;                                                                                   \
        (void)bytes;                                                                                 \
        (void)k;                                                                                     \
        return dev_err_no_cuda(err, #name);                                                          \
    }
DEV_NO_CUDA_COPY(dev_copy_h2d)
DEV_NO_CUDA_COPY(dev_copy_d2h)
DEV_NO_CUDA_COPY(dev_copy_d2d)

int dev_memset0(dev_ctx *d, void *dst, size_t bytes, dev_stream_kind k, fsdp_err *err) {
    (void)d;
    (void)dst;
    (void)bytes;
    (void)k;
    return dev_err_no_cuda(err, "dev_memset0");
}
int dev_upload(dev_ctx *d, void *dst, const void *src, size_t bytes, fsdp_err *err) {
    (void)d;
    (void)dst;
    (void)src;
    (void)bytes;
    return dev_err_no_cuda(err, "dev_upload");
}
int dev_download(dev_ctx *d, void *dst, const void *src, size_t bytes, fsdp_err *err) {
    (void)d;
    (void)dst;
    (void)src;
    (void)bytes;
    return dev_err_no_cuda(err, "dev_download");
}
int dev_timer_start(dev_ctx *d, dev_timer *t, dev_stream_kind k, fsdp_err *err) {
    (void)d;
    (void)k;
    memset(t, 0, sizeof *t);
    return dev_err_no_cuda(err, "dev_timer_start");
}
int dev_timer_stop(dev_timer *t, float *ms, fsdp_err *err) {
    (void)t;
    *ms = 0.0f;
    return dev_err_no_cuda(err, "dev_timer_stop");
}

#endif
