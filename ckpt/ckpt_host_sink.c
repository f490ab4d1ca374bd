/* The host sink of the staging pipelines (ckpt_pipe.h): late completion in submission order, a log
 * of every operation and checks of the sink contract. */
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "ckpt/ckpt_pipe.h"
#include "ckpt/crc32.h"

static void log_op(ckpt_host_sink *hs, ckpt_host_op op, int slot, ckpt_dir dir, void *dev, size_t bytes) {
    if (!hs->record) return;
    if (hs->n_log == hs->cap_log) {
        size_t cap = hs->cap_log ? hs->cap_log * 2 : 256;
        ckpt_host_event *l = realloc(hs->log, cap * sizeof *l);
        if (!l) {
            hs->record = 0; /* out of memory: stop logging (the checks go on) */
            hs->violations++;
            return;
        }
        hs->log = l;
        hs->cap_log = cap;
    }
    ckpt_host_event *e = &hs->log[hs->n_log++];
    e->op = op;
    e->slot = slot;
    e->dir = dir;
    e->dev = dev;
    e->bytes = bytes;
}

static uint32_t buf_crc(const void *b, size_t n) {
    return ckpt_crc32(0, b, n);
}

/* Completes every pending transfer up to submission `upto`, oldest first. */
static void complete_upto(ckpt_host_sink *hs, uint64_t upto) {
    while (hs->done_seq < upto) {
        uint64_t want = hs->done_seq + 1;
        for (int i = 0; i < hs->sink.n_bufs; i++) {
            struct ckpt_host_pending *p = &hs->pend[i];
            if (!p->busy || p->seq != want) continue;
            if (p->dir == CKPT_TO_DEV) {
                /* the buffer changed while its upload was in flight: a real copy may take either bytes */
                if (buf_crc(hs->bufs[i], p->bytes) != p->crc) hs->violations++;
                memcpy(p->dev, hs->bufs[i], p->bytes);
                hs->bytes_to_dev += p->bytes;
            } else {
                memcpy(hs->bufs[i], p->dev, p->bytes);
                hs->bytes_from_dev += p->bytes;
            }
            p->busy = 0;
            log_op(hs, CKPT_OP_COMPLETE, i, p->dir, p->dev, p->bytes);
        }
        hs->done_seq = want; /* a failed submission has no pending entry */
    }
}

static int h_acquire(void *self, int slot, void **buf, fsdp_err *err) {
    ckpt_host_sink *hs = self;
    if (slot < 0 || slot >= hs->sink.n_bufs) {
        hs->violations++;
        return fsdp_err_set(err, FSDP_E_INVALID, "host sink: slot %d out of range", slot);
    }
    if (hs->pend[slot].busy) complete_upto(hs, hs->pend[slot].seq);
    log_op(hs, CKPT_OP_ACQUIRE, slot, CKPT_TO_DEV, NULL, 0);
    *buf = hs->bufs[slot];
    return 0;
}

static int h_submit(void *self, int slot, ckpt_dir dir, void *dev, size_t bytes, fsdp_err *err) {
    ckpt_host_sink *hs = self;
    if (slot < 0 || slot >= hs->sink.n_bufs || bytes > hs->sink.buf_bytes || hs->pend[slot].busy) {
        hs->violations++;
        return fsdp_err_set(err, FSDP_E_INVALID, "host sink: bad submission to slot %d (%zu bytes%s)", slot, bytes,
                            slot >= 0 && slot < hs->sink.n_bufs && hs->pend[slot].busy ? ", buffer busy" : "");
    }
    hs->seq++;
    if (hs->fail_submit_at && hs->seq == hs->fail_submit_at)
        return fsdp_err_set(err, FSDP_E_DEVICE, "host sink: submission %llu fails (injected)",
                            (unsigned long long)hs->seq);
    struct ckpt_host_pending *p = &hs->pend[slot];
    p->busy = 1;
    p->seq = hs->seq;
    p->dir = dir;
    p->dev = dev;
    p->bytes = bytes;
    if (dir == CKPT_TO_DEV) p->crc = buf_crc(hs->bufs[slot], bytes);
    log_op(hs, CKPT_OP_SUBMIT, slot, dir, dev, bytes);
    int busy = 0;
    for (int i = 0; i < hs->sink.n_bufs; i++) busy += hs->pend[i].busy;
    if (busy > hs->max_in_flight) hs->max_in_flight = busy;
    return 0;
}

static int h_drain(void *self, fsdp_err *err) {
    (void)err;
    ckpt_host_sink *hs = self;
    complete_upto(hs, hs->seq);
    return 0;
}

static const ckpt_sink_ops HOST_OPS = {h_acquire, h_submit, h_drain};

int ckpt_host_sink_init(ckpt_host_sink *hs, int n_bufs, size_t buf_bytes, int record, fsdp_err *err) {
    memset(hs, 0, sizeof *hs);
    hs->sink.ops = &HOST_OPS;
    hs->sink.self = hs;
    hs->sink.n_bufs = n_bufs;
    hs->sink.buf_bytes = buf_bytes;
    hs->record = record;
    int rc = ckpt_sink_check(&hs->sink, err);
    if (rc) return rc;
    hs->bufs = calloc((size_t)n_bufs, sizeof *hs->bufs);
    hs->pend = calloc((size_t)n_bufs, sizeof *hs->pend);
    if (!hs->bufs || !hs->pend) {
        ckpt_host_sink_free(hs);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    for (int i = 0; i < n_bufs; i++)
        if (!(hs->bufs[i] = malloc(buf_bytes))) {
            ckpt_host_sink_free(hs);
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory: host sink buffers of %zu bytes", buf_bytes);
        }
    return 0;
}

void ckpt_host_sink_free(ckpt_host_sink *hs) {
    for (int i = 0; hs->bufs && i < hs->sink.n_bufs; i++) free(hs->bufs[i]);
    free(hs->bufs);
    free(hs->pend);
    free(hs->log);
    memset(hs, 0, sizeof *hs);
}
