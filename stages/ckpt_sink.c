/* The GPU sink of the checkpoint staging pipelines (ckpt/ckpt_pipe.h) over a pinned ring
 * (runtime/device_ring.h). */
#include <string.h>

#include "runtime/device_ring.h"
#include "stages/stages.h"

static int g_acquire(void *self, int slot, void **buf, fsdp_err *err) { return dev_ring_acquire(self, slot, buf, err); }

static int g_submit(void *self, int slot, ckpt_dir dir, void *dev, size_t bytes, fsdp_err *err) {
    return dir == CKPT_TO_DEV ? dev_ring_h2d(self, slot, dev, bytes, err) : dev_ring_d2h(self, slot, dev, bytes, err);
}

static int g_drain(void *self, fsdp_err *err) { return dev_ring_drain(self, err); }

static const ckpt_sink_ops GPU_OPS = {g_acquire, g_submit, g_drain};

int stage_ckpt_sink_create(dev_ctx *d, stage_ckpt_sink *out, fsdp_err *err) {
    memset(out, 0, sizeof *out);
    dev_ring *r;
    int rc = dev_ring_create(d, STAGE_CKPT_SINK_BUFS, STAGE_CKPT_SINK_BYTES, &r, err);
    if (rc) return fsdp_err_prefix(err, "checkpoint staging buffers");
    out->ring = r;
    out->sink.ops = &GPU_OPS;
    out->sink.self = r;
    out->sink.n_bufs = STAGE_CKPT_SINK_BUFS;
    out->sink.buf_bytes = STAGE_CKPT_SINK_BYTES;
    return 0;
}

void stage_ckpt_sink_free(stage_ckpt_sink *s) {
    dev_ring_free(s->ring);
    memset(s, 0, sizeof *s);
}
