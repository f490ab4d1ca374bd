/* CUDA device runtime: one dev_ctx per rank holds the selected GPU, one stream per purpose with
 * events to order them, a caching device allocator, a cache of pinned host buffers and the
 * cuBLAS / cuBLASLt handles with their workspace. GEMMs are in runtime/device_gemm.h, kernels in
 * kernels/cuda/kcu.h.
 *
 * Every CUDA failure becomes FSDP_E_DEVICE with a message naming the call and cudaGetErrorString.
 * In a build without CUDA (FSDP_HAVE_CUDA == 0) every function that needs a GPU fails with
 * FSDP_E_DEVICE "built without CUDA"; dev_ctx_create returns NULL.
 *
 * Threads: a dev_ctx is used by one thread at a time; a thread other than the creating one calls
 * dev_ctx_bind first (cudaSetDevice). Kernels and GEMMs run on the current device.
 *
 * Memory is stream-ordered on the compute stream: dev_free makes a block reusable by the next
 * dev_alloc, which is safe for work queued on the compute stream. A block last used on another
 * stream is freed with dev_free_after (an event on that stream must complete before reuse), and a
 * fresh block used first on another stream needs dev_stream_wait(.., that stream, COMPUTE, ..). */
#ifndef FSDP_RUNTIME_DEVICE_H
#define FSDP_RUNTIME_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "runtime/device_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The same types as cudaStream_t and cudaEvent_t, without the CUDA headers. */
typedef struct CUstream_st *dev_stream;
typedef struct CUevent_st *dev_event;

typedef enum dev_stream_kind {
    DEV_STREAM_COMPUTE = 0, /* kernels and GEMMs */
    DEV_STREAM_COMM = 1,    /* collectives (NCCL) */
    DEV_STREAM_COPY = 2,    /* host <-> device copies (offload, checkpoint I/O) */
    DEV_STREAM_COUNT = 3
} dev_stream_kind;

typedef struct dev_ctx dev_ctx;

typedef struct dev_options {
    int local_rank;              /* GPU to use; < 0: from the environment (see dev_env_local_rank), 0 if unset */
    size_t blas_workspace_bytes; /* cuBLAS(Lt) workspace; 0: 32 MiB */
} dev_options;

/* 1 when compiled with CUDA (FSDP_HAVE_CUDA), else 0. */
int dev_built_with_cuda(void);
/* Number of visible GPUs. FSDP_E_DEVICE (with the CUDA error) when there is no usable device or
 * driver, or when built without CUDA. */
int dev_count(int *count, fsdp_err *err);
/* The node-local rank from LOCAL_RANK, else OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID,
 * MPI_LOCALRANKID or PMI_LOCAL_RANK; -1 when none is set. FSDP_E_INVALID when the first one set is
 * not a non-negative integer (the message names the variable). */
int dev_env_local_rank(int *local_rank, fsdp_err *err);

/* Selects GPU local_rank (when local_rank >= the number of visible GPUs: GPU 0 if only one is
 * visible, e.g. CUDA_VISIBLE_DEVICES set per rank, otherwise an error), creates the streams,
 * events, allocators and BLAS handles. NULL opt: defaults. */
dev_ctx *dev_ctx_create(const dev_options *opt, fsdp_err *err);
/* Synchronises, gives all memory back (blocks still allocated too) and destroys everything. */
void dev_ctx_free(dev_ctx *d);
/* cudaSetDevice for the calling thread. */
int dev_ctx_bind(dev_ctx *d, fsdp_err *err);

int dev_ctx_ordinal(const dev_ctx *d);
const char *dev_ctx_name(const dev_ctx *d);   /* "NVIDIA H100 80GB HBM3" */
int dev_ctx_sm_count(const dev_ctx *d);
int dev_ctx_cc(const dev_ctx *d);             /* compute capability, 90 for sm_90 */
size_t dev_ctx_total_mem(const dev_ctx *d);   /* bytes of device memory */
dev_stream dev_ctx_stream(const dev_ctx *d, dev_stream_kind k);
/* cublasHandle_t and cublasLtHandle_t (bound to the compute stream). */
void *dev_ctx_cublas(const dev_ctx *d);
void *dev_ctx_cublaslt(const dev_ctx *d);

/* ---- ordering ---------------------------------------------------------------------------------- */

/* Work queued on `waiter` after this call starts only after the work queued so far on `producer`. */
int dev_stream_wait(dev_ctx *d, dev_stream_kind waiter, dev_stream_kind producer, fsdp_err *err);
/* Blocks the host until the stream (or every stream) is idle. */
int dev_stream_sync(dev_ctx *d, dev_stream_kind k, fsdp_err *err);
int dev_sync(dev_ctx *d, fsdp_err *err);

/* ---- memory ------------------------------------------------------------------------------------- */

/* Device memory from the cache (cudaMalloc only when no cached block of the size class is free). */
int dev_alloc(dev_ctx *d, size_t bytes, void **ptr, fsdp_err *err);
/* Back to the cache, reusable at once (stream-ordered on the compute stream). NULL is a no-op. */
int dev_free(dev_ctx *d, void *ptr, fsdp_err *err);
/* Back to the cache once the work queued so far on stream k has completed. */
int dev_free_after(dev_ctx *d, void *ptr, dev_stream_kind k, fsdp_err *err);
/* Pinned (page-locked) host memory from its own cache, for asynchronous copies. */
int dev_host_alloc(dev_ctx *d, size_t bytes, void **ptr, fsdp_err *err);
int dev_host_free(dev_ctx *d, void *ptr, fsdp_err *err);
/* Gives every cached free block (device and pinned) back to CUDA (synchronises first). */
int dev_empty_cache(dev_ctx *d, fsdp_err *err);
void dev_mem_stats_get(const dev_ctx *d, dev_mem_stats *device, dev_mem_stats *pinned);
void dev_mem_reset_peak(dev_ctx *d);

/* ---- copies (asynchronous on stream k; pageable host memory makes them synchronous) ------------ */

int dev_copy_h2d(dev_ctx *d, void *dst, const void *src, size_t bytes, dev_stream_kind k, fsdp_err *err);
int dev_copy_d2h(dev_ctx *d, void *dst, const void *src, size_t bytes, dev_stream_kind k, fsdp_err *err);
int dev_copy_d2d(dev_ctx *d, void *dst, const void *src, size_t bytes, dev_stream_kind k, fsdp_err *err);
int dev_memset0(dev_ctx *d, void *dst, size_t bytes, dev_stream_kind k, fsdp_err *err);
/* Synchronous helpers on the compute stream: copy and wait. */
int dev_upload(dev_ctx *d, void *dst, const void *src, size_t bytes, fsdp_err *err);
int dev_download(dev_ctx *d, void *dst, const void *src, size_t bytes, fsdp_err *err);

/* ---- timing ------------------------------------------------------------------------------------- */

/* An event pair measuring GPU time on one stream. */
typedef struct dev_timer {
    dev_event start, stop;
    dev_stream stream;
} dev_timer;
int dev_timer_start(dev_ctx *d, dev_timer *t, dev_stream_kind k, fsdp_err *err);
/* Records the stop event, waits for it and returns the milliseconds since the start event;
 * destroys both events. */
int dev_timer_stop(dev_timer *t, float *ms, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
