/* CUDA events between the device context's streams (train/train_fsdp_cuda_event.h). */
#include "train/train_fsdp_cuda_event.h"

#if FSDP_HAVE_CUDA
#include <cuda_runtime.h>

static int cuda_fail(fsdp_err *err, cudaError_t e, const char *what) {
    return fsdp_err_set(err, FSDP_E_DEVICE, "%s failed: %s", what, cudaGetErrorString(e));
}

int train_fsdp_cuda_event_create(dev_event *e, fsdp_err *err) {
    cudaEvent_t ev = NULL;
    cudaError_t r = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (r != cudaSuccess) return cuda_fail(err, r, "cudaEventCreateWithFlags");
    *e = ev;
    return FSDP_OK;
}

void train_fsdp_cuda_event_destroy(dev_event e) {
    if (e) cudaEventDestroy(e);
}

int train_fsdp_cuda_event_record(dev_ctx *d, dev_event e, dev_stream_kind k, fsdp_err *err) {
    cudaError_t r = cudaEventRecord(e, dev_ctx_stream(d, k));
    return r == cudaSuccess ? FSDP_OK : cuda_fail(err, r, "cudaEventRecord");
}

int train_fsdp_cuda_event_wait(dev_ctx *d, dev_stream_kind k, dev_event e, fsdp_err *err) {
    cudaError_t r = cudaStreamWaitEvent(dev_ctx_stream(d, k), e, 0);
    return r == cudaSuccess ? FSDP_OK : cuda_fail(err, r, "cudaStreamWaitEvent");
}

int train_fsdp_cuda_event_sync(dev_event e, fsdp_err *err) {
    cudaError_t r = cudaEventSynchronize(e);
    return r == cudaSuccess ? FSDP_OK : cuda_fail(err, r, "cudaEventSynchronize");
}

#else

static int no_cuda(fsdp_err *err, const char *what) {
    return fsdp_err_set(err, FSDP_E_DEVICE, "%s: built without CUDA", what);
}

int train_fsdp_cuda_event_create(dev_event *e, fsdp_err *err) {
    *e = NULL;
    return no_cuda(err, "cudaEventCreate");
}

void train_fsdp_cuda_event_destroy(dev_event e) { (void)e; }

int train_fsdp_cuda_event_record(dev_ctx *d, dev_event e, dev_stream_kind k, fsdp_err *err) {
    (void)d, (void)e, (void)k;
    return no_cuda(err, "cudaEventRecord");
}

int train_fsdp_cuda_event_wait(dev_ctx *d, dev_stream_kind k, dev_event e, fsdp_err *err) {
    (void)d, (void)e, (void)k;
    return no_cuda(err, "cudaStreamWaitEvent");
}

int train_fsdp_cuda_event_sync(dev_event e, fsdp_err *err) {
    (void)e;
    return no_cuda(err, "cudaEventSynchronize");
}

#endif
