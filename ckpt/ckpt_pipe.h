/* Staged checkpoint transfers between host code and a state that lives elsewhere (the GPU): a ring
 * of staging buffers owned by a "sink", so that the host work on one buffer (reading a checkpoint
 * chunk from disk and converting it, or writing a downloaded chunk to the data file) overlaps the
 * transfer of another.
 *
 * The sink is abstract: the GPU one (stages) uses pinned buffers and an event per buffer on the
 * COPY stream; the host one (ckpt_host_sink below) completes its copies late, in submission order
 * like a stream, and records every operation, so that the pipelines here can be checked on the CPU.
 *
 * Contract of a sink with n_bufs buffers of buf_bytes bytes (a multiple of 4):
 *  - acquire(slot): waits until the last transfer submitted from/to that buffer has completed and
 *    hands out the buffer; the caller may then read it (a download) or fill it (an upload);
 *  - submit(slot, dir, dev, bytes): starts the transfer of the buffer's first `bytes` bytes to the
 *    remote address `dev` (CKPT_TO_DEV) or from it into the buffer (CKPT_FROM_DEV); the buffer is
 *    busy until a later acquire of the same slot (or drain) returns;
 *  - drain: waits for every submitted transfer.
 * Transfers complete in submission order. */
#ifndef FSDP_CKPT_PIPE_H
#define FSDP_CKPT_PIPE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"

typedef enum ckpt_dir { CKPT_TO_DEV = 0, CKPT_FROM_DEV = 1 } ckpt_dir;

typedef struct ckpt_sink_ops {
    int (*acquire)(void *self, int slot, void **buf, fsdp_err *err);
    int (*submit)(void *self, int slot, ckpt_dir dir, void *dev, size_t bytes, fsdp_err *err);
    int (*drain)(void *self, fsdp_err *err);
} ckpt_sink_ops;

typedef struct ckpt_sink {
    const ckpt_sink_ops *ops;
    void *self;
    int n_bufs;       /* >= 2 */
    size_t buf_bytes; /* a multiple of 4 */
} ckpt_sink;

/* FSDP_E_INVALID unless the sink has ops, >= 2 buffers and a non-zero multiple of 4 bytes each. */
int ckpt_sink_check(const ckpt_sink *s, fsdp_err *err);

/* ---- uploads: fill buffer i+1 while buffer i is in flight ------------------------------------ */

typedef struct ckpt_up {
    const ckpt_sink *s;
    uint64_t n;     /* buffers handed out so far */
    int held;       /* a buffer is handed out and not submitted */
    uint64_t bytes; /* bytes submitted */
} ckpt_up;

void ckpt_up_init(ckpt_up *u, const ckpt_sink *s);
/* The next staging buffer (s->buf_bytes bytes), once its previous upload has completed. */
int ckpt_up_get(ckpt_up *u, void **buf, fsdp_err *err);
/* The next staging buffer holding `bytes` bytes downloaded from dev (for read-modify-write: change
 * them and ckpt_up_put them back). */
int ckpt_up_get_from(ckpt_up *u, const void *dev, size_t bytes, void **buf, fsdp_err *err);
/* Gives the buffer from ckpt_up_get back without uploading it (no-op when none is held). */
void ckpt_up_release(ckpt_up *u);
/* Uploads the first `bytes` bytes of the buffer from ckpt_up_get to dev. */
int ckpt_up_put(ckpt_up *u, void *dev, size_t bytes, fsdp_err *err);
/* Waits for every upload. */
int ckpt_up_finish(ckpt_up *u, fsdp_err *err);

/* Called on every staged chunk of floats before it is uploaded (checks, rounding); its error stops
 * the transfer. */
typedef int (*ckpt_chunk_fn)(void *user, float *chunk, size_t n, size_t first, fsdp_err *err);

/* Uploads n floats to dev through the staging buffers: each chunk is copied from host (when not
 * NULL), then passed to fn (when not NULL) with the index of its first value, then submitted. */
int ckpt_up_host(ckpt_up *u, float *dev, const float *host, size_t n, ckpt_chunk_fn fn, void *user,
                 fsdp_err *err);
/* Writes n copies of v to dev through the staging buffers. */
int ckpt_up_fill(ckpt_up *u, float *dev, float v, size_t n, fsdp_err *err);

/* ---- downloads: chunk i+1 (and more) in flight while chunk i is consumed -------------------- */

typedef struct ckpt_down_chunk {
    void *dev;
    size_t bytes;
} ckpt_down_chunk;

typedef struct ckpt_down {
    const ckpt_sink *s;
    ckpt_down_chunk *chunks;
    size_t n, cap;
    size_t submitted, handed; /* chunks submitted, chunks handed out */
} ckpt_down;

void ckpt_down_init(ckpt_down *d, const ckpt_sink *s);
void ckpt_down_free(ckpt_down *d);
/* Plans the download of `bytes` bytes at dev (split into buffer-sized chunks, in order). */
int ckpt_down_add(ckpt_down *d, void *dev, size_t bytes, fsdp_err *err);
/* The next planned chunk in a staging buffer (valid until the following call); before waiting for
 * it, the downloads of the chunks after it are started into the free buffers. */
int ckpt_down_next(ckpt_down *d, void **buf, size_t *bytes, fsdp_err *err);
/* Waits for every started download (after an error, or when chunks were left unread). */
int ckpt_down_finish(ckpt_down *d, fsdp_err *err);
/* Downloads n floats at dev into host memory (plans, runs and finishes one transfer). */
int ckpt_down_host(const ckpt_sink *s, float *host, const float *dev, size_t n, fsdp_err *err);

/* ---- the host sink ---------------------------------------------------------------------------
 * "Remote" addresses are host memory. A submitted copy happens only when it completes, i.e. when a
 * later acquire of a slot or drain waits for it (all earlier submissions complete first), so a
 * buffer changed while its upload is pending delivers the wrong bytes and counts as a violation
 * (its CRC at completion differs from the one at submission). Every operation is logged; misuse
 * (a submit to a busy buffer, a slot out of range, more bytes than a buffer) counts as a violation
 * and fails. fail_submit_at > 0 makes that submission (1-based) fail. */

typedef enum ckpt_host_op { CKPT_OP_ACQUIRE = 0, CKPT_OP_SUBMIT, CKPT_OP_COMPLETE } ckpt_host_op;

typedef struct ckpt_host_event {
    ckpt_host_op op;
    int slot;
    ckpt_dir dir;
    void *dev;
    size_t bytes;
} ckpt_host_event;

typedef struct ckpt_host_sink {
    ckpt_sink sink; /* hand &hs->sink to the pipelines */
    void **bufs;
    struct ckpt_host_pending {
        int busy;
        uint64_t seq;
        ckpt_dir dir;
        void *dev;
        size_t bytes;
        uint32_t crc; /* uploads: the buffer's bytes when submitted */
    } *pend;
    uint64_t seq, done_seq; /* submissions so far; submissions completed */
    int record;             /* log events */
    ckpt_host_event *log;
    size_t n_log, cap_log;
    int violations;
    uint64_t fail_submit_at;
    uint64_t bytes_to_dev, bytes_from_dev;
    int max_in_flight; /* most transfers pending at once */
} ckpt_host_sink;

int ckpt_host_sink_init(ckpt_host_sink *hs, int n_bufs, size_t buf_bytes, int record, fsdp_err *err);
void ckpt_host_sink_free(ckpt_host_sink *hs);

#endif
