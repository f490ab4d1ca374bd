/* Bulk copies between host memory of any kind (pageable or pinned) and device memory through two
 * pinned staging buffers on the COPY stream: the host-side memcpy (or generation) of one chunk
 * overlaps the DMA of the other. Used to move the sharded state (runtime/state.h) and to
 * materialise parameters on the GPU.
 *
 * Ordering: every copy is queued after the work queued so far on the COMPUTE stream (kernels still
 * writing a device array, a block just reused by the caching allocator). Uploads complete on the
 * device by dev_xfer_finish; downloads are synchronous. One dev_xfer belongs to one thread.
 * In a build without CUDA every function fails with FSDP_E_DEVICE "built without CUDA". */
#ifndef FSDP_RUNTIME_DEVICE_XFER_H
#define FSDP_RUNTIME_DEVICE_XFER_H

#include <stddef.h>

#include "fsdp/error.h"
#include "runtime/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Staging chunk used when 0 is asked for: 16 MiB (two of them are pinned while a dev_xfer lives). */
#define DEV_XFER_CHUNK_DEFAULT ((size_t)16 << 20)

typedef struct dev_xfer dev_xfer;

/* Two pinned buffers of chunk_bytes (0: DEV_XFER_CHUNK_DEFAULT) from d's pinned cache. */
int dev_xfer_create(dev_ctx *d, size_t chunk_bytes, dev_xfer **out, fsdp_err *err);
size_t dev_xfer_chunk(const dev_xfer *x);

/* h_src -> d_dst in chunks. Returns once h_src may be reused or freed (its bytes are staged); the
 * device side is complete after dev_xfer_finish. */
int dev_xfer_h2d(dev_xfer *x, void *d_dst, const void *h_src, size_t bytes, fsdp_err *err);
/* d_src -> h_dst in chunks, synchronous: h_dst holds the values on return. */
int dev_xfer_d2h(dev_xfer *x, void *h_dst, const void *d_src, size_t bytes, fsdp_err *err);

/* Producer interface for data generated on the host: dev_xfer_next hands out a staging buffer of
 * dev_xfer_chunk bytes (waiting until its previous copy has completed); dev_xfer_push queues the
 * copy of its first `bytes` bytes to d_dst. */
int dev_xfer_next(dev_xfer *x, void **buf, fsdp_err *err);
int dev_xfer_push(dev_xfer *x, void *d_dst, size_t bytes, fsdp_err *err);

/* Waits until every queued copy has completed. */
int dev_xfer_finish(dev_xfer *x, fsdp_err *err);
/* Waits for queued copies (errors ignored) and gives the staging buffers back. NULL is a no-op. */
void dev_xfer_free(dev_xfer *x);

#ifdef __cplusplus
}
#endif
#endif
