// Fake cuBLAS of the emulated-device build: build-emu/lib/libcublas.so.<CUBLAS_VER_MAJOR> (see
// tests/emu/emu_cublaslt.cc for how it is found). fsdp-run only sets a cuBLAS handle up (its GEMMs go
// through cuBLASLt): create, destroy, stream, workspace, math mode and status strings exist, and the
// handle remembers what was set.
#include <cublas_v2.h>

struct cublasContext {
    cudaStream_t stream;
    void *ws;
    size_t ws_bytes;
    cublasMath_t mode;
};

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    *h = new cublasContext{nullptr, nullptr, 0, CUBLAS_DEFAULT_MATH};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t bytes) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && !ws) return CUBLAS_STATUS_INVALID_VALUE;
    h->ws = ws;
    h->ws_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN (emulated cuBLAS)";
    }
}

} // extern "C"
