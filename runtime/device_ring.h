/* A ring of n pinned staging buffers with one event each on the COPY stream, for pipelined
 * checkpoint transfers (ckpt/ckpt_pipe.h's sink contract): while the host fills or drains one
 * buffer, the copies of the others run.
 *
 * dev_ring_acquire waits for the last copy of a buffer; dev_ring_h2d / dev_ring_d2h queue a copy
 * of a buffer's first bytes after the work queued so far on the COMPUTE stream (kernels still
 * writing a device array) and record the buffer's event; dev_ring_drain waits for all of them.
 * One dev_ring belongs to one thread. In a build without CUDA every function fails with
 * FSDP_E_DEVICE "built without CUDA". */
#ifndef FSDP_RUNTIME_DEVICE_RING_H
#define FSDP_RUNTIME_DEVICE_RING_H

#include <stddef.h>

#include "fsdp/error.h"
#include "runtime/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dev_ring dev_ring;

/* n (>= 2) pinned buffers of `bytes` each from d's pinned cache. */
int dev_ring_create(dev_ctx *d, int n, size_t bytes, dev_ring **out, fsdp_err *err);
/* Waits for the ring's copies and gives the buffers back. NULL is a no-op. */
void dev_ring_free(dev_ring *r);
int dev_ring_acquire(dev_ring *r, int slot, void **buf, fsdp_err *err);
int dev_ring_h2d(dev_ring *r, int slot, void *d_dst, size_t bytes, fsdp_err *err);
int dev_ring_d2h(dev_ring *r, int slot, const void *d_src, size_t bytes, fsdp_err *err);
int dev_ring_drain(dev_ring *r, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
