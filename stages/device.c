/* The run's device: runtime.device resolved once per run (auto = cuda when every rank has a GPU of
 * its own), the device context and NCCL communicator shared by every stage, placing the state, and
 * materialising parameters on the GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kcu.h"
#include "runtime/ctx_impl.h"
#include "runtime/device_probe.h"
#include "runtime/device_xfer.h"
#include "stages/stages.h"

#define SLOT_NAME "fsdp.device"

typedef struct stage_dev_slot {
    int probed;     /* the collective GPU probe ran */
    int usable;     /* every rank has a GPU of its own */
    char why[1024]; /* why not, when not usable */
    char gpu[256];  /* this rank's GPU */
    int told_auto;  /* the auto choice was logged */
    dev_ctx *dev;
} stage_dev_slot;

static void slot_destroy(void *p) {
    stage_dev_slot *s = p;
    if (!s) return;
    dev_ctx_free(s->dev);
    free(s);
}

/* The slot lives at the front of the attachments: they are destroyed last to first, so the device
 * context outlives the state and everything else that holds device memory. */
static stage_dev_slot *slot_get(fsdp_ctx *ctx, fsdp_err *err) {
    stage_dev_slot *s = fsdp_ctx_attached(ctx, SLOT_NAME);
    if (s) return s;
    s = calloc(1, sizeof *s);
    if (!s || fsdp_ctx_attach(ctx, SLOT_NAME, s, slot_destroy)) {
        free(s);
        fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        return NULL;
    }
    ctx_attachment last = ctx->att[ctx->n_att - 1];
    memmove(ctx->att + 1, ctx->att, (ctx->n_att - 1) * sizeof *ctx->att);
    ctx->att[0] = last;
    return s;
}

static int local_rank_of(comm *c) { return comm_size(c) > 1 ? comm_local_rank(c) : -1; }

/* Collective: every rank probes its GPU; usable when all have one and no two share one. */
static int probe(fsdp_ctx *ctx, stage_dev_slot *s, fsdp_err *err) {
    comm *c = stage_comm(ctx);
    if (!c) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int world = comm_size(c), rank = comm_rank(c);
    enum { REC = 17 }; /* ok flag + UUID */
    unsigned char mine[REC];
    memset(mine, 0, sizeof mine);
    dev_probe_info info;
    fsdp_err perr;
    fsdp_err_clear(&perr);
    if (dev_probe(local_rank_of(c), &info, &perr) == 0) {
        mine[0] = 1;
        memcpy(mine + 1, info.uuid, 16);
        snprintf(s->gpu, sizeof s->gpu, "GPU %d of %d, %s", info.ordinal, info.count, info.name);
    }
    unsigned char *all = malloc((size_t)world * REC);
    size_t *bytes = malloc((size_t)world * sizeof *bytes);
    if (!all || !bytes) {
        free(all);
        free(bytes);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    for (int r = 0; r < world; r++) bytes[r] = REC;
    memcpy(all + (size_t)rank * REC, mine, REC);
    int rc = comm_allgatherv(c, all + (size_t)rank * REC, all, bytes, err);
    free(bytes);
    if (rc) {
        free(all);
        return rc;
    }
    s->usable = 1;
    for (int r = 0; r < world && s->usable; r++) {
        if (!all[(size_t)r * REC]) {
            s->usable = 0;
            if (r == rank) snprintf(s->why, sizeof s->why, "%s", perr.msg);
            else snprintf(s->why, sizeof s->why, "rank %d has no usable GPU", r);
        }
        for (int q = 0; q < r && s->usable; q++) {
            if (!memcmp(all + (size_t)r * REC + 1, all + (size_t)q * REC + 1, 16)) {
                s->usable = 0;
                snprintf(s->why, sizeof s->why,
                         "ranks %d and %d would share one GPU, and NCCL needs a GPU per rank (start at most as many "
                         "ranks per node as there are GPUs)", q, r);
            }
        }
    }
    free(all);
    s->probed = 1;
    return 0;
}

int stage_on_gpu(fsdp_ctx *ctx, int *on_gpu, fsdp_err *err) {
    *on_gpu = 0;
    const char *want = fsdp_arg_str(fsdp_ctx_section(ctx, "runtime"), "device", "auto");
    if (!strcmp(want, "cpu")) return 0;
    stage_dev_slot *s = slot_get(ctx, err);
    if (!s) return err->code;
    int rc;
    if (!s->probed && (rc = probe(ctx, s, err))) return rc;
    if (!strcmp(want, "cuda")) {
        if (!s->usable) return fsdp_err_set(err, FSDP_E_DEVICE, "runtime.device is cuda, but %s", s->why);
        *on_gpu = 1;
        return 0;
    }
    if (strcmp(want, "auto"))
        return fsdp_err_set(err, FSDP_E_INVALID, "runtime.device: '%s' is not auto, cpu or cuda", want);
    if (!s->told_auto) {
        s->told_auto = 1;
        if (s->usable) fsdp_log(ctx, FSDP_LOG_INFO, "runtime.device auto: cuda (%s)", s->gpu);
        else { /* expected on a machine without a GPU: no alarming driver message at the default level */
            fsdp_log(ctx, FSDP_LOG_INFO, "runtime.device auto: cpu (no usable GPU here)");
            fsdp_log(ctx, FSDP_LOG_DEBUG, "runtime.device auto: why no GPU: %s", s->why);
        }
    }
    *on_gpu = s->usable;
    return 0;
}

int stage_device(fsdp_ctx *ctx, dev_ctx **out, fsdp_err *err) {
    *out = NULL;
    stage_dev_slot *s = slot_get(ctx, err);
    if (!s) return err->code;
    if (s->dev) {
        *out = s->dev;
        return 0;
    }
    comm *c = stage_comm(ctx);
    if (!c) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    dev_options o = {.local_rank = local_rank_of(c), .blas_workspace_bytes = 0};
    dev_ctx *d = dev_ctx_create(&o, err);
    int rc = d ? 0 : (err->code ? err->code : FSDP_E_DEVICE);
    /* every rank learns whether all have a device before the collective NCCL setup */
    int who = -1;
    fsdp_err e2;
    int agreed = comm_agree(c, rc, &who, &e2);
    if (!rc && agreed) rc = fsdp_err_set(err, agreed, "rank %d could not create its device context", who);
    if (rc) {
        dev_ctx_free(d);
        return fsdp_err_prefix(err, "runtime.device cuda");
    }
    s->dev = d;
    fsdp_log(ctx, FSDP_LOG_INFO, "device: GPU %d (%s, %.1f GiB)", dev_ctx_ordinal(d), dev_ctx_name(d),
             (double)dev_ctx_total_mem(d) / (1 << 30));
    *out = d;
    /* the ranks' collectives on the GPU: set up now when there are several ranks */
    if (comm_size(c) > 1 && (rc = stage_device_nccl(ctx, err))) return rc;
    return 0;
}

int stage_device_nccl(fsdp_ctx *ctx, fsdp_err *err) {
    comm *c = stage_comm(ctx);
    if (!c) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (comm_dev_ready(c)) return 0;
    stage_dev_slot *s = slot_get(ctx, err);
    if (!s) return err->code;
    dev_ctx *d = s->dev;
    int rc;
    if (!d && (rc = stage_device(ctx, &d, err))) return rc;
    if (comm_dev_ready(c)) return 0; /* stage_device set it up */
    /* on this rank's GPU (the calling thread's current device) */
    if ((rc = dev_ctx_bind(d, err)) || (rc = comm_dev_init(c, err)))
        return fsdp_err_prefix(err, "runtime.device cuda: NCCL communicator");
    fsdp_log(ctx, FSDP_LOG_INFO, "device collectives: %s over %d rank%s", comm_dev_backend(c), comm_size(c),
             comm_size(c) > 1 ? "s" : "");
    return 0;
}

int stage_place_state(fsdp_ctx *ctx, fsdp_state *s, int *on_gpu, fsdp_err *err) {
    int gpu = 0;
    int rc = stage_on_gpu(ctx, &gpu, err);
    if (rc) return rc;
    if (on_gpu) *on_gpu = gpu;
    if (gpu && s->layout == STATE_SHARDED) {
        dev_ctx *d;
        if ((rc = stage_device(ctx, &d, err))) return rc;
        return state_to_device(s, d, err);
    }
    return state_to_host(s, err);
}

/* ---- parameters materialised on the GPU -------------------------------------------------------- */

/* x = bf16(x) in place on the device, through a bf16 buffer of at most `chunk` values. */
static int round_bf16_dev(dev_ctx *d, float *x, int64_t n, fsdp_err *err) {
    const int64_t chunk = (int64_t)1 << 24;
    void *tmp;
    int64_t m = n < chunk ? n : chunk;
    int rc = dev_alloc(d, (size_t)(m ? m : 1) * 2, &tmp, err);
    if (rc) return rc;
    kcu_stream st = dev_ctx_stream(d, DEV_STREAM_COMPUTE);
    for (int64_t off = 0; off < n && !rc; off += chunk) {
        int64_t k = n - off < chunk ? n - off : chunk;
        rc = kcu_cast(tmp, FSDP_DT_BF16, x + off, FSDP_DT_F32, k, st, err);
        if (!rc) rc = kcu_cast(x + off, FSDP_DT_F32, tmp, FSDP_DT_BF16, k, st, err);
    }
    fsdp_err e2;
    dev_free(d, tmp, &e2); /* stream-ordered after the casts */
    return rc;
}

/* x = f16(x) in place through the host (kcu_cast has no f16 path): download, round, upload. */
static int round_f16_host(fsdp_state *s, state_param *sp, fsdp_err *err) {
    float *h;
    int rc = state_param_map(s, sp, STATE_DATA, &h, err);
    if (rc) return rc;
    size_t n = state_param_local_numel(sp);
    for (size_t k = 0; k < n; k++) h[k] = fsdp_f16_to_f32(fsdp_f32_to_f16(h[k]));
    return state_param_unmap(s, sp, STATE_DATA, h, 1, err);
}

/* A fixed-table rule (sincos_2d) on the GPU: its local rows computed on the host, the bits of the host
 * path (the device's sin / cos could differ by an ulp), rounded to the dtype and uploaded. */
static int fixed_table_dev(fsdp_state *s, state_param *sp, const mt_param *p, fsdp_err *err) {
    size_t n = state_param_local_numel(sp);
    float *h = malloc((n ? n : 1) * sizeof *h);
    if (!h) return fsdp_err_set(err, FSDP_E_NOMEM, "init %s: out of memory for %zu values", sp->name, n);
    init_job j;
    memset(&j, 0, sizeof j);
    int rc = mt_param_init_job(p, &j, err);
    j.e0 = sp->row0 * sp->row_numel;
    j.n = (int64_t)n;
    j.f32 = h;
    j.dtype = sp->dtype;
    if (!rc) rc = init_fill_jobs(&j, 1, 0, "init", err);
    if (!rc) rc = state_param_put(s, sp, STATE_DATA, h, err);
    free(h);
    return rc;
}

/* The rule's padding row (nn.Embedding's padding_idx) within this rank's rows: zeros, after the draw on the
 * compute stream. */
static int zero_row_dev(dev_ctx *d, state_param *sp, const mt_param *p, fsdp_err *err) {
    int64_t z0, z1, e0 = sp->row0 * sp->row_numel, e1 = e0 + (int64_t)state_param_local_numel(sp);
    char what[MT_NAME_MAX + 32];
    snprintf(what, sizeof what, "init of %s", p->name);
    int rc = init_rule_zero_range(&p->init, p->ndim, p->shape, e0, e1, what, &z0, &z1, err);
    if (rc || z0 >= z1) return rc;
    return dev_memset0(d, (float *)sp->d_data + (z0 - e0), (size_t)(z1 - z0) * sizeof(float), DEV_STREAM_COMPUTE, err);
}

int stage_init_values_dev(fsdp_state *s, dev_ctx *d, uint64_t seed, fsdp_dtype over, fsdp_err *err) {
    const mt_table *t = s->model;
    if (!t || t->n != s->n) return fsdp_err_set(err, FSDP_E_INVALID, "init (cuda): the state has no model table");
    int rc = state_attach_device(s, d, err);
    kcu_stream st = dev_ctx_stream(d, DEV_STREAM_COMPUTE);
    for (size_t i = 0; i < s->n && !rc; i++) {
        state_param *sp = &s->p[i];
        const mt_param *p = &t->p[i];
        sp->dtype = over ? over : sp->dtype;
        sp->no_value = p->init.kind == INIT_NONE;
        /* the host rows were never touched: they are dropped, not copied */
        if ((rc = state_param_alloc(s, sp, STATE_DATA, STATE_DEVICE, 0, err))) break;
        if (sp->rows == 0 || (!sp->no_value && init_rule_is_fixed(&p->init))) continue; /* tables: below */
        rng_dist dist;
        if (sp->no_value) rng_dist_const(&dist, NAN);
        else if ((rc = mt_param_dist(p, &dist, err))) break;
        int64_t n = (int64_t)state_param_local_numel(sp);
        if ((rc = kcu_init_fill(sp->d_data, &dist, seed, init_stream(p->name), (uint64_t)(sp->row0 * sp->row_numel), n,
                                st, err)))
            fsdp_err_prefix(err, "init %s on the GPU", sp->name);
        if (!rc && !sp->no_value) rc = zero_row_dev(d, sp, p, err);
    }
    if (!rc) rc = dev_sync(d, err);
    for (size_t i = 0; i < s->n && !rc; i++)
        if (s->p[i].rows > 0 && !s->p[i].no_value && init_rule_is_fixed(&t->p[i].init))
            rc = fixed_table_dev(s, &s->p[i], &t->p[i], err);
    for (size_t i = 0; i < s->n && !rc; i++) {
        state_param *sp = &s->p[i];
        if (sp->no_value) continue;
        if (sp->dtype == FSDP_DT_BF16) rc = round_bf16_dev(d, sp->d_data, (int64_t)state_param_local_numel(sp), err);
        else if (sp->dtype == FSDP_DT_F16) rc = round_f16_host(s, sp, err);
    }
    if (!rc) rc = dev_stream_sync(d, DEV_STREAM_COMPUTE, err);
    return rc;
}
