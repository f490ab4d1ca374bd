/* Private to runtime/device*.c: the dev_ctx layout and the CUDA error helper. */
#ifndef FSDP_RUNTIME_DEVICE_INTERNAL_H
#define FSDP_RUNTIME_DEVICE_INTERNAL_H

#include "runtime/device.h"

/* FSDP_E_DEVICE "<what>: fsdp-run was built without CUDA ..." (used by every entry point of a
 * build without CUDA). */
int dev_err_no_cuda(fsdp_err *err, const char *what);

#if FSDP_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/device_blas.h"

typedef struct dev_gemm_cache dev_gemm_cache;

struct dev_ctx {
    int ordinal;
    char name[256];
    int sm_count, cc;
    size_t total_mem;
    cudaStream_t streams[DEV_STREAM_COUNT];
    cudaEvent_t order_events[DEV_STREAM_COUNT]; /* recorded on the producer by dev_stream_wait */
    dev_cache *mem, *host;
    cudaEvent_t *event_pool; /* fences of dev_free_after, reused */
    int event_pool_len, event_pool_cap;
    dev_blas_api bl; /* cuBLAS / cuBLASLt entry points (dlopen) */
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *blas_ws;
    size_t blas_ws_bytes;
    dev_gemm_cache *gemm;
};

/* FSDP_E_DEVICE "<formatted what>: <cudaGetErrorName>: <cudaGetErrorString>"; clears the
 * runtime's last (non-sticky) error. */
int dev_cuda_fail(fsdp_err *err, cudaError_t e, const char *fmt, ...) FSDP_PRINTF(3, 4);

dev_gemm_cache *dev_gemm_cache_create(const dev_blas_api *bl, fsdp_err *err);
void dev_gemm_cache_free(dev_gemm_cache *g);
#endif

#endif
