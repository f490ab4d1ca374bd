/* Staged host <-> device copies with two pinned buffers on the COPY stream (device_xfer.h). */
#include "runtime/device_xfer.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/device_internal.h"

#if FSDP_HAVE_CUDA

struct dev_xfer {
    dev_ctx *d;
    size_t chunk;
    void *buf[2];
    cudaEvent_t ev[2];
    int busy[2]; /* a copy from/to buf[i] is queued and not waited for yet */
    int cur;     /* the buffer dev_xfer_next handed out (-1: none) */
    int next;    /* the buffer dev_xfer_next hands out next */
};

int dev_xfer_create(dev_ctx *d, size_t chunk_bytes, dev_xfer **out, fsdp_err *err) {
    *out = NULL;
    if (!d) return fsdp_err_set(err, FSDP_E_INVALID, "dev_xfer_create: no device context");
    dev_xfer *x = calloc(1, sizeof *x);
    if (!x) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    x->d = d;
    x->chunk = chunk_bytes ? chunk_bytes : DEV_XFER_CHUNK_DEFAULT;
    x->cur = -1;
    int rc = FSDP_OK;
    for (int i = 0; i < 2 && !rc; i++) {
        cudaError_t e = cudaEventCreateWithFlags(&x->ev[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            x->ev[i] = NULL;
            rc = dev_cuda_fail(err, e, "cudaEventCreateWithFlags (staging)");
            break;
        }
        rc = dev_host_alloc(d, x->chunk, &x->buf[i], err);
        if (rc) x->buf[i] = NULL;
    }
    if (rc) {
        dev_xfer_free(x);
        return rc;
    }
    *out = x;
    return FSDP_OK;
}

size_t dev_xfer_chunk(const dev_xfer *x) { return x ? x->chunk : 0; }

static int wait_slot(dev_xfer *x, int i, fsdp_err *err) {
    if (!x->busy[i]) return FSDP_OK;
    x->busy[i] = 0;
    cudaError_t e = cudaEventSynchronize(x->ev[i]);
    if (e != cudaSuccess) return dev_cuda_fail(err, e, "cudaEventSynchronize (staged copy)");
    return FSDP_OK;
}

/* Queues a copy on the COPY stream after the work queued so far on COMPUTE; records slot i's event. */
static int queue_copy(dev_xfer *x, int i, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                      fsdp_err *err) {
    int rc = dev_stream_wait(x->d, DEV_STREAM_COPY, DEV_STREAM_COMPUTE, err);
    if (rc) return rc;
    cudaStream_t st = dev_ctx_stream(x->d, DEV_STREAM_COPY);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, st);
    if (e != cudaSuccess)
        return dev_cuda_fail(err, e, "cudaMemcpyAsync %s (%zu bytes, staged)",
                             kind == cudaMemcpyHostToDevice ? "host to device" : "device to host", bytes);
    e = cudaEventRecord(x->ev[i], st);
    if (e != cudaSuccess) {
        /* the copy is queued but cannot be waited for by its event: wait for the stream */
        cudaStreamSynchronize(st);
        return dev_cuda_fail(err, e, "cudaEventRecord (staged copy)");
    }
    x->busy[i] = 1;
    return FSDP_OK;
}

int dev_xfer_next(dev_xfer *x, void **buf, fsdp_err *err) {
    *buf = NULL;
    int i = x->next;
    int rc = wait_slot(x, i, err);
    if (rc) return rc;
    x->cur = i;
    x->next = 1 - i;
    *buf = x->buf[i];
    return FSDP_OK;
}

int dev_xfer_push(dev_xfer *x, void *d_dst, size_t bytes, fsdp_err *err) {
    int i = x->cur;
    if (i < 0) return fsdp_err_set(err, FSDP_E_INVALID, "dev_xfer_push without dev_xfer_next");
    if (bytes > x->chunk)
        return fsdp_err_set(err, FSDP_E_INVALID, "dev_xfer_push: %zu bytes exceed the %zu-byte staging buffer", bytes,
                            x->chunk);
    x->cur = -1;
    if (!bytes) return FSDP_OK;
    return queue_copy(x, i, d_dst, x->buf[i], bytes, cudaMemcpyHostToDevice, err);
}

int dev_xfer_h2d(dev_xfer *x, void *d_dst, const void *h_src, size_t bytes, fsdp_err *err) {
    for (size_t off = 0; off < bytes; off += x->chunk) {
        size_t n = bytes - off < x->chunk ? bytes - off : x->chunk;
        void *buf;
        int rc = dev_xfer_next(x, &buf, err);
        if (rc) return rc;
        memcpy(buf, (const char *)h_src + off, n);
        if ((rc = dev_xfer_push(x, (char *)d_dst + off, n, err))) return rc;
    }
    return FSDP_OK;
}

int dev_xfer_d2h(dev_xfer *x, void *h_dst, const void *d_src, size_t bytes, fsdp_err *err) {
    if (!bytes) return FSDP_OK;
    /* both buffers free first (earlier uploads may still read them) */
    int rc = wait_slot(x, 0, err);
    if (!rc) rc = wait_slot(x, 1, err);
    if (rc) return rc;
    x->cur = -1;
    size_t nchunks = (bytes + x->chunk - 1) / x->chunk;
    /* chunk k goes through buffer k % 2: chunk k+1 is in flight while chunk k is copied out */
    rc = queue_copy(x, 0, x->buf[0], d_src, bytes < x->chunk ? bytes : x->chunk, cudaMemcpyDeviceToHost, err);
    for (size_t k = 0; k < nchunks && !rc; k++) {
        if (k + 1 < nchunks) {
            size_t off = (k + 1) * x->chunk;
            size_t n = bytes - off < x->chunk ? bytes - off : x->chunk;
            int s = (int)((k + 1) % 2);
            if ((rc = queue_copy(x, s, x->buf[s], (const char *)d_src + off, n, cudaMemcpyDeviceToHost, err))) break;
        }
        int s = (int)(k % 2);
        if ((rc = wait_slot(x, s, err))) break;
        size_t off = k * x->chunk;
        size_t n = bytes - off < x->chunk ? bytes - off : x->chunk;
        memcpy((char *)h_dst + off, x->buf[s], n);
    }
    if (rc) {
        fsdp_err e2;
        wait_slot(x, 0, &e2);
        wait_slot(x, 1, &e2);
    }
    x->next = 0;
    return rc;
}

int dev_xfer_finish(dev_xfer *x, fsdp_err *err) {
    int rc0 = wait_slot(x, 0, err);
    fsdp_err e2;
    int rc1 = wait_slot(x, 1, rc0 ? &e2 : err);
    return rc0 ? rc0 : rc1;
}

void dev_xfer_free(dev_xfer *x) {
    if (!x) return;
    fsdp_err e;
    for (int i = 0; i < 2; i++) {
        if (x->ev[i]) {
            wait_slot(x, i, &e);
            cudaEventDestroy(x->ev[i]);
        }
        if (x->buf[i]) dev_host_free(x->d, x->buf[i], &e);
    }
    free(x);
}

#else /* !FSDP_HAVE_CUDA */

struct dev_xfer {
    int unused;
};

int dev_xfer_create(dev_ctx *d, size_t chunk_bytes, dev_xfer **out, fsdp_err *err) {
    (void)d, (void)chunk_bytes;
    *out = NULL;
    return dev_err_no_cuda(err, "dev_xfer_create");
}
size_t dev_xfer_chunk(const dev_xfer *x) {
    (void)x;
    return 0;
}
int dev_xfer_h2d(dev_xfer *x, void *d_dst, const void *h_src, size_t bytes, fsdp_err *err) {
    (void)x, (void)d_dst, (void)h_src, (void)bytes;
    return dev_err_no_cuda(err, "dev_xfer_h2d");
}
int dev_xfer_d2h(dev_xfer *x, void *h_dst, const void *d_src, size_t bytes, fsdp_err *err) {
    (void)x, (void)h_dst, (void)d_src, (void)bytes;
    return dev_err_no_cuda(err, "dev_xfer_d2h");
}
int dev_xfer_next(dev_xfer *x, void **buf, fsdp_err *err) {
    (void)x;
    *buf = NULL;
    return dev_err_no_cuda(err, "dev_xfer_next");
}
int dev_xfer_push(dev_xfer *x, void *d_dst, size_t bytes, fsdp_err *err) {
    (void)x, (void)d_dst, (void)bytes;
    return dev_err_no_cuda(err, "dev_xfer_push");
}
int dev_xfer_finish(dev_xfer *x, fsdp_err *err) {
    (void)x;
    return dev_err_no_cuda(err, "dev_xfer_finish");
}
void dev_xfer_free(dev_xfer *x) { (void)x; }

#endif
