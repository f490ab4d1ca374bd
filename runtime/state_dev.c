/* Placement of the sharded state: host, pinned host and device arrays (runtime/state.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/device.h"
#include "runtime/device_xfer.h"
#include "runtime/state.h"
#include "runtime/state_defer.h"

static const char *const ARRAY_NAMES[STATE_ARRAYS] = {"data", "grad", "exp_avg", "exp_avg_sq"};

const char *state_array_name(state_array a) { return a >= 0 && a < STATE_ARRAYS ? ARRAY_NAMES[a] : "?"; }

float **state_param_host_slot(state_param *p, state_array a) {
    switch (a) {
    case STATE_DATA: return &p->data;
    case STATE_GRAD: return &p->grad;
    case STATE_EXP_AVG: return &p->exp_avg;
    case STATE_EXP_AVG_SQ: return &p->exp_avg_sq;
    default: return NULL;
    }
}

float **state_param_dev_slot(state_param *p, state_array a) {
    switch (a) {
    case STATE_DATA: return &p->d_data;
    case STATE_GRAD: return &p->d_grad;
    case STATE_EXP_AVG: return &p->d_exp_avg;
    case STATE_EXP_AVG_SQ: return &p->d_exp_avg_sq;
    default: return NULL;
    }
}

static float *host_ptr(const state_param *p, state_array a) { return *state_param_host_slot((state_param *)p, a); }
static float *dev_ptr(const state_param *p, state_array a) { return *state_param_dev_slot((state_param *)p, a); }

state_place state_place_of(const state_param *p, state_array a) {
    if (a < 0 || a >= STATE_ARRAYS) return STATE_ABSENT;
    if (a == STATE_DATA && p->deferred) return STATE_HOST; /* produced on demand into host memory */
    if (dev_ptr(p, a)) return STATE_DEVICE;
    if (host_ptr(p, a)) return (p->pinned & (1u << a)) ? STATE_PINNED : STATE_HOST;
    return STATE_ABSENT;
}

int state_param_has_moments(const state_param *p) { return state_place_of(p, STATE_EXP_AVG) != STATE_ABSENT; }

int state_on_device(const fsdp_state *s) {
    for (size_t i = 0; s && i < s->n; i++)
        for (int a = 0; a < STATE_ARRAYS; a++)
            if (dev_ptr(&s->p[i], (state_array)a)) return 1;
    return 0;
}

/* Device arrays or pinned host arrays: the state needs s->dev. */
static int uses_device(const fsdp_state *s) {
    for (size_t i = 0; i < s->n; i++) {
        if (s->p[i].pinned) return 1;
        for (int a = 0; a < STATE_ARRAYS; a++)
            if (dev_ptr(&s->p[i], (state_array)a)) return 1;
    }
    return 0;
}

static int local_bytes(const state_param *p, size_t *bytes, fsdp_err *err) {
    size_t n = state_param_local_numel(p);
    if (n > SIZE_MAX / sizeof(float))
        return fsdp_err_set(err, FSDP_E_INVALID, "parameter %s: %zu local values overflow a size", p->name, n);
    *bytes = n * sizeof(float);
    return 0;
}

void state_param_release(fsdp_state *s, state_param *p, state_array a) {
    float **h = state_param_host_slot(p, a), **d = state_param_dev_slot(p, a);
    if (!h) return;
    if (a == STATE_DATA) state_param_undefer(p);
    fsdp_err e;
    if (*d) {
        if (s && s->dev) dev_free(s->dev, *d, &e);
        *d = NULL;
    }
    if (*h) {
        if ((p->pinned & (1u << a)) && s && s->dev) dev_host_free(s->dev, *h, &e);
        else free(*h);
        *h = NULL;
    }
    p->pinned &= ~(1u << a);
}

int state_attach_device(fsdp_state *s, struct dev_ctx *d, fsdp_err *err) {
    if (!d) return fsdp_err_set(err, FSDP_E_INVALID, "state: no device context (runtime.device cuda needs a GPU)");
    if (s->dev && s->dev != d)
        return fsdp_err_set(err, FSDP_E_INVALID, "state: already placed with another device context");
    s->dev = d;
    return 0;
}

static int need_dev(const fsdp_state *s, const state_param *p, state_array a, const char *what, fsdp_err *err) {
    if (s->dev) return 0;
    return fsdp_err_set(err, FSDP_E_INVALID, "%s of %s (%s): the state has no device context", what, p->name,
                        state_array_name(a));
}

/* New storage at `where` (not installed). */
static int alloc_at(fsdp_state *s, const state_param *p, state_array a, state_place where, int zero, float **out,
                    fsdp_err *err) {
    *out = NULL;
    size_t bytes = 0;
    int rc = local_bytes(p, &bytes, err);
    if (rc) return rc;
    size_t nb = bytes ? bytes : sizeof(float);
    void *ptr = NULL;
    switch (where) {
    case STATE_HOST:
        ptr = zero ? calloc(1, nb) : malloc(nb);
        if (!ptr)
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory: %zu bytes for the %s of %s", nb,
                                state_array_name(a), p->name);
        break;
    case STATE_PINNED:
        if ((rc = need_dev(s, p, a, "pinned allocation", err))) return rc;
        if ((rc = dev_host_alloc(s->dev, nb, &ptr, err)))
            return fsdp_err_prefix(err, "%s of %s in pinned host memory", state_array_name(a), p->name);
        if (zero) memset(ptr, 0, nb);
        break;
    case STATE_DEVICE:
        if ((rc = need_dev(s, p, a, "device allocation", err))) return rc;
        if ((rc = dev_alloc(s->dev, nb, &ptr, err)))
            return fsdp_err_prefix(err, "%s of %s on the GPU", state_array_name(a), p->name);
        if (zero && (rc = dev_memset0(s->dev, ptr, nb, DEV_STREAM_COMPUTE, err))) {
            fsdp_err e2;
            dev_free(s->dev, ptr, &e2);
            return rc;
        }
        break;
    default: return fsdp_err_set(err, FSDP_E_INVALID, "state: invalid placement %d", (int)where);
    }
    *out = ptr;
    return 0;
}

static void free_at(fsdp_state *s, state_place where, float *ptr) {
    fsdp_err e;
    if (!ptr) return;
    if (where == STATE_DEVICE) dev_free(s->dev, ptr, &e);
    else if (where == STATE_PINNED) dev_host_free(s->dev, ptr, &e);
    else free(ptr);
}

static void install(state_param *p, state_array a, state_place where, float *ptr) {
    if (where == STATE_DEVICE) {
        *state_param_dev_slot(p, a) = ptr;
    } else {
        *state_param_host_slot(p, a) = ptr;
        if (where == STATE_PINNED) p->pinned |= 1u << a;
    }
}

int state_param_alloc(fsdp_state *s, state_param *p, state_array a, state_place where, int zero, fsdp_err *err) {
    if (a < 0 || a >= STATE_ARRAYS) return fsdp_err_set(err, FSDP_E_INVALID, "state: invalid array %d", (int)a);
    float *ptr;
    int rc = alloc_at(s, p, a, where, zero, &ptr, err);
    if (rc) return rc;
    state_param_release(s, p, a);
    install(p, a, where, ptr);
    return 0;
}

/* Moves one array; device uploads go through x (completed by the caller's dev_xfer_finish). */
static int move_with(fsdp_state *s, state_param *p, state_array a, state_place where, dev_xfer *x, fsdp_err *err) {
    if (a == STATE_DATA && p->deferred) { /* produced into host memory first */
        int mrc = state_param_materialize(s, p, err);
        if (mrc) return mrc;
    }
    state_place cur = state_place_of(p, a);
    if (cur == STATE_ABSENT || cur == where) return 0;
    size_t bytes = 0;
    int rc = local_bytes(p, &bytes, err);
    if (rc) return rc;
    float *dst;
    if ((rc = alloc_at(s, p, a, where, 0, &dst, err))) return rc;
    float *src = cur == STATE_DEVICE ? dev_ptr(p, a) : host_ptr(p, a);
    if (where == STATE_DEVICE) rc = dev_xfer_h2d(x, dst, src, bytes, err);
    else if (cur == STATE_DEVICE) rc = dev_xfer_d2h(x, dst, src, bytes, err);
    else memcpy(dst, src, bytes);
    if (rc) {
        free_at(s, where, dst);
        return fsdp_err_prefix(err, "moving the %s of %s", state_array_name(a), p->name);
    }
    state_param_release(s, p, a);
    install(p, a, where, dst);
    return 0;
}

/* A staging pipeline when a move involves the device. */
static int xfer_for(const fsdp_state *s, dev_xfer **x, fsdp_err *err) {
    *x = NULL;
    if (!s->dev) return fsdp_err_set(err, FSDP_E_INVALID, "state: no device context for a device copy");
    return dev_xfer_create(s->dev, 0, x, err);
}

static int finish(dev_xfer *x, int rc, fsdp_err *err) {
    if (x && !rc) rc = dev_xfer_finish(x, err);
    dev_xfer_free(x);
    return rc;
}

int state_param_move(fsdp_state *s, state_param *p, state_array a, state_place where, fsdp_err *err) {
    state_place cur = state_place_of(p, a);
    if (cur == STATE_ABSENT || cur == where) return 0;
    dev_xfer *x = NULL;
    int rc = 0;
    if ((cur == STATE_DEVICE || where == STATE_DEVICE) && (rc = xfer_for(s, &x, err))) return rc;
    rc = move_with(s, p, a, where, x, err);
    return finish(x, rc, err);
}

state_place state_device_target(const fsdp_state *s, state_array a) {
    if (s->offloaded && (a == STATE_EXP_AVG || a == STATE_EXP_AVG_SQ)) return STATE_PINNED;
    if (s->offload_params && (a == STATE_DATA || a == STATE_GRAD)) return STATE_PINNED;
    return STATE_DEVICE;
}

int state_to_device(fsdp_state *s, struct dev_ctx *d, fsdp_err *err) {
    int rc = state_attach_device(s, d, err);
    if (rc) return rc;
    dev_xfer *x = NULL;
    if ((rc = dev_xfer_create(d, 0, &x, err))) return rc;
    for (size_t i = 0; i < s->n && !rc; i++)
        for (int a = 0; a < STATE_ARRAYS && !rc; a++)
            rc = move_with(s, &s->p[i], (state_array)a, state_device_target(s, (state_array)a), x, err);
    return finish(x, rc, err);
}

int state_to_host(fsdp_state *s, fsdp_err *err) {
    int rc = 0;
    if (state_on_device(s)) {
        dev_xfer *x = NULL;
        if ((rc = xfer_for(s, &x, err))) return rc;
        for (size_t i = 0; i < s->n && !rc; i++)
            for (int a = 0; a < STATE_ARRAYS && !rc; a++)
                if (state_place_of(&s->p[i], (state_array)a) == STATE_DEVICE)
                    rc = move_with(s, &s->p[i], (state_array)a, STATE_HOST, x, err);
        if ((rc = finish(x, rc, err))) return rc;
    }
    if (!uses_device(s)) s->dev = NULL;
    return 0;
}

static int absent(const state_param *p, state_array a, fsdp_err *err) {
    return fsdp_err_set(err, FSDP_E_INVALID, "parameter %s has no %s", p->name, state_array_name(a));
}

int state_param_get(const fsdp_state *s, const state_param *p, state_array a, float *host_dst, fsdp_err *err) {
    size_t bytes = 0;
    int rc = local_bytes(p, &bytes, err);
    if (rc) return rc;
    state_place where = state_place_of(p, a);
    if (where == STATE_ABSENT) return absent(p, a, err);
    if (a == STATE_DATA && p->deferred) return state_param_fill(p, 0, bytes / sizeof(float), host_dst, err);
    if (where != STATE_DEVICE) {
        if (bytes) memcpy(host_dst, host_ptr(p, a), bytes);
        return 0;
    }
    dev_xfer *x;
    if ((rc = xfer_for(s, &x, err))) return rc;
    rc = dev_xfer_d2h(x, host_dst, dev_ptr(p, a), bytes, err);
    if (rc) fsdp_err_prefix(err, "reading the %s of %s from the GPU", state_array_name(a), p->name);
    dev_xfer_free(x);
    return rc;
}

int state_param_put(fsdp_state *s, state_param *p, state_array a, const float *host_src, fsdp_err *err) {
    size_t bytes = 0;
    int rc = local_bytes(p, &bytes, err);
    if (rc) return rc;
    state_place where = state_place_of(p, a);
    if (where == STATE_ABSENT) return absent(p, a, err);
    if (a == STATE_DATA && p->deferred) { /* the new values replace the producer's */
        float *data = malloc(bytes ? bytes : sizeof(float));
        if (!data) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory: %zu bytes for %s", bytes, p->name);
        if (bytes) memcpy(data, host_src, bytes);
        state_param_undefer(p);
        p->data = data;
        return 0;
    }
    if (where != STATE_DEVICE) {
        if (bytes) memmove(host_ptr(p, a), host_src, bytes);
        return 0;
    }
    dev_xfer *x;
    if ((rc = xfer_for(s, &x, err))) return rc;
    rc = dev_xfer_h2d(x, dev_ptr(p, a), host_src, bytes, err);
    rc = finish(x, rc, err);
    return rc ? fsdp_err_prefix(err, "writing the %s of %s to the GPU", state_array_name(a), p->name) : 0;
}

int state_param_map(const fsdp_state *s, const state_param *p, state_array a, float **host, fsdp_err *err) {
    *host = NULL;
    state_place where = state_place_of(p, a);
    if (where == STATE_ABSENT) return absent(p, a, err);
    if (where != STATE_DEVICE && !(a == STATE_DATA && p->deferred)) {
        *host = host_ptr(p, a);
        return 0;
    }
    size_t bytes = 0;
    int rc = local_bytes(p, &bytes, err);
    if (rc) return rc;
    float *buf = malloc(bytes ? bytes : sizeof(float));
    if (!buf) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory: %zu bytes for the %s of %s", bytes,
                                  state_array_name(a), p->name);
    if ((rc = state_param_get(s, p, a, buf, err))) {
        free(buf);
        return rc;
    }
    *host = buf;
    return 0;
}

int state_param_unmap(fsdp_state *s, state_param *p, state_array a, float *host, int write_back, fsdp_err *err) {
    if (!host || host == host_ptr(p, a)) return 0;
    if (a == STATE_DATA && p->deferred) { /* a produced copy: kept as the values when written back */
        if (!write_back) {
            free(host);
            return 0;
        }
        state_param_undefer(p);
        p->data = host;
        return 0;
    }
    int rc = write_back ? state_param_put(s, p, a, host, err) : 0;
    free(host);
    return rc;
}

/* ---- host views ---------------------------------------------------------------------------- */

typedef struct state_view {
    fsdp_state s;    /* first: the view is handed out as this */
    unsigned *owned; /* per parameter: bit a = array a was downloaded for the view */
} state_view;

void state_host_view_free(fsdp_state *view) {
    if (!view) return;
    state_view *v = (state_view *)view;
    for (size_t i = 0; v->owned && i < v->s.n; i++)
        for (int a = 0; a < STATE_ARRAYS; a++)
            if (v->owned[i] & (1u << a)) free(*state_param_host_slot(&v->s.p[i], (state_array)a));
    free(v->owned);
    free(v->s.p);
    free(v);
}

int state_host_view(const fsdp_state *s, fsdp_state **view, fsdp_err *err) {
    *view = NULL;
    state_view *v = calloc(1, sizeof *v);
    if (!v) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    v->s = *s;
    v->s.dev = NULL;
    v->s.p = calloc(s->n ? s->n : 1, sizeof *v->s.p);
    v->owned = calloc(s->n ? s->n : 1, sizeof *v->owned);
    if (!v->s.p || !v->owned) {
        v->s.n = 0;
        state_host_view_free(&v->s);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    int rc = 0;
    for (size_t i = 0; i < s->n && !rc; i++) {
        const state_param *sp = &s->p[i];
        state_param *vp = &v->s.p[i];
        *vp = *sp;
        vp->pinned = 0;
        for (int a = 0; a < STATE_ARRAYS && !rc; a++) {
            *state_param_dev_slot(vp, (state_array)a) = NULL;
            if (state_place_of(sp, (state_array)a) != STATE_DEVICE) continue;
            float *h;
            if ((rc = state_param_map(s, sp, (state_array)a, &h, err))) break;
            *state_param_host_slot(vp, (state_array)a) = h;
            v->owned[i] |= 1u << a;
        }
    }
    if (rc) {
        state_host_view_free(&v->s);
        return rc;
    }
    *view = &v->s;
    return 0;
}
