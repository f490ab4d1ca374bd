/* The mixture-of-experts feed-forward on the GPU (decoder/decoder_moe_cuda.h): router GEMM, kcu_moe_route,
 * kcu_moe_sort, one host copy of the expert offsets, gather, per-expert cuBLASLt GEMMs around SwiGLU,
 * weighted combine; the backward in reverse with the router's softmax backward and GEMMs. */
#include "decoder/decoder_moe_cuda.h"

#include <string.h>

#include "kernels/cuda/kcu.h"
#include "runtime/device_gemm.h"

/* Stops at the first failing call, prefixing where it happened. */
#define TRY(call, ...)                                                         \
    do {                                                                       \
        int try_rc_ = (call);                                                  \
        if (try_rc_) return err ? fsdp_err_prefix(err, __VA_ARGS__) : try_rc_; \
    } while (0)

/* Returns a failure that already says where it happened. */
#define RET(call)                      \
    do {                               \
        int ret_rc_ = (call);          \
        if (ret_rc_) return ret_rc_;   \
    } while (0)

#define MOE_ALIGN 256

static int dims_ok(const kc_moe_dims *m, fsdp_dtype dt) {
    if (!m || (dt != FSDP_DT_F32 && dt != FSDP_DT_BF16)) return 0;
    if (m->n < 0 || m->d < 1 || m->F < 1 || m->E < 1 || m->E > KCU_MOE_MAX_EXPERTS || m->K < 1 || m->K > m->E)
        return 0;
    if (m->n > INT32_MAX / m->K) return 0;
    const int64_t nK = (int64_t)m->n * m->K;
    return nK <= INT32_MAX / m->d && nK <= INT32_MAX / m->F && (int64_t)m->E * m->F <= INT64_MAX / m->d;
}

static int check(const kc_moe_dims *m, fsdp_dtype dt, const char *what, fsdp_err *err) {
    if (dims_ok(m, dt)) return FSDP_OK;
    if (!m) return fsdp_err_set(err, FSDP_E_INVALID, "%s: no dims", what);
    return fsdp_err_set(err, FSDP_E_INVALID,
                        "%s: bad dims or dtype (n %d, d %d, F %d, E %d, K %d, %s; 1 <= K <= E <= %d, f32 or bf16)", what,
                        m->n, m->d, m->F, m->E, m->K, fsdp_dtype_name(dt), KCU_MOE_MAX_EXPERTS);
}

/* A bump allocator over a base pointer (NULL base: only counts). */
typedef struct moe_carve {
    char *base;
    size_t off;
} moe_carve;

static void *carve(moe_carve *c, size_t bytes) {
    void *p = c->base ? c->base + c->off : NULL;
    c->off += (bytes + MOE_ALIGN - 1) / MOE_ALIGN * MOE_ALIGN;
    return p;
}

static void acts_layout(const kc_moe_dims *m, fsdp_dtype dt, moe_carve *c, decoder_moe_cuda_acts *a) {
    const size_t n = (size_t)m->n, E = (size_t)m->E, K = (size_t)m->K, nK = n * K, es = fsdp_dtype_size(dt);
    a->logits = carve(c, n * E * sizeof(float));
    a->probs = carve(c, n * E * sizeof(float));
    a->top = carve(c, nK * sizeof(int32_t));
    a->topw = carve(c, nK * sizeof(float));
    a->slot_of = carve(c, nK * sizeof(int32_t));
    a->pair_of = carve(c, nK * sizeof(int32_t));
    a->offsets = carve(c, (E + 2) * sizeof(int32_t));
    a->sort_scratch = carve(c, kcu_moe_sort_scratch_ints(m->n, m->E, m->K) * sizeof(int32_t));
    a->xs = carve(c, nK * (size_t)m->d * es);
    a->a = carve(c, nK * (size_t)m->F * es);
    a->b = carve(c, nK * (size_t)m->F * es);
    a->g = carve(c, nK * (size_t)m->F * es);
    a->y = carve(c, nK * (size_t)m->d * es);
}

static void scratch_layout(const kc_moe_dims *m, fsdp_dtype dt, moe_carve *c, decoder_moe_cuda_scratch *s) {
    const size_t n = (size_t)m->n, E = (size_t)m->E, nK = n * (size_t)m->K, es = fsdp_dtype_size(dt);
    s->dys = carve(c, nK * (size_t)m->d * es);
    s->dg = carve(c, nK * (size_t)m->F * es);
    s->da = carve(c, nK * (size_t)m->F * es);
    s->db = carve(c, nK * (size_t)m->F * es);
    s->dxs = carve(c, nK * (size_t)m->d * es);
    s->dtopw = carve(c, nK * sizeof(float));
    s->dp = carve(c, n * E * sizeof(float));
    s->dlogits = carve(c, n * E * sizeof(float));
    s->dlogits_dt = dt == FSDP_DT_F32 ? (void *)s->dlogits : carve(c, n * E * es);
}

size_t decoder_moe_cuda_acts_bytes(const kc_moe_dims *m, fsdp_dtype dt) {
    if (!dims_ok(m, dt)) return 0;
    moe_carve c = {NULL, 0};
    decoder_moe_cuda_acts a;
    acts_layout(m, dt, &c, &a);
    return c.off;
}

size_t decoder_moe_cuda_scratch_bytes(const kc_moe_dims *m, fsdp_dtype dt) {
    if (!dims_ok(m, dt)) return 0;
    moe_carve c = {NULL, 0};
    decoder_moe_cuda_scratch s;
    scratch_layout(m, dt, &c, &s);
    return c.off;
}

int decoder_moe_cuda_acts_bind(const kc_moe_dims *m, fsdp_dtype dt, void *dev_base, int32_t *host_offsets,
                               decoder_moe_cuda_acts *a, fsdp_err *err) {
    RET(check(m, dt, "decoder (cuda) moe: activations", err));
    if (!dev_base || !host_offsets || !a)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) moe: activations: no memory to bind");
    moe_carve c = {dev_base, 0};
    acts_layout(m, dt, &c, a);
    a->host_offsets = host_offsets;
    memset(host_offsets, 0, ((size_t)m->E + 2) * sizeof(int32_t));
    return FSDP_OK;
}

int decoder_moe_cuda_scratch_bind(const kc_moe_dims *m, fsdp_dtype dt, void *dev_base, decoder_moe_cuda_scratch *s,
                                  fsdp_err *err) {
    RET(check(m, dt, "decoder (cuda) moe: scratch", err));
    if (!dev_base || !s) return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) moe: scratch: no memory to bind");
    moe_carve c = {dev_base, 0};
    scratch_layout(m, dt, &c, s);
    return FSDP_OK;
}

/* Element e*stride of a dtype-dt array. */
static const void *at_c(const void *p, size_t i, size_t es) { return (const char *)p + i * es; }
static void *at(void *p, size_t i, size_t es) { return (char *)p + i * es; }

int decoder_moe_cuda_experts_forward(dev_ctx *dc, fsdp_dtype dt, int d, int F, int n_experts, const int32_t *off,
                                     const void *xs, const void *w1, const void *w2, const void *w3, void *a, void *b,
                                     void *g, void *y, fsdp_err *err) {
    const size_t es = fsdp_dtype_size(dt), rows = (size_t)off[n_experts];
    for (int e = 0; e < n_experts; e++) {
        const int r = off[e + 1] - off[e];
        if (r == 0) continue;
        const size_t o = (size_t)off[e], we = (size_t)e * F * d;
        TRY(dev_linear_forward(dc, dt, at_c(xs, o * d, es), at_c(w1, we, es), at(a, o * F, es), r, d, F, err),
            "decoder (cuda) moe forward: expert %d w1", e);
        TRY(dev_linear_forward(dc, dt, at_c(xs, o * d, es), at_c(w3, we, es), at(b, o * F, es), r, d, F, err),
            "decoder (cuda) moe forward: expert %d w3", e);
    }
    if (rows)
        TRY(kcu_swiglu_forward(dt, a, b, g, (int64_t)(rows * F), dev_ctx_stream(dc, DEV_STREAM_COMPUTE), err),
            "decoder (cuda) moe forward: swiglu");
    for (int e = 0; e < n_experts; e++) {
        const int r = off[e + 1] - off[e];
        if (r == 0) continue;
        const size_t o = (size_t)off[e], we = (size_t)e * d * F;
        TRY(dev_linear_forward(dc, dt, at_c(g, o * F, es), at_c(w2, we, es), at(y, o * d, es), r, F, d, err),
            "decoder (cuda) moe forward: expert %d w2", e);
    }
    return FSDP_OK;
}

/* The expert GEMMs of the forward on the activations' slots (every expert). */
static int experts_forward(dev_ctx *dc, fsdp_dtype dt, const kc_moe_dims *m, const void *w1, const void *w2,
                           const void *w3, decoder_moe_cuda_acts *a, fsdp_err *err) {
    return decoder_moe_cuda_experts_forward(dc, dt, m->d, m->F, m->E, a->host_offsets, a->xs, w1, w2, w3, a->a, a->b,
                                            a->g, a->y, err);
}

int decoder_moe_cuda_route(dev_ctx *dc, fsdp_dtype dt, const kc_moe_dims *m, const void *x, const void *router,
                           decoder_moe_cuda_acts *a, fsdp_err *err) {
    RET(check(m, dt, "decoder (cuda) moe forward", err));
    if (!dc || !a || !a->host_offsets)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) moe forward: no device or activations");
    const int n = m->n, d = m->d, E = m->E, K = m->K;
    memset(a->host_offsets, 0, ((size_t)E + 2) * sizeof(int32_t));
    if (n == 0) return FSDP_OK;
    kcu_stream s = dev_ctx_stream(dc, DEV_STREAM_COMPUTE);
    /* logits [n,E] = x router^T, float32 output for either storage dtype */
    TRY(dev_gemm(dc, 0, 1, n, E, d, 1.0f, dt, x, d, router, d, 0.0f, FSDP_DT_F32, a->logits, E, err),
        "decoder (cuda) moe forward: router");
    int *bad = (int *)(a->offsets + E + 1);
    TRY(dev_memset0(dc, bad, sizeof(int), DEV_STREAM_COMPUTE, err), "decoder (cuda) moe forward");
    TRY(kcu_moe_route(a->logits, n, E, K, m->norm_topk, a->probs, a->top, a->topw, bad, s, err),
        "decoder (cuda) moe forward");
    TRY(kcu_moe_sort(a->top, n, E, K, a->offsets, a->slot_of, a->pair_of, a->sort_scratch, NULL, s, err),
        "decoder (cuda) moe forward");
    /* the one synchronisation: expert counts (and the bad-row flag) to the host for the GEMM launches */
    TRY(dev_download(dc, a->host_offsets, a->offsets, ((size_t)E + 2) * sizeof(int32_t), err),
        "decoder (cuda) moe forward: expert offsets to the host");
    const int32_t flag = a->host_offsets[E + 1];
    if (flag != 0) /* kc_moe_forward's error */
        return fsdp_err_set(err, FSDP_E_NUMERIC,
                            "decoder (cuda) moe forward: token %d has a router logit that is not finite (NaN or infinity "
                            "in the layer's input or gate weight)",
                            (int)flag - 1);
    if (a->host_offsets[E] != n * K)
        return fsdp_err_set(err, FSDP_E_DEVICE, "decoder (cuda) moe forward: %d of %d routed pairs sorted",
                            (int)a->host_offsets[E], n * K);
    TRY(kcu_moe_gather(dt, x, a->pair_of, n, K, d, a->xs, s, err), "decoder (cuda) moe forward");
    return FSDP_OK;
}

int decoder_moe_cuda_forward(dev_ctx *dc, fsdp_dtype dt, const kc_moe_dims *m, const void *x, const void *router,
                             const void *w1, const void *w2, const void *w3, decoder_moe_cuda_acts *a, void *out,
                             fsdp_err *err) {
    RET(decoder_moe_cuda_route(dc, dt, m, x, router, a, err));
    if (m->n == 0) return FSDP_OK;
    RET(experts_forward(dc, dt, m, w1, w2, w3, a, err));
    TRY(kcu_moe_combine(dt, a->y, a->topw, a->slot_of, m->n, m->K, m->d, 0, out, dev_ctx_stream(dc, DEV_STREAM_COMPUTE),
                        err),
        "decoder (cuda) moe forward");
    return FSDP_OK;
}

int decoder_moe_cuda_stats(dev_ctx *dc, const kc_moe_dims *m, const decoder_moe_cuda_acts *a, double *d_counts,
                           double *d_psum, fsdp_err *err) {
    RET(check(m, FSDP_DT_F32, "decoder (cuda) moe stats", err));
    if (!dc || !a) return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) moe stats: no device or activations");
    TRY(kcu_moe_stats(a->probs, a->offsets, m->n, m->E, d_counts, d_psum, dev_ctx_stream(dc, DEV_STREAM_COMPUTE), err),
        "decoder (cuda) moe stats");
    return FSDP_OK;
}

int decoder_moe_cuda_experts_backward(dev_ctx *dc, fsdp_dtype dt, int d, int F, int n_experts, const int32_t *off,
                                      const void *dys, const void *xs, const void *w1, const void *w2, const void *w3,
                                      const void *a, const void *b, const void *g, void *dg, void *dda, void *ddb,
                                      void *dxs, float *dw1, float *dw2, float *dw3, fsdp_err *err) {
    const size_t es = fsdp_dtype_size(dt), rows = (size_t)off[n_experts];
    for (int e = 0; e < n_experts; e++) {
        const int r = off[e + 1] - off[e];
        if (r == 0) continue;
        const size_t o = (size_t)off[e], we = (size_t)e * d * F;
        TRY(dev_linear_backward_input(dc, dt, at_c(dys, o * d, es), at_c(w2, we, es), at(dg, o * F, es), r, F, d, 0.0f,
                                      err),
            "decoder (cuda) moe backward: expert %d w2", e);
        TRY(dev_linear_backward_weight(dc, dt, at_c(dys, o * d, es), at_c(g, o * F, es), dw2 + we, r, F, d, err),
            "decoder (cuda) moe backward: expert %d w2", e);
    }
    if (rows)
        TRY(kcu_swiglu_backward(dt, a, b, dg, dda, ddb, (int64_t)(rows * F), dev_ctx_stream(dc, DEV_STREAM_COMPUTE), err),
            "decoder (cuda) moe backward: swiglu");
    for (int e = 0; e < n_experts; e++) {
        const int r = off[e + 1] - off[e];
        if (r == 0) continue;
        const size_t o = (size_t)off[e], we = (size_t)e * F * d;
        const void *da = at_c(dda, o * F, es), *db = at_c(ddb, o * F, es), *x = at_c(xs, o * d, es);
        void *dx = at(dxs, o * d, es);
        TRY(dev_linear_backward_input(dc, dt, da, at_c(w1, we, es), dx, r, d, F, 0.0f, err),
            "decoder (cuda) moe backward: expert %d w1", e);
        TRY(dev_linear_backward_input(dc, dt, db, at_c(w3, we, es), dx, r, d, F, 1.0f, err),
            "decoder (cuda) moe backward: expert %d w3", e);
        TRY(dev_linear_backward_weight(dc, dt, da, x, dw1 + we, r, d, F, err), "decoder (cuda) moe backward: expert %d w1",
            e);
        TRY(dev_linear_backward_weight(dc, dt, db, x, dw3 + we, r, d, F, err), "decoder (cuda) moe backward: expert %d w3",
            e);
    }
    return FSDP_OK;
}

/* The expert GEMMs of the backward on the activations' slots (every expert). */
static int experts_backward(dev_ctx *dc, fsdp_dtype dt, const kc_moe_dims *m, const void *w1, const void *w2,
                            const void *w3, const decoder_moe_cuda_acts *a, decoder_moe_cuda_scratch *s, float *dw1,
                            float *dw2, float *dw3, fsdp_err *err) {
    return decoder_moe_cuda_experts_backward(dc, dt, m->d, m->F, m->E, a->host_offsets, s->dys, a->xs, w1, w2, w3, a->a,
                                             a->b, a->g, s->dg, s->da, s->db, s->dxs, dw1, dw2, dw3, err);
}

int decoder_moe_cuda_backward_router(dev_ctx *dc, fsdp_dtype dt, const kc_moe_dims *m, const void *dout,
                                     const void *x, const void *router, const decoder_moe_cuda_acts *a,
                                     const float *d_dp_aux, decoder_moe_cuda_scratch *s, void *dx, float *drouter,
                                     fsdp_err *err) {
    RET(check(m, dt, "decoder (cuda) moe backward", err));
    if (!dc || !a || !a->host_offsets || !s)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) moe backward: no device, activations or scratch");
    const int n = m->n, d = m->d, E = m->E, K = m->K;
    if (n == 0) return FSDP_OK;
    if (a->host_offsets[E] != n * K || a->host_offsets[E + 1] != 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) moe backward: the activations hold no forward of %d tokens",
                            n);
    kcu_stream st = dev_ctx_stream(dc, DEV_STREAM_COMPUTE);
    TRY(kcu_moe_combine_backward(dt, dout, a->y, a->topw, a->slot_of, n, K, d, s->dys, s->dtopw, st, err),
        "decoder (cuda) moe backward");
    /* kc_moe_backward's order: the router's gradients, dx = dlogits router, then each token's K expert input
     * gradients added in k order */
    TRY(kcu_moe_router_backward(a->probs, a->top, a->topw, s->dtopw, d_dp_aux, n, E, K, m->norm_topk, s->dp,
                                s->dlogits, st, err),
        "decoder (cuda) moe backward");
    if (dt != FSDP_DT_F32)
        TRY(kcu_cast(s->dlogits_dt, dt, s->dlogits, FSDP_DT_F32, (int64_t)n * E, st, err),
            "decoder (cuda) moe backward: router gradient");
    TRY(dev_linear_backward_input(dc, dt, s->dlogits_dt, router, dx, n, d, E, 0.0f, err),
        "decoder (cuda) moe backward: router dx");
    TRY(dev_linear_backward_weight(dc, dt, s->dlogits_dt, x, drouter, n, d, E, err), "decoder (cuda) moe backward: router");
    return FSDP_OK;
}

int decoder_moe_cuda_backward(dev_ctx *dc, fsdp_dtype dt, const kc_moe_dims *m, const void *dout, const void *x,
                              const void *router, const void *w1, const void *w2, const void *w3,
                              const decoder_moe_cuda_acts *a, const float *d_dp_aux, decoder_moe_cuda_scratch *s,
                              void *dx, float *drouter, float *dw1, float *dw2, float *dw3, fsdp_err *err) {
    RET(decoder_moe_cuda_backward_router(dc, dt, m, dout, x, router, a, d_dp_aux, s, dx, drouter, err));
    if (m->n == 0) return FSDP_OK;
    RET(experts_backward(dc, dt, m, w1, w2, w3, a, s, dw1, dw2, dw3, err));
    TRY(kcu_moe_combine(dt, s->dxs, NULL, a->slot_of, m->n, m->K, m->d, 1, dx, dev_ctx_stream(dc, DEV_STREAM_COMPUTE),
                        err),
        "decoder (cuda) moe backward: dx");
    return FSDP_OK;
}
