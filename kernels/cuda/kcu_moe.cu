// Mixture-of-experts kernels (kernels/cpu/kc_moe.h on the GPU): the router's softmax and top-K, the
// stable counting sort of the (token, k) pairs by expert, the gather of input rows into slot order,
// the weighted combine back to tokens and their backwards, the router backward and the routing
// statistics. The per-expert GEMMs are cuBLASLt calls made by the caller (decoder/decoder_moe_cuda.c).
// Nothing here uses atomics on float data: every sum has a fixed order, so results are deterministic.
#include "kernels/cuda/kcu_common.cuh"

#define KCU_MOE_THREADS 256
#define KCU_MOE_WARPS 4 // warps (tokens) per block of the per-token kernels
#define KCU_MOE_CHUNK KCU_MOE_SORT_CHUNK // (token, k) pairs per thread of the counting sort

// Checks shared by the host wrappers.
static inline int moe_check(const char *what, int64_t n, int E, int K, fsdp_err *err) {
    if (n < 0 || E < 1 || E > KCU_MOE_MAX_EXPERTS || K < 1 || K > E || n > INT32_MAX / K)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: bad sizes (n %lld, E %d, K %d; 1 <= K <= E <= %d)", what,
                            (long long)n, E, K, KCU_MOE_MAX_EXPERTS);
    return FSDP_OK;
}

// ---- router: softmax and top-K --------------------------------------------------------------------

// *d_bad = min(*d_bad, 1 + row) where 0 means none yet: the lowest bad row, whatever the block order.
__device__ __forceinline__ void moe_set_bad_min(int *d_bad, int64_t row) {
    if (!d_bad) return;
    const int v = row < 0x7ffffffe ? (int)(row + 1) : 0x7fffffff;
    int old = *(volatile int *)d_bad;
    while (old == 0 || old > v) {
        const int prev = atomicCAS(d_bad, old, v);
        if (prev == old) break;
        old = prev;
    }
}

// One warp per token. probs = softmax(logits) (max subtracted, float); top-K by repeated warp arg-max
// over the experts not taken yet, equal probabilities resolved to the lower expert; topw the chosen
// probabilities, divided by their sum (added in k order) when norm. A row with a non-finite logit gets
// probs 0, top 0..K-1, topw 0 (in range for what follows) and is reported through d_bad.
__global__ void moe_route_kernel(const float *logits, int64_t n, int E, int K, int norm, float *probs, int32_t *top,
                                 float *topw, int *d_bad) {
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= n) return; // the whole warp leaves together
    const float *l = logits + t * E;
    float *p = probs + t * E;
    int32_t *tp = top + t * K;
    float *tw = topw + t * K;
    int finite = 1;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) {
        const float v = l[e];
        finite &= isfinite(v) ? 1 : 0;
        mx = fmaxf(mx, v);
    }
    if (!__all_sync(KCU_FULL_MASK, finite)) {
        for (int e = lane; e < E; e += 32) p[e] = 0.0f;
        for (int k = lane; k < K; k += 32) {
            tp[k] = k;
            tw[k] = 0.0f;
        }
        if (lane == 0) moe_set_bad_min(d_bad, t);
        return;
    }
    mx = kcu_warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) {
        const float v = expf(__fsub_rn(l[e], mx));
        p[e] = v;
        sum = __fadd_rn(sum, v);
    }
    sum = kcu_warp_sum(sum);
    for (int e = lane; e < E; e += 32) p[e] = __fdiv_rn(p[e], sum);
    // top-K: lane holds experts lane, lane+32, ...; bit i of `taken` is expert lane + 32 i
    uint32_t taken = 0;
    float wsum = 0.0f;
    for (int k = 0; k < K; k++) {
        float bv = -1.0f; // below every probability: an untaken expert always wins
        int be = INT32_MAX;
        for (int e = lane, i = 0; e < E; e += 32, i++)
            if (!(taken >> i & 1u) && p[e] > bv) { // increasing e, strict >: the lower expert on ties
                bv = p[e];
                be = e;
            }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(KCU_FULL_MASK, bv, o);
            const int oe = __shfl_xor_sync(KCU_FULL_MASK, be, o);
            if (ov > bv || (ov == bv && oe < be)) {
                bv = ov;
                be = oe;
            }
        }
        if ((be & 31) == lane) taken |= 1u << (be >> 5);
        if (lane == 0) {
            tp[k] = be;
            tw[k] = bv;
        }
        wsum = __fadd_rn(wsum, bv);
    }
    if (norm) {
        __syncwarp(); // lane 0 wrote tw
        for (int k = lane; k < K; k += 32) tw[k] = __fdiv_rn(tw[k], wsum);
    }
}

KCU_API int kcu_moe_route(const float *logits, int64_t n, int E, int K, int norm_topk, float *probs, int32_t *top,
                          float *topw, int *d_bad, kcu_stream stream, fsdp_err *err) {
    if (moe_check("kcu_moe_route", n, E, K, err)) return FSDP_E_INVALID;
    if (n == 0) return FSDP_OK;
    const int64_t blocks = (n + KCU_MOE_WARPS - 1) / KCU_MOE_WARPS;
    KCU_LAUNCH(moe_route_kernel, (unsigned)blocks, 32 * KCU_MOE_WARPS, 0, stream)(logits, n, E, K, norm_topk != 0,
                                                                                  probs, top, topw, d_bad);
    return kcu_launch_check(err, "kcu_moe_route");
}

// ---- stable counting sort of the pairs by expert --------------------------------------------------

// Thread c counts the experts of pairs [c*CHUNK, (c+1)*CHUNK) into hist[c, :] (a bad expert is
// counted nowhere and flagged).
__global__ void moe_hist_kernel(const int32_t *top, int64_t nK, int E, int64_t chunks, int32_t *hist, int *d_bad) {
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < chunks; c += (int64_t)gridDim.x * blockDim.x) {
        int32_t *h = hist + c * E;
        for (int e = 0; e < E; e++) h[e] = 0;
        const int64_t end = (c + 1) * KCU_MOE_CHUNK < nK ? (c + 1) * KCU_MOE_CHUNK : nK;
        for (int64_t p = c * KCU_MOE_CHUNK; p < end; p++) {
            const int32_t e = top[p];
            if (e >= 0 && e < E) h[e]++;
            else kcu_set_bad(d_bad, p);
        }
    }
}

// One block: hist[c, e] becomes the number of pairs of expert e in the chunks before c; offsets[e]
// the exclusive prefix sum of the expert totals, offsets[E] the number of pairs sorted.
__global__ void moe_scan_kernel(int32_t *hist, int64_t chunks, int E, int32_t *offsets) {
    KCU_SHARED(int32_t, tot, KCU_MOE_MAX_EXPERTS);
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t run = 0;
        for (int64_t c = 0; c < chunks; c++) {
            const int32_t v = hist[c * E + e];
            hist[c * E + e] = run;
            run += v;
        }
        tot[e] = run;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t run = 0;
        for (int e = 0; e < E; e++) {
            offsets[e] = run;
            run += tot[e];
        }
        offsets[E] = run;
    }
}

// Thread c places its chunk's pairs in order: slot = offsets[e] + pairs of e before it.
__global__ void moe_place_kernel(const int32_t *top, int64_t nK, int E, int64_t chunks, int32_t *hist,
                                 const int32_t *offsets, int32_t *slot_of, int32_t *pair_of) {
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < chunks; c += (int64_t)gridDim.x * blockDim.x) {
        int32_t *h = hist + c * E;
        const int64_t end = (c + 1) * KCU_MOE_CHUNK < nK ? (c + 1) * KCU_MOE_CHUNK : nK;
        for (int64_t p = c * KCU_MOE_CHUNK; p < end; p++) {
            const int32_t e = top[p];
            if (e < 0 || e >= E) {
                slot_of[p] = -1;
                continue;
            }
            const int32_t s = offsets[e] + h[e]++;
            slot_of[p] = s;
            pair_of[s] = (int32_t)p;
        }
    }
}

KCU_API int kcu_moe_sort(const int32_t *top, int64_t n, int E, int K, int32_t *offsets, int32_t *slot_of,
                         int32_t *pair_of, int32_t *scratch, int *d_bad, kcu_stream stream, fsdp_err *err) {
    if (moe_check("kcu_moe_sort", n, E, K, err)) return FSDP_E_INVALID;
    const int64_t nK = n * K, chunks = (nK + KCU_MOE_CHUNK - 1) / KCU_MOE_CHUNK;
    if (chunks > 0) {
        KCU_LAUNCH(moe_hist_kernel, kcu_blocks(chunks, KCU_MOE_THREADS), KCU_MOE_THREADS, 0, stream)(
            top, nK, E, chunks, scratch, d_bad);
        if (kcu_launch_check(err, "kcu_moe_sort (histogram)")) return FSDP_E_DEVICE;
    }
    KCU_LAUNCH(moe_scan_kernel, 1, KCU_MOE_THREADS, 0, stream)(scratch, chunks, E, offsets);
    if (kcu_launch_check(err, "kcu_moe_sort (scan)")) return FSDP_E_DEVICE;
    if (chunks == 0) return FSDP_OK;
    KCU_LAUNCH(moe_place_kernel, kcu_blocks(chunks, KCU_MOE_THREADS), KCU_MOE_THREADS, 0, stream)(
        top, nK, E, chunks, scratch, offsets, slot_of, pair_of);
    return kcu_launch_check(err, "kcu_moe_sort (place)");
}

// ---- gather and combine ------------------------------------------------------------------------------

template <class T>
__global__ void moe_gather_kernel(const T *x, const int32_t *pair_of, int64_t rows, int K, int d, T *xs) {
    const int64_t total = rows * d;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t s = i / d, j = i % d;
        const int64_t t = pair_of[s] / K;
        xs[i] = x[t * d + j];
    }
}

KCU_API int kcu_moe_gather(fsdp_dtype dt, const void *x, const int32_t *pair_of, int64_t n, int K, int d, void *xs,
                           kcu_stream stream, fsdp_err *err) {
    if (kcu_check_dt(dt, "kcu_moe_gather", err)) return FSDP_E_INVALID;
    if (n < 0 || K < 1 || d < 1 || n > INT32_MAX / K)
        return fsdp_err_set(err, FSDP_E_INVALID, "kcu_moe_gather: bad sizes (n %lld, K %d, d %d)", (long long)n, K, d);
    const int64_t rows = n * K;
    if (rows == 0) return FSDP_OK;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(moe_gather_kernel<T>, kcu_blocks(rows * d, KCU_MOE_THREADS), KCU_MOE_THREADS, 0, stream)(
                     (const T *)x, pair_of, rows, K, d, (T *)xs));
    return kcu_launch_check(err, "kcu_moe_gather");
}

// out[t, j] = (accumulate ? out[t, j] : 0) + the sum over k (in k order) of w[t, k] * ys[slot_of[t*K + k], j];
// w NULL: weight 1.
template <class T>
__global__ void moe_combine_kernel(const T *ys, const float *w, const int32_t *slot_of, int64_t n, int K, int d,
                                   int accumulate, T *out) {
    const int64_t total = n * d;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / d, j = i % d;
        float acc = accumulate ? kcu_ld(out, (size_t)i) : 0.0f;
        for (int k = 0; k < K; k++) {
            const float v = kcu_ld(ys, (size_t)slot_of[t * K + k] * d + j);
            acc = __fadd_rn(acc, w ? __fmul_rn(w[t * K + k], v) : v);
        }
        kcu_st(out, (size_t)i, acc);
    }
}

KCU_API int kcu_moe_combine(fsdp_dtype dt, const void *ys, const float *w, const int32_t *slot_of, int64_t n, int K,
                            int d, int accumulate, void *out, kcu_stream stream, fsdp_err *err) {
    if (kcu_check_dt(dt, "kcu_moe_combine", err)) return FSDP_E_INVALID;
    if (n < 0 || K < 1 || d < 1 || n > INT32_MAX / K)
        return fsdp_err_set(err, FSDP_E_INVALID, "kcu_moe_combine: bad sizes (n %lld, K %d, d %d)", (long long)n, K, d);
    if (n == 0) return FSDP_OK;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(moe_combine_kernel<T>, kcu_blocks(n * d, KCU_MOE_THREADS), KCU_MOE_THREADS, 0, stream)(
                     (const T *)ys, w, slot_of, n, K, d, accumulate != 0, (T *)out));
    return kcu_launch_check(err, "kcu_moe_combine");
}

// One block per pair p = t*K + k with slot s: dys[s, :] = w[p] * dout[t, :] and
// dw[p] = dout[t, :] . ys[s, :] (float, block-reduction order).
template <class T>
__global__ void moe_combine_bwd_kernel(const T *dout, const T *ys, const float *w, const int32_t *slot_of, int64_t nK,
                                       int K, int d, T *dys, float *dw) {
    KCU_SHARED(float, sh, 32);
    for (int64_t p = blockIdx.x; p < nK; p += gridDim.x) {
        const int64_t t = p / K, s = slot_of[p];
        const float wp = w[p];
        float acc = 0.0f;
        for (int j = threadIdx.x; j < d; j += blockDim.x) {
            const float go = kcu_ld(dout, (size_t)(t * d + j));
            kcu_st(dys, (size_t)(s * d + j), __fmul_rn(wp, go));
            acc = __fadd_rn(acc, __fmul_rn(go, kcu_ld(ys, (size_t)(s * d + j))));
        }
        acc = kcu_block_sum(acc, sh);
        if (threadIdx.x == 0) dw[p] = acc;
    }
}

KCU_API int kcu_moe_combine_backward(fsdp_dtype dt, const void *dout, const void *ys, const float *w,
                                     const int32_t *slot_of, int64_t n, int K, int d, void *dys, float *dw,
                                     kcu_stream stream, fsdp_err *err) {
    if (kcu_check_dt(dt, "kcu_moe_combine_backward", err)) return FSDP_E_INVALID;
    if (n < 0 || K < 1 || d < 1 || n > INT32_MAX / K)
        return fsdp_err_set(err, FSDP_E_INVALID, "kcu_moe_combine_backward: bad sizes (n %lld, K %d, d %d)",
                            (long long)n, K, d);
    const int64_t nK = n * K;
    if (nK == 0) return FSDP_OK;
    const int threads = d >= 256 ? 256 : d > 64 ? 128 : 32;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(moe_combine_bwd_kernel<T>, kcu_blocks(nK, 1, 1u << 20), threads, 0, stream)(
                     (const T *)dout, (const T *)ys, w, slot_of, nK, K, d, (T *)dys, dw));
    return kcu_launch_check(err, "kcu_moe_combine_backward");
}

// ---- router backward -----------------------------------------------------------------------------------

// One warp per token. dp[t, e] = dp_aux[e] (0 without) plus, for a chosen expert e = top[t, k],
// dtopw[t, k] (without renormalisation) or (dtopw[t, k] - sum_j dtopw[t, j] topw[t, j]) / S with
// S = sum_j probs[t, top[t, j]] (with it); then the softmax backward
// dlogits[t, e] = probs[t, e] * (dp[t, e] - sum_e' probs[t, e'] dp[t, e']).
__global__ void moe_router_bwd_kernel(const float *probs, const int32_t *top, const float *topw, const float *dtopw,
                                      const float *dp_aux, int64_t n, int E, int K, int norm, float *dp,
                                      float *dlogits) {
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= n) return;
    const float *p = probs + t * E;
    const int32_t *tp = top + t * K;
    const float *tw = topw + t * K, *dtw = dtopw + t * K;
    float *g = dp + t * E, *dl = dlogits + t * E;
    for (int e = lane; e < E; e += 32) g[e] = dp_aux ? dp_aux[e] : 0.0f;
    float S = 1.0f, c = 0.0f;
    if (norm) { // every lane adds the same values in the same order
        S = 0.0f;
        for (int k = 0; k < K; k++) {
            S = __fadd_rn(S, p[tp[k]]);
            c = __fadd_rn(c, __fmul_rn(dtw[k], tw[k]));
        }
    }
    __syncwarp();
    for (int k = lane; k < K; k += 32) { // distinct experts: no two lanes write one element
        const int e = tp[k];
        const float v = norm ? __fdiv_rn(__fsub_rn(dtw[k], c), S) : dtw[k];
        g[e] = __fadd_rn(g[e], v);
    }
    __syncwarp();
    float dot = 0.0f;
    for (int e = lane; e < E; e += 32) dot = __fadd_rn(dot, __fmul_rn(p[e], g[e]));
    dot = kcu_warp_sum(dot);
    for (int e = lane; e < E; e += 32) dl[e] = __fmul_rn(p[e], __fsub_rn(g[e], dot));
}

KCU_API int kcu_moe_router_backward(const float *probs, const int32_t *top, const float *topw, const float *dtopw,
                                    const float *dp_aux, int64_t n, int E, int K, int norm_topk, float *dp,
                                    float *dlogits, kcu_stream stream, fsdp_err *err) {
    if (moe_check("kcu_moe_router_backward", n, E, K, err)) return FSDP_E_INVALID;
    if (n == 0) return FSDP_OK;
    const int64_t blocks = (n + KCU_MOE_WARPS - 1) / KCU_MOE_WARPS;
    KCU_LAUNCH(moe_router_bwd_kernel, (unsigned)blocks, 32 * KCU_MOE_WARPS, 0, stream)(
        probs, top, topw, dtopw, dp_aux, n, E, K, norm_topk != 0, dp, dlogits);
    return kcu_launch_check(err, "kcu_moe_router_backward");
}

// ---- routing statistics ----------------------------------------------------------------------------------

// Thread e: counts[e] += offsets[e+1] - offsets[e]; psum[e] += probs[t, e] for t in token order, in double.
__global__ void moe_stats_kernel(const float *probs, const int32_t *offsets, int64_t n, int E, double *counts,
                                 double *psum) {
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < E; e += gridDim.x * blockDim.x) {
        double s = psum[e]; // kc_moe_stats' additions, in its order
        for (int64_t t = 0; t < n; t++) s = __dadd_rn(s, (double)probs[t * E + e]);
        counts[e] = __dadd_rn(counts[e], (double)(offsets[e + 1] - offsets[e]));
        psum[e] = s;
    }
}

KCU_API int kcu_moe_stats(const float *probs, const int32_t *offsets, int64_t n, int E, double *counts, double *psum,
                          kcu_stream stream, fsdp_err *err) {
    if (moe_check("kcu_moe_stats", n, E, 1, err)) return FSDP_E_INVALID;
    KCU_LAUNCH(moe_stats_kernel, kcu_blocks(E, 128), 128, 0, stream)(probs, offsets, n, E, counts, psum);
    return kcu_launch_check(err, "kcu_moe_stats");
}
