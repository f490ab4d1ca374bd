/* The mixture-of-experts feed-forward on the CPU (kc_moe.h): routing, the stable sort of (token, k)
 * pairs by expert, one GEMM group per expert, and their backward. */
#include "kernels/cpu/kc_moe.h"

#include <math.h>
#include <string.h>

/* Every array starts on a 64-byte boundary of the arena. */
static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

static size_t carve(float *base, size_t *off, size_t n, void **out) {
    if (base) *out = base + *off;
    *off += round16(n);
    return *off;
}

static size_t acts_layout(const kc_moe_dims *m, float *base, kc_moe_acts *a) {
    kc_moe_acts dummy;
    if (!a) a = &dummy;
    const size_t n = (size_t)m->n, nk = n * (size_t)m->K, E = (size_t)m->E;
    size_t off = 0;
    carve(base, &off, n * E, (void **)&a->probs);
    carve(base, &off, nk, (void **)&a->top);
    carve(base, &off, nk, (void **)&a->topw);
    carve(base, &off, nk, (void **)&a->slot_of);
    carve(base, &off, nk, (void **)&a->pair_of);
    carve(base, &off, E + 1, (void **)&a->offsets);
    carve(base, &off, nk * (size_t)m->d, (void **)&a->xs);
    carve(base, &off, nk * (size_t)m->F, (void **)&a->a);
    carve(base, &off, nk * (size_t)m->F, (void **)&a->b);
    carve(base, &off, nk * (size_t)m->F, (void **)&a->g);
    return carve(base, &off, nk * (size_t)m->d, (void **)&a->y);
}

static size_t scratch_layout(const kc_moe_dims *m, float *base, kc_moe_scratch *s) {
    kc_moe_scratch dummy;
    if (!s) s = &dummy;
    const size_t nk = (size_t)m->n * (size_t)m->K;
    size_t off = 0;
    carve(base, &off, nk * (size_t)m->d, (void **)&s->dys);
    carve(base, &off, nk * (size_t)m->F, (void **)&s->dg);
    carve(base, &off, nk * (size_t)m->F, (void **)&s->da);
    carve(base, &off, nk * (size_t)m->F, (void **)&s->db);
    carve(base, &off, nk * (size_t)m->d, (void **)&s->dxs);
    return carve(base, &off, (size_t)m->n * (size_t)m->E, (void **)&s->dp);
}

size_t kc_moe_acts_floats(const kc_moe_dims *m) { return acts_layout(m, NULL, NULL); }
size_t kc_moe_scratch_floats(const kc_moe_dims *m) { return scratch_layout(m, NULL, NULL); }
void kc_moe_acts_bind(const kc_moe_dims *m, float *base, kc_moe_acts *a) { acts_layout(m, base, a); }
void kc_moe_scratch_bind(const kc_moe_dims *m, float *base, kc_moe_scratch *s) { scratch_layout(m, base, s); }

static int check_dims(const kc_moe_dims *m, const char *what, fsdp_err *err) {
    if (!m || m->n < 0 || m->d < 1 || m->F < 1 || m->E < 1 || m->K < 1 || m->K > m->E)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: %d tokens, width %d, %d experts of width %d, top-%d is not a "
                            "valid mixture of experts (1 <= top-k <= experts)", what, m ? m->n : -1, m ? m->d : -1,
                            m ? m->E : -1, m ? m->F : -1, m ? m->K : -1);
    return FSDP_OK;
}

/* Token t's softmax over its logits (in p, in place) and its top-K; 0 when a logit is not finite. */
static int route_token(const kc_moe_dims *m, float *p, int32_t *top, float *topw) {
    const int E = m->E, K = m->K;
    float mx = p[0];
    for (int e = 0; e < E; e++) {
        if (!isfinite(p[e])) return 0;
        if (p[e] > mx) mx = p[e];
    }
    float sum = 0.0f;
    for (int e = 0; e < E; e++) sum += (p[e] = expf(p[e] - mx));
    for (int e = 0; e < E; e++) p[e] /= sum;
    /* insertion of each expert into the running top-K: a strictly larger value goes first, so equal
     * values keep the lower expert first */
    int kn = 0;
    for (int e = 0; e < E; e++) {
        int pos = kn < K ? kn : K;
        while (pos > 0 && p[e] > topw[pos - 1]) pos--;
        if (pos >= K) continue;
        for (int j = (kn < K ? kn : K - 1); j > pos; j--) {
            top[j] = top[j - 1];
            topw[j] = topw[j - 1];
        }
        top[pos] = e;
        topw[pos] = p[e];
        if (kn < K) kn++;
    }
    if (m->norm_topk) {
        float s = 0.0f;
        for (int k = 0; k < K; k++) s += topw[k];
        for (int k = 0; k < K; k++) topw[k] /= s;
    }
    return 1;
}

/* The stable counting sort of the pairs t*K+k by expert (offsets[e] doubles as expert e's cursor and
 * is restored after). */
static void sort_pairs(const kc_moe_dims *m, kc_moe_acts *a) {
    const int E = m->E, nk = m->n * m->K;
    memset(a->offsets, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int i = 0; i < nk; i++) a->offsets[a->top[i] + 1]++;
    for (int e = 0; e < E; e++) a->offsets[e + 1] += a->offsets[e];
    for (int i = 0; i < nk; i++) {
        int s = a->offsets[a->top[i]]++;
        a->slot_of[i] = s;
        a->pair_of[s] = i;
    }
    for (int e = E; e > 0; e--) a->offsets[e] = a->offsets[e - 1];
    a->offsets[0] = 0;
}

int kc_moe_forward(const kc_moe_dims *m, const float *x, const float *router, const float *w1, const float *w2,
                   const float *w3, kc_moe_acts *a, float *out, kc_stats *st, fsdp_err *err) {
    int rc = check_dims(m, "mixture of experts (forward)", err);
    if (rc) return rc;
    const int n = m->n, d = m->d, F = m->F, E = m->E, K = m->K;
    if (n == 0) return FSDP_OK;
    kc_linear_forward(x, router, a->probs, n, d, E, st);
    int bad = -1;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++)
        if (!route_token(m, a->probs + (size_t)t * E, a->top + (size_t)t * K, a->topw + (size_t)t * K)) {
#pragma omp critical
            if (bad < 0 || t < bad) bad = t;
        }
    if (bad >= 0)
        return fsdp_err_set(err, FSDP_E_NUMERIC, "mixture of experts: token %d has a router logit that is not finite "
                            "(NaN or infinity in the layer's input or gate weight)", bad);
    sort_pairs(m, a);
    const int nk = n * K;
#pragma omp parallel for schedule(static)
    for (int s = 0; s < nk; s++)
        memcpy(a->xs + (size_t)s * d, x + (size_t)(a->pair_of[s] / K) * d, (size_t)d * sizeof(float));
    for (int e = 0; e < E; e++) {
        const int s0 = a->offsets[e], ne = a->offsets[e + 1] - s0;
        if (!ne) continue;
        const size_t wf = (size_t)e * F * d;
        kc_linear_forward(a->xs + (size_t)s0 * d, w1 + wf, a->a + (size_t)s0 * F, ne, d, F, st);
        kc_linear_forward(a->xs + (size_t)s0 * d, w3 + wf, a->b + (size_t)s0 * F, ne, d, F, st);
        kc_swiglu_forward(a->a + (size_t)s0 * F, a->b + (size_t)s0 * F, a->g + (size_t)s0 * F, (int64_t)ne * F);
        kc_linear_forward(a->g + (size_t)s0 * F, w2 + wf, a->y + (size_t)s0 * d, ne, F, d, st);
    }
    /* combine: each token sums its K weighted outputs in k order */
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++) {
        float *o = out + (size_t)t * d;
        for (int j = 0; j < d; j++) o[j] = 0.0f;
        for (int k = 0; k < K; k++) {
            const float w = a->topw[(size_t)t * K + k];
            const float *y = a->y + (size_t)a->slot_of[(size_t)t * K + k] * d;
            for (int j = 0; j < d; j++) o[j] += w * y[j];
        }
    }
    return FSDP_OK;
}

void kc_moe_stats(const kc_moe_dims *m, const kc_moe_acts *a, double *counts, double *psum) {
    for (int e = 0; e < m->E; e++) counts[e] += (double)(a->offsets[e + 1] - a->offsets[e]);
    for (int t = 0; t < m->n; t++)
        for (int e = 0; e < m->E; e++) psum[e] += (double)a->probs[(size_t)t * m->E + e];
}

double kc_moe_aux(int E, const double *counts, const double *psum, double rows, double scale, float *dp_aux) {
    double aux = 0.0;
    if (rows <= 0) {
        for (int e = 0; dp_aux && e < E; e++) dp_aux[e] = 0.0f;
        return 0.0;
    }
    for (int e = 0; e < E; e++) {
        aux += (counts[e] / rows) * (psum[e] / rows);
        if (dp_aux) dp_aux[e] = (float)(scale * (double)E * counts[e] / (rows * rows));
    }
    return (double)E * aux;
}

/* dL/dp of token t into dp[E] (from the routing weights' gradients dw[K] and the aux term), then the
 * softmax backward in place: dp becomes dL/dlogits. */
static void router_token_backward(const kc_moe_dims *m, const float *p, const int32_t *top, const float *topw,
                                  const float *dw, const float *dp_aux, float *dp) {
    const int E = m->E, K = m->K;
    for (int e = 0; e < E; e++) dp[e] = dp_aux ? dp_aux[e] : 0.0f;
    if (m->norm_topk) {
        /* w_k = p_k / S: dp_j = (dw_j - sum_k dw_k w_k) / S */
        float S = 0.0f, dot = 0.0f;
        for (int k = 0; k < K; k++) {
            S += p[top[k]];
            dot += dw[k] * topw[k];
        }
        for (int k = 0; k < K; k++) dp[top[k]] += (dw[k] - dot) / S;
    } else {
        for (int k = 0; k < K; k++) dp[top[k]] += dw[k];
    }
    float dot = 0.0f;
    for (int e = 0; e < E; e++) dot += p[e] * dp[e];
    for (int e = 0; e < E; e++) dp[e] = p[e] * (dp[e] - dot);
}

int kc_moe_backward(const kc_moe_dims *m, const float *dout, const float *x, const float *router, const float *w1,
                    const float *w2, const float *w3, const kc_moe_acts *a, const float *dp_aux, kc_moe_scratch *s,
                    float *dx, float *drouter, float *dw1, float *dw2, float *dw3, kc_stats *st, fsdp_err *err) {
    int rc = check_dims(m, "mixture of experts (backward)", err);
    if (rc) return rc;
    const int n = m->n, d = m->d, F = m->F, E = m->E, K = m->K;
    if (n == 0) return FSDP_OK;
    /* dy of each slot = its weight x dout of its token; the weights' gradients dw = dout . y go to dp */
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++) {
        const float *go = dout + (size_t)t * d;
        float dw[K];
        for (int k = 0; k < K; k++) {
            const int sl = a->slot_of[(size_t)t * K + k];
            const float w = a->topw[(size_t)t * K + k], *y = a->y + (size_t)sl * d;
            float *dy = s->dys + (size_t)sl * d, acc = 0.0f;
            for (int j = 0; j < d; j++) {
                dy[j] = w * go[j];
                acc += go[j] * y[j];
            }
            dw[k] = acc;
        }
        router_token_backward(m, a->probs + (size_t)t * E, a->top + (size_t)t * K, a->topw + (size_t)t * K, dw,
                              dp_aux, s->dp + (size_t)t * E);
    }
    for (int e = 0; e < E; e++) {
        const int s0 = a->offsets[e], ne = a->offsets[e + 1] - s0;
        if (!ne) continue;
        const size_t wf = (size_t)e * F * d, sd = (size_t)s0 * d, sf = (size_t)s0 * F;
        kc_linear_backward_input(s->dys + sd, w2 + wf, s->dg + sf, ne, F, d, 0.0f, st);
        kc_linear_backward_weight(s->dys + sd, a->g + sf, dw2 + wf, ne, F, d, st);
        kc_swiglu_backward(a->a + sf, a->b + sf, s->dg + sf, s->da + sf, s->db + sf, (int64_t)ne * F);
        kc_linear_backward_input(s->da + sf, w1 + wf, s->dxs + sd, ne, d, F, 0.0f, st);
        kc_linear_backward_input(s->db + sf, w3 + wf, s->dxs + sd, ne, d, F, 1.0f, st);
        kc_linear_backward_weight(s->da + sf, a->xs + sd, dw1 + wf, ne, d, F, st);
        kc_linear_backward_weight(s->db + sf, a->xs + sd, dw3 + wf, ne, d, F, st);
    }
    /* dx = the router's input gradient, then each token's K expert input gradients in k order */
    kc_linear_backward_input(s->dp, router, dx, n, d, E, 0.0f, st);
    kc_linear_backward_weight(s->dp, x, drouter, n, d, E, st);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++) {
        float *o = dx + (size_t)t * d;
        for (int k = 0; k < K; k++) {
            const float *g = s->dxs + (size_t)a->slot_of[(size_t)t * K + k] * d;
            for (int j = 0; j < d; j++) o[j] += g[j];
        }
    }
    return FSDP_OK;
}
