/* Pinned staging ring on the COPY stream (device_ring.h). */
#include "runtime/device_ring.h"

#include <stdlib.h>

#include "runtime/device_internal.h"

#if FSDP_HAVE_CUDA

struct dev_ring {
    dev_ctx *d;
    int n;
    size_t bytes;
    void **buf;
    cudaEvent_t *ev;
    int *busy; /* a copy from/to buf[i] is queued and not waited for */
};

void dev_ring_free(dev_ring *r) {
    if (!r) return;
    fsdp_err e;
    for (int i = 0; i < r->n; i++) {
        if (r->ev && r->ev[i]) {
            if (r->busy[i]) cudaEventSynchronize(r->ev[i]);
            cudaEventDestroy(r->ev[i]);
        }
        if (r->buf && r->buf[i]) dev_host_free(r->d, r->buf[i], &e);
    }
    free(r->buf);
    free(r->ev);
    free(r->busy);
    free(r);
}

int dev_ring_create(dev_ctx *d, int n, size_t bytes, dev_ring **out, fsdp_err *err) {
    *out = NULL;
    if (!d) return fsdp_err_set(err, FSDP_E_INVALID, "dev_ring_create: no device context");
    if (n < 2 || !bytes) return fsdp_err_set(err, FSDP_E_INVALID, "dev_ring_create: %d buffers of %zu bytes", n, bytes);
    dev_ring *r = calloc(1, sizeof *r);
    if (!r) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    r->d = d;
    r->n = n;
    r->bytes = bytes;
    r->buf = calloc((size_t)n, sizeof *r->buf);
    r->ev = calloc((size_t)n, sizeof *r->ev);
    r->busy = calloc((size_t)n, sizeof *r->busy);
    int rc = r->buf && r->ev && r->busy ? FSDP_OK : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        cudaError_t e = cudaEventCreateWithFlags(&r->ev[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            r->ev[i] = NULL;
            rc = dev_cuda_fail(err, e, "cudaEventCreateWithFlags (staging ring)");
            break;
        }
        if ((rc = dev_host_alloc(d, bytes, &r->buf[i], err))) r->buf[i] = NULL;
    }
    if (rc) {
        dev_ring_free(r);
        return rc;
    }
    *out = r;
    return FSDP_OK;
}

static int check_slot(const dev_ring *r, int slot, size_t bytes, fsdp_err *err) {
    if (slot < 0 || slot >= r->n) return fsdp_err_set(err, FSDP_E_INVALID, "staging ring: slot %d out of range", slot);
    if (bytes > r->bytes)
        return fsdp_err_set(err, FSDP_E_INVALID, "staging ring: %zu bytes exceed a %zu-byte buffer", bytes, r->bytes);
    return FSDP_OK;
}

static int wait_slot(dev_ring *r, int i, fsdp_err *err) {
    if (!r->busy[i]) return FSDP_OK;
    r->busy[i] = 0;
    cudaError_t e = cudaEventSynchronize(r->ev[i]);
    if (e != cudaSuccess) return dev_cuda_fail(err, e, "cudaEventSynchronize (staging ring)");
    return FSDP_OK;
}

int dev_ring_acquire(dev_ring *r, int slot, void **buf, fsdp_err *err) {
    *buf = NULL;
    int rc = check_slot(r, slot, 0, err);
    if (!rc) rc = wait_slot(r, slot, err);
    if (!rc) *buf = r->buf[slot];
    return rc;
}

static int queue(dev_ring *r, int slot, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                 fsdp_err *err) {
    int rc = check_slot(r, slot, bytes, err);
    if (!rc && r->busy[slot])
        rc = fsdp_err_set(err, FSDP_E_INVALID, "staging ring: buffer %d is still busy", slot);
    if (rc || !bytes) return rc;
    if ((rc = dev_stream_wait(r->d, DEV_STREAM_COPY, DEV_STREAM_COMPUTE, err))) return rc;
    cudaStream_t st = dev_ctx_stream(r->d, DEV_STREAM_COPY);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, st);
    if (e != cudaSuccess)
        return dev_cuda_fail(err, e, "cudaMemcpyAsync %s (%zu bytes, staging ring)",
                             kind == cudaMemcpyHostToDevice ? "host to device" : "device to host", bytes);
    e = cudaEventRecord(r->ev[slot], st);
    if (e != cudaSuccess) {
        cudaStreamSynchronize(st);
        return dev_cuda_fail(err, e, "cudaEventRecord (staging ring)");
    }
    r->busy[slot] = 1;
    return FSDP_OK;
}

int dev_ring_h2d(dev_ring *r, int slot, void *d_dst, size_t bytes, fsdp_err *err) {
    return queue(r, slot, d_dst, slot >= 0 && slot < r->n ? r->buf[slot] : NULL, bytes, cudaMemcpyHostToDevice, err);
}

int dev_ring_d2h(dev_ring *r, int slot, const void *d_src, size_t bytes, fsdp_err *err) {
    return queue(r, slot, slot >= 0 && slot < r->n ? r->buf[slot] : NULL, d_src, bytes, cudaMemcpyDeviceToHost, err);
}

int dev_ring_drain(dev_ring *r, fsdp_err *err) {
    int rc = FSDP_OK;
    fsdp_err e2;
    for (int i = 0; i < r->n; i++) {
        int x = wait_slot(r, i, rc ? &e2 : err);
        if (!rc) rc = x;
    }
    return rc;
}

#else /* !FSDP_HAVE_CUDA */

int dev_ring_create(dev_ctx *d, int n, size_t bytes, dev_ring **out, fsdp_err *err) {
    (void)d, (void)n, (void)bytes;
    *out = NULL;
    return dev_err_no_cuda(err, "dev_ring_create");
}
void dev_ring_free(dev_ring *r) { (void)r; }
int dev_ring_acquire(dev_ring *r, int slot, void **buf, fsdp_err *err) {
    (void)r, (void)slot;
    *buf = NULL;
    return dev_err_no_cuda(err, "dev_ring_acquire");
}
int dev_ring_h2d(dev_ring *r, int slot, void *d_dst, size_t bytes, fsdp_err *err) {
    (void)r, (void)slot, (void)d_dst, (void)bytes;
    return dev_err_no_cuda(err, "dev_ring_h2d");
}
int dev_ring_d2h(dev_ring *r, int slot, const void *d_src, size_t bytes, fsdp_err *err) {
    (void)r, (void)slot, (void)d_src, (void)bytes;
    return dev_err_no_cuda(err, "dev_ring_d2h");
}
int dev_ring_drain(dev_ring *r, fsdp_err *err) {
    (void)r;
    return dev_err_no_cuda(err, "dev_ring_drain");
}

#endif
