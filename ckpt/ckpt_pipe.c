/* Staged upload / download pipelines over a sink (see ckpt_pipe.h). */
#include "ckpt/ckpt_pipe.h"

#include <stdlib.h>
#include <string.h>

int ckpt_sink_check(const ckpt_sink *s, fsdp_err *err) {
    if (!s || !s->ops || !s->ops->acquire || !s->ops->submit || !s->ops->drain)
        return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint staging: no sink");
    if (s->n_bufs < 2) return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint staging: %d buffers (needs >= 2)", s->n_bufs);
    if (!s->buf_bytes || s->buf_bytes % 4)
        return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint staging: buffers of %zu bytes (a multiple of 4 needed)",
                            s->buf_bytes);
    return 0;
}

/* ---- uploads ----------------------------------------------------------------------------------- */

void ckpt_up_init(ckpt_up *u, const ckpt_sink *s) {
    memset(u, 0, sizeof *u);
    u->s = s;
}

int ckpt_up_get(ckpt_up *u, void **buf, fsdp_err *err) {
    *buf = NULL;
    if (u->held) return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint staging: a buffer is already handed out");
    int rc = u->s->ops->acquire(u->s->self, (int)(u->n % (uint64_t)u->s->n_bufs), buf, err);
    if (!rc) u->held = 1;
    return rc;
}

int ckpt_up_get_from(ckpt_up *u, const void *dev, size_t bytes, void **buf, fsdp_err *err) {
    if (bytes > u->s->buf_bytes)
        return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint staging: %zu bytes exceed a buffer", bytes);
    int rc = ckpt_up_get(u, buf, err);
    if (rc) return rc;
    int slot = (int)(u->n % (uint64_t)u->s->n_bufs);
    rc = u->s->ops->submit(u->s->self, slot, CKPT_FROM_DEV, (void *)dev, bytes, err);
    if (!rc) rc = u->s->ops->acquire(u->s->self, slot, buf, err);
    if (rc) {
        u->held = 0;
        *buf = NULL;
    }
    return rc;
}

void ckpt_up_release(ckpt_up *u) { u->held = 0; }

int ckpt_up_put(ckpt_up *u, void *dev, size_t bytes, fsdp_err *err) {
    if (!u->held) return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint staging: no buffer handed out");
    if (bytes > u->s->buf_bytes)
        return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint staging: %zu bytes exceed a buffer", bytes);
    int slot = (int)(u->n % (uint64_t)u->s->n_bufs);
    u->held = 0;
    u->n++;
    int rc = u->s->ops->submit(u->s->self, slot, CKPT_TO_DEV, dev, bytes, err);
    if (!rc) u->bytes += bytes;
    return rc;
}

int ckpt_up_finish(ckpt_up *u, fsdp_err *err) {
    u->held = 0;
    return u->s->ops->drain(u->s->self, err);
}

int ckpt_up_host(ckpt_up *u, float *dev, const float *host, size_t n, ckpt_chunk_fn fn, void *user,
                 fsdp_err *err) {
    size_t per = u->s->buf_bytes / sizeof(float);
    for (size_t off = 0; off < n; off += per) {
        size_t k = n - off < per ? n - off : per;
        void *buf;
        int rc = ckpt_up_get(u, &buf, err);
        if (rc) return rc;
        if (host) memcpy(buf, host + off, k * sizeof(float));
        if (fn && (rc = fn(user, buf, k, off, err))) {
            ckpt_up_release(u); /* the buffer goes back unsubmitted */
            return rc;
        }
        if ((rc = ckpt_up_put(u, dev + off, k * sizeof(float), err))) return rc;
    }
    return 0;
}

static int fill_chunk(void *user, float *chunk, size_t n, size_t first, fsdp_err *err) {
    (void)first;
    (void)err;
    const float v = *(const float *)user;
    for (size_t i = 0; i < n; i++) chunk[i] = v;
    return 0;
}

int ckpt_up_fill(ckpt_up *u, float *dev, float v, size_t n, fsdp_err *err) {
    return ckpt_up_host(u, dev, NULL, n, fill_chunk, &v, err);
}

/* ---- downloads --------------------------------------------------------------------------------- */

void ckpt_down_init(ckpt_down *d, const ckpt_sink *s) {
    memset(d, 0, sizeof *d);
    d->s = s;
}

void ckpt_down_free(ckpt_down *d) {
    free(d->chunks);
    d->chunks = NULL;
    d->n = d->cap = 0;
}

int ckpt_down_add(ckpt_down *d, void *dev, size_t bytes, fsdp_err *err) {
    size_t per = d->s->buf_bytes;
    for (size_t off = 0; off < bytes; off += per) {
        if (d->n == d->cap) {
            size_t cap = d->cap ? d->cap * 2 : 64;
            ckpt_down_chunk *c = realloc(d->chunks, cap * sizeof *c);
            if (!c) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory planning a download");
            d->chunks = c;
            d->cap = cap;
        }
        d->chunks[d->n].dev = (char *)dev + off;
        d->chunks[d->n].bytes = bytes - off < per ? bytes - off : per;
        d->n++;
    }
    return 0;
}

int ckpt_down_next(ckpt_down *d, void **buf, size_t *bytes, fsdp_err *err) {
    *buf = NULL;
    *bytes = 0;
    if (d->handed >= d->n) return fsdp_err_set(err, FSDP_E_INVALID, "checkpoint staging: no chunk left to download");
    size_t nb = (size_t)d->s->n_bufs;
    /* the buffers of every chunk before this one are free again: keep all of them busy */
    while (d->submitted < d->n && d->submitted < d->handed + nb) {
        const ckpt_down_chunk *c = &d->chunks[d->submitted];
        int rc = d->s->ops->submit(d->s->self, (int)(d->submitted % nb), CKPT_FROM_DEV, c->dev, c->bytes, err);
        if (rc) return rc;
        d->submitted++;
    }
    int rc = d->s->ops->acquire(d->s->self, (int)(d->handed % nb), buf, err);
    if (rc) return rc;
    *bytes = d->chunks[d->handed].bytes;
    d->handed++;
    return 0;
}

int ckpt_down_finish(ckpt_down *d, fsdp_err *err) { return d->s->ops->drain(d->s->self, err); }

int ckpt_down_host(const ckpt_sink *s, float *host, const float *dev, size_t n, fsdp_err *err) {
    ckpt_down d;
    ckpt_down_init(&d, s);
    int rc = ckpt_down_add(&d, (void *)dev, n * sizeof(float), err);
    char *out = (char *)host;
    for (size_t i = 0; i < d.n && !rc; i++) {
        void *buf;
        size_t b;
        if ((rc = ckpt_down_next(&d, &buf, &b, err))) break;
        memcpy(out, buf, b);
        out += b;
    }
    fsdp_err e2;
    int frc = ckpt_down_finish(&d, rc ? &e2 : err);
    ckpt_down_free(&d);
    return rc ? rc : frc;
}
