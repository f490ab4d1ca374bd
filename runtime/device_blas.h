/* cuBLAS and cuBLASLt, loaded with dlopen when a device context is created (private to
 * runtime/device*.c). Linking them would map and relocate ~210 MB of libcublasLt into every
 * fsdp-run process, CPU-only runs and every MPI rank included; loaded on demand they cost
 * nothing until a GPU is used. The table lives in the dev_ctx (no global state); its members
 * carry the libraries' own names and prototypes (__typeof__ of the header declarations). */
#ifndef FSDP_RUNTIME_DEVICE_BLAS_H
#define FSDP_RUNTIME_DEVICE_BLAS_H

#if FSDP_HAVE_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>

#include "fsdp/error.h"

/* cublas_v2.h maps some names to their _v2 symbols (cublasCreate -> cublasCreate_v2); the
 * members and the looked-up symbols follow the mapping. */
#define DEV_BLAS_FNS(X) \
    X(cublasCreate) X(cublasDestroy) X(cublasGetStatusString) X(cublasSetMathMode) X(cublasSetStream) \
    X(cublasSetWorkspace)
#define DEV_BLASLT_FNS(X)                                                                                     \
    X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetStatusString) X(cublasLtMatmul)                         \
    X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy)                 \
    X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)     \
    X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)
#define DEV_BLAS_MEMBER(f) __typeof__(&f) f;

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dev_blas_api {
    void *lib_blas, *lib_lt; /* dlopen handles */
    DEV_BLAS_FNS(DEV_BLAS_MEMBER)
    DEV_BLASLT_FNS(DEV_BLAS_MEMBER)
} dev_blas_api;

/* dlopen libcublasLt.so.<major> and libcublas.so.<major> (the major version of the headers
 * compiled against) and resolve every function; FSDP_E_DEVICE naming the library or symbol and
 * dlerror()'s text on failure (nothing stays loaded then). */
int dev_blas_load(dev_blas_api *api, fsdp_err *err);
void dev_blas_unload(dev_blas_api *api);

#ifdef __cplusplus
}
#endif
#endif

#endif
