// Fused causal attention with grouped KV heads (FlashAttention-style), float32 arithmetic on
// float32 or bf16 storage.
//
// Tiles: a block owns AT_BR = 16 rows (4 warps x 4 rows); the other side is walked in tiles of
// AT_BC = 32 columns, one per lane, staged in shared memory as float.
//
// Forward (grid: query tiles x H x B): for each key tile up to the block's last query, lane j
// computes the scores of its key against the warp's 4 query rows, the warp keeps each row's running
// max m and sum l (online softmax), and o += p v with each lane owning head dims lane + 32 t.
// Writes out = o / l and lse = m + log(l); nothing of size T x T exists.
//
// Backward, with D_i = dO_i . O_i (attn_bwd_dot) and P recomputed as exp(s / sqrt(hd) - lse):
//   dS = P * (dP - D) / sqrt(hd), dP = dO V^T
//   dQ = dS K        (attn_bwd_dq: grid like the forward, lanes walk the keys)
//   dK = dS^T Q, dV = P^T dO   (attn_bwd_dkdv: a block owns 16 keys of one kv head and walks every
//                    query tile at or after them, for every query head of the group; lanes walk queries)
// so dK and dV need no atomics and every output is overwritten.
//
// kcu_attention_forward/backward send bf16 with head_dim 64 or 128 (16-byte aligned tensors) to the
// tensor-core kernels of kcu_attention_tc.cu instead; the *_impl entry points force either one.
#include "kernels/cuda/kcu_attention_tc.cuh"
#include "kernels/cuda/kcu_common.cuh"

#include <math.h>

#define AT_WARPS 4
#define AT_RPW 4
#define AT_BR (AT_WARPS * AT_RPW)
#define AT_BC 32
#define AT_THREADS (AT_WARPS * 32)

// ---- forward ----------------------------------------------------------------------------------------

template <class T, int DPL>
__global__ void __launch_bounds__(AT_THREADS)
    attn_fwd(const T *q, const T *k, const T *v, T *out, float *lse, int Tn, int H, int KV, int hd, float sq) {
    KCU_DYN_SHARED(float, sm);
    float *Qs = sm;                    // [AT_BR][hd]
    float *Ks = Qs + AT_BR * hd;       // [AT_BC][hd + 1]
    float *Vs = Ks + AT_BC * (hd + 1); // [AT_BC][hd]
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * AT_BR;
    const int kvh = h / (H / KV);
    const size_t ldq = (size_t)H * hd, ldk = (size_t)KV * hd;
    const T *qb = q + (size_t)b * Tn * ldq + (size_t)h * hd;
    const T *kb = k + (size_t)b * Tn * ldk + (size_t)kvh * hd;
    const T *vb = v + (size_t)b * Tn * ldk + (size_t)kvh * hd;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    for (int e = tid; e < AT_BR * hd; e += AT_THREADS) {
        const int r = e / hd, d = e - r * hd, t = q0 + r;
        Qs[e] = t < Tn ? kcu_ld(qb, (size_t)t * ldq + d) : 0.0f;
    }
    float m[AT_RPW], l[AT_RPW], o[AT_RPW][DPL];
KCU_UNROLL
    for (int rr = 0; rr < AT_RPW; rr++) {
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
KCU_UNROLL
        for (int t = 0; t < DPL; t++) o[rr][t] = 0.0f;
    }
    const float *qr = Qs + warp * AT_RPW * hd;
    const int rlast = min(q0 + AT_BR, Tn) - 1;
    for (int k0 = 0; k0 <= rlast; k0 += AT_BC) {
        __syncthreads(); // the previous tile is consumed (and Qs is written on the first pass)
        for (int e = tid; e < AT_BC * hd; e += AT_THREADS) {
            const int r = e / hd, d = e - r * hd, t = k0 + r;
            float kv = 0.0f, vv = 0.0f;
            if (t < Tn) {
                kv = kcu_ld(kb, (size_t)t * ldk + d);
                vv = kcu_ld(vb, (size_t)t * ldk + d);
            }
            Ks[r * (hd + 1) + d] = kv;
            Vs[r * hd + d] = vv;
        }
        __syncthreads();
        const int kj = k0 + lane;
        const float *kr = Ks + lane * (hd + 1);
        float s[AT_RPW];
KCU_UNROLL
        for (int rr = 0; rr < AT_RPW; rr++) s[rr] = 0.0f;
        for (int d = 0; d < hd; d++) {
            const float kd = kr[d];
KCU_UNROLL
            for (int rr = 0; rr < AT_RPW; rr++) s[rr] = fmaf(qr[rr * hd + d], kd, s[rr]);
        }
        float p[AT_RPW];
KCU_UNROLL
        for (int rr = 0; rr < AT_RPW; rr++) {
            const int i = q0 + warp * AT_RPW + rr;
            const bool ok = kj <= i;
            const float sv = ok ? s[rr] / sq : -INFINITY;
            // finite: key 0 <= i lies in the first tile, so every row has a score after it
            const float mnew = fmaxf(m[rr], kcu_warp_max(sv));
            p[rr] = ok ? expf(sv - mnew) : 0.0f;
            const float alpha = expf(m[rr] - mnew); // 0 on the first tile (m = -inf)
            l[rr] = l[rr] * alpha + kcu_warp_sum(p[rr]);
KCU_UNROLL
            for (int t = 0; t < DPL; t++) o[rr][t] *= alpha;
            m[rr] = mnew;
        }
        for (int j = 0; j < AT_BC; j++) {
            float vv[DPL];
KCU_UNROLL
            for (int t = 0; t < DPL; t++) {
                const int d = lane + 32 * t;
                vv[t] = d < hd ? Vs[j * hd + d] : 0.0f;
            }
KCU_UNROLL
            for (int rr = 0; rr < AT_RPW; rr++) {
                const float pj = __shfl_sync(KCU_FULL_MASK, p[rr], j);
KCU_UNROLL
                for (int t = 0; t < DPL; t++) o[rr][t] = fmaf(pj, vv[t], o[rr][t]);
            }
        }
    }
    T *ob = out + (size_t)b * Tn * ldq + (size_t)h * hd;
KCU_UNROLL
    for (int rr = 0; rr < AT_RPW; rr++) {
        const int i = q0 + warp * AT_RPW + rr;
        if (i >= Tn) continue;
        const float inv = 1.0f / l[rr];
KCU_UNROLL
        for (int t = 0; t < DPL; t++) {
            const int d = lane + 32 * t;
            if (d < hd) kcu_st(ob, (size_t)i * ldq + d, o[rr][t] * inv);
        }
        if (lane == 0) lse[((size_t)b * H + h) * Tn + i] = m[rr] + logf(l[rr]);
    }
}

// ---- backward: D = rowwise dO . O ------------------------------------------------------------------

template <class T>
__global__ void attn_bwd_dot(const T *out, const T *dout, float *D, int64_t rows, int Tn, int H, int hd) {
    const int lane = threadIdx.x & 31;
    const int64_t step = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < rows; w += step) {
        const size_t off = (size_t)w * hd; // row w = (b*T + t)*H + h of [B,T,H,hd]
        float s = 0.0f;
        for (int d = lane; d < hd; d += 32) s += kcu_ld(dout, off + d) * kcu_ld(out, off + d);
        s = kcu_warp_sum(s);
        if (lane == 0) {
            const int64_t bt = w / H;
            const int h = (int)(w - bt * H);
            const int64_t b = bt / Tn;
            const int t = (int)(bt - b * Tn);
            D[((size_t)b * H + h) * Tn + t] = s;
        }
    }
}

// ---- backward: dQ --------------------------------------------------------------------------------------

template <class T, int DPL>
__global__ void __launch_bounds__(AT_THREADS)
    attn_bwd_dq(const T *q, const T *k, const T *v, const float *lse, const float *D, const T *dout, T *dq, int Tn,
                int H, int KV, int hd, float sq) {
    KCU_DYN_SHARED(float, sm);
    float *Qs = sm;                     // [AT_BR][hd]
    float *dOs = Qs + AT_BR * hd;       // [AT_BR][hd]
    float *Ks = dOs + AT_BR * hd;       // [AT_BC][hd + 1]
    float *Vs = Ks + AT_BC * (hd + 1);  // [AT_BC][hd + 1]
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * AT_BR;
    const int kvh = h / (H / KV);
    const size_t ldq = (size_t)H * hd, ldk = (size_t)KV * hd;
    const size_t qoff = (size_t)b * Tn * ldq + (size_t)h * hd;
    const T *kb = k + (size_t)b * Tn * ldk + (size_t)kvh * hd;
    const T *vb = v + (size_t)b * Tn * ldk + (size_t)kvh * hd;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    for (int e = tid; e < AT_BR * hd; e += AT_THREADS) {
        const int r = e / hd, d = e - r * hd, t = q0 + r;
        const bool in = t < Tn;
        Qs[e] = in ? kcu_ld(q, qoff + (size_t)t * ldq + d) : 0.0f;
        dOs[e] = in ? kcu_ld(dout, qoff + (size_t)t * ldq + d) : 0.0f;
    }
    float li[AT_RPW], Di[AT_RPW], acc[AT_RPW][DPL];
KCU_UNROLL
    for (int rr = 0; rr < AT_RPW; rr++) {
        const int i = q0 + warp * AT_RPW + rr;
        const size_t at = ((size_t)b * H + h) * Tn + i;
        li[rr] = i < Tn ? lse[at] : 0.0f;
        Di[rr] = i < Tn ? D[at] : 0.0f;
KCU_UNROLL
        for (int t = 0; t < DPL; t++) acc[rr][t] = 0.0f;
    }
    const float *qr = Qs + warp * AT_RPW * hd, *dor = dOs + warp * AT_RPW * hd;
    const int rlast = min(q0 + AT_BR, Tn) - 1;
    for (int k0 = 0; k0 <= rlast; k0 += AT_BC) {
        __syncthreads();
        for (int e = tid; e < AT_BC * hd; e += AT_THREADS) {
            const int r = e / hd, d = e - r * hd, t = k0 + r;
            float kv = 0.0f, vv = 0.0f;
            if (t < Tn) {
                kv = kcu_ld(kb, (size_t)t * ldk + d);
                vv = kcu_ld(vb, (size_t)t * ldk + d);
            }
            Ks[r * (hd + 1) + d] = kv;
            Vs[r * (hd + 1) + d] = vv;
        }
        __syncthreads();
        const int kj = k0 + lane;
        const float *kr = Ks + lane * (hd + 1), *vr = Vs + lane * (hd + 1);
        float s[AT_RPW], dp[AT_RPW];
KCU_UNROLL
        for (int rr = 0; rr < AT_RPW; rr++) s[rr] = dp[rr] = 0.0f;
        for (int d = 0; d < hd; d++) {
            const float kd = kr[d], vd = vr[d];
KCU_UNROLL
            for (int rr = 0; rr < AT_RPW; rr++) {
                s[rr] = fmaf(qr[rr * hd + d], kd, s[rr]);
                dp[rr] = fmaf(dor[rr * hd + d], vd, dp[rr]);
            }
        }
        float ds[AT_RPW];
KCU_UNROLL
        for (int rr = 0; rr < AT_RPW; rr++) {
            const int i = q0 + warp * AT_RPW + rr;
            const bool ok = kj <= i && i < Tn;
            const float p = ok ? expf(s[rr] / sq - li[rr]) : 0.0f;
            ds[rr] = p * (dp[rr] - Di[rr]) / sq;
        }
        for (int j = 0; j < AT_BC; j++) {
            float kv[DPL];
KCU_UNROLL
            for (int t = 0; t < DPL; t++) {
                const int d = lane + 32 * t;
                kv[t] = d < hd ? Ks[j * (hd + 1) + d] : 0.0f;
            }
KCU_UNROLL
            for (int rr = 0; rr < AT_RPW; rr++) {
                const float dsj = __shfl_sync(KCU_FULL_MASK, ds[rr], j);
KCU_UNROLL
                for (int t = 0; t < DPL; t++) acc[rr][t] = fmaf(dsj, kv[t], acc[rr][t]);
            }
        }
    }
KCU_UNROLL
    for (int rr = 0; rr < AT_RPW; rr++) {
        const int i = q0 + warp * AT_RPW + rr;
        if (i >= Tn) continue;
KCU_UNROLL
        for (int t = 0; t < DPL; t++) {
            const int d = lane + 32 * t;
            if (d < hd) kcu_st(dq, qoff + (size_t)i * ldq + d, acc[rr][t]);
        }
    }
}

// ---- backward: dK and dV ---------------------------------------------------------------------------------

template <class T, int DPL>
__global__ void __launch_bounds__(AT_THREADS)
    attn_bwd_dkdv(const T *q, const T *k, const T *v, const float *lse, const float *D, const T *dout, T *dk, T *dv,
                  int Tn, int H, int KV, int hd, float sq) {
    KCU_DYN_SHARED(float, sm);
    float *Ks = sm;                      // [AT_BR][hd]
    float *Vs = Ks + AT_BR * hd;         // [AT_BR][hd]
    float *Qs = Vs + AT_BR * hd;         // [AT_BC][hd + 1]
    float *dOs = Qs + AT_BC * (hd + 1);  // [AT_BC][hd + 1]
    float *Ls = dOs + AT_BC * (hd + 1);  // [AT_BC]
    float *Ds = Ls + AT_BC;              // [AT_BC]
    const int b = blockIdx.z, kvh = blockIdx.y, k0 = blockIdx.x * AT_BR;
    const int rep = H / KV;
    const size_t ldq = (size_t)H * hd, ldk = (size_t)KV * hd;
    const size_t koff = (size_t)b * Tn * ldk + (size_t)kvh * hd;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    for (int e = tid; e < AT_BR * hd; e += AT_THREADS) {
        const int r = e / hd, d = e - r * hd, t = k0 + r;
        const bool in = t < Tn;
        Ks[e] = in ? kcu_ld(k, koff + (size_t)t * ldk + d) : 0.0f;
        Vs[e] = in ? kcu_ld(v, koff + (size_t)t * ldk + d) : 0.0f;
    }
    float acc_k[AT_RPW][DPL], acc_v[AT_RPW][DPL];
KCU_UNROLL
    for (int rr = 0; rr < AT_RPW; rr++)
KCU_UNROLL
        for (int t = 0; t < DPL; t++) acc_k[rr][t] = acc_v[rr][t] = 0.0f;
    const float *kr = Ks + warp * AT_RPW * hd, *vr = Vs + warp * AT_RPW * hd;
    for (int g = 0; g < rep; g++) {
        const int h = kvh * rep + g;
        const size_t qoff = (size_t)b * Tn * ldq + (size_t)h * hd;
        const size_t loff = ((size_t)b * H + h) * Tn;
        for (int i0 = (k0 / AT_BC) * AT_BC; i0 < Tn; i0 += AT_BC) {
            __syncthreads(); // the previous query tile is consumed (and Ks/Vs are written on the first pass)
            for (int e = tid; e < AT_BC * hd; e += AT_THREADS) {
                const int r = e / hd, d = e - r * hd, t = i0 + r;
                const bool in = t < Tn;
                Qs[r * (hd + 1) + d] = in ? kcu_ld(q, qoff + (size_t)t * ldq + d) : 0.0f;
                dOs[r * (hd + 1) + d] = in ? kcu_ld(dout, qoff + (size_t)t * ldq + d) : 0.0f;
            }
            if (tid < AT_BC) {
                const int t = i0 + tid;
                Ls[tid] = t < Tn ? lse[loff + t] : 0.0f;
                Ds[tid] = t < Tn ? D[loff + t] : 0.0f;
            }
            __syncthreads();
            const int i = i0 + lane;
            const float *qrow = Qs + lane * (hd + 1), *dorow = dOs + lane * (hd + 1);
            float s[AT_RPW], dp[AT_RPW];
KCU_UNROLL
            for (int rr = 0; rr < AT_RPW; rr++) s[rr] = dp[rr] = 0.0f;
            for (int d = 0; d < hd; d++) {
                const float qd = qrow[d], dd = dorow[d];
KCU_UNROLL
                for (int rr = 0; rr < AT_RPW; rr++) {
                    s[rr] = fmaf(qd, kr[rr * hd + d], s[rr]);
                    dp[rr] = fmaf(dd, vr[rr * hd + d], dp[rr]);
                }
            }
            float p[AT_RPW], ds[AT_RPW];
            const float li = Ls[lane], Di = Ds[lane];
KCU_UNROLL
            for (int rr = 0; rr < AT_RPW; rr++) {
                const int j = k0 + warp * AT_RPW + rr;
                const bool ok = i >= j && i < Tn && j < Tn;
                p[rr] = ok ? expf(s[rr] / sq - li) : 0.0f;
                ds[rr] = p[rr] * (dp[rr] - Di) / sq;
            }
            for (int ii = 0; ii < AT_BC; ii++) {
                float qv[DPL], dov[DPL];
KCU_UNROLL
                for (int t = 0; t < DPL; t++) {
                    const int d = lane + 32 * t;
                    qv[t] = d < hd ? Qs[ii * (hd + 1) + d] : 0.0f;
                    dov[t] = d < hd ? dOs[ii * (hd + 1) + d] : 0.0f;
                }
KCU_UNROLL
                for (int rr = 0; rr < AT_RPW; rr++) {
                    const float pi = __shfl_sync(KCU_FULL_MASK, p[rr], ii);
                    const float dsi = __shfl_sync(KCU_FULL_MASK, ds[rr], ii);
KCU_UNROLL
                    for (int t = 0; t < DPL; t++) {
                        acc_v[rr][t] = fmaf(pi, dov[t], acc_v[rr][t]);
                        acc_k[rr][t] = fmaf(dsi, qv[t], acc_k[rr][t]);
                    }
                }
            }
        }
    }
KCU_UNROLL
    for (int rr = 0; rr < AT_RPW; rr++) {
        const int j = k0 + warp * AT_RPW + rr;
        if (j >= Tn) continue;
KCU_UNROLL
        for (int t = 0; t < DPL; t++) {
            const int d = lane + 32 * t;
            if (d < hd) {
                kcu_st(dk, koff + (size_t)j * ldk + d, acc_k[rr][t]);
                kcu_st(dv, koff + (size_t)j * ldk + d, acc_v[rr][t]);
            }
        }
    }
}

// ---- host side ------------------------------------------------------------------------------------------

static int attn_check(fsdp_dtype dt, int B, int T, int H, int KV, int hd, const char *what, fsdp_err *err) {
    if (kcu_check_dt(dt, what, err)) return FSDP_E_INVALID;
    if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || hd <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: sizes must be positive (B %d, T %d, H %d, KV %d, hd %d)", what, B,
                            T, H, KV, hd);
    if (H % KV != 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: n_heads %d is not a multiple of n_kv_heads %d", what, H, KV);
    if (hd > KCU_ATTN_MAX_HEAD_DIM)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: head_dim %d is larger than %d", what, hd, KCU_ATTN_MAX_HEAD_DIM);
    if (B > 65535 || H > 65535)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: batch %d or heads %d exceed the grid limit 65535", what, B, H);
    return FSDP_OK;
}

template <class T, int DPL>
static int fwd_launch(const void *q, const void *k, const void *v, void *out, float *lse, int B, int Tn, int H, int KV,
                      int hd, float sq, kcu_stream stream, fsdp_err *err) {
    const size_t smem = (size_t)(AT_BR * hd + AT_BC * (hd + 1) + AT_BC * hd) * sizeof(float);
    int rc = kcu_smem_optin(attn_fwd<T, DPL>, smem, "kcu_attention_forward: cudaFuncSetAttribute", err);
    if (rc) return rc;
    dim3 grid((unsigned)((Tn + AT_BR - 1) / AT_BR), (unsigned)H, (unsigned)B);
    KCU_LAUNCH((attn_fwd<T, DPL>), grid, AT_THREADS, smem, stream)((const T *)q, (const T *)k, (const T *)v, (T *)out,
                                                                   lse, Tn, H, KV, hd, sq);
    return kcu_launch_check(err, "kcu_attention_forward");
}

template <class T, int DPL>
static int bwd_launch(const void *q, const void *k, const void *v, const float *lse, const float *D, const void *dout,
                      void *dq, void *dk, void *dv, int B, int Tn, int H, int KV, int hd, float sq, kcu_stream stream,
                      fsdp_err *err) {
    const size_t smem_q = (size_t)(2 * AT_BR * hd + 2 * AT_BC * (hd + 1)) * sizeof(float);
    const size_t smem_kv = smem_q + 2 * AT_BC * sizeof(float);
    int rc = kcu_smem_optin(attn_bwd_dq<T, DPL>, smem_q, "kcu_attention_backward: cudaFuncSetAttribute", err);
    if (!rc) rc = kcu_smem_optin(attn_bwd_dkdv<T, DPL>, smem_kv, "kcu_attention_backward: cudaFuncSetAttribute", err);
    if (rc) return rc;
    const unsigned tiles = (unsigned)((Tn + AT_BR - 1) / AT_BR);
    KCU_LAUNCH((attn_bwd_dq<T, DPL>), dim3(tiles, (unsigned)H, (unsigned)B), AT_THREADS, smem_q, stream)(
        (const T *)q, (const T *)k, (const T *)v, lse, D, (const T *)dout, (T *)dq, Tn, H, KV, hd, sq);
    rc = kcu_launch_check(err, "kcu_attention_backward (dq)");
    if (rc) return rc;
    KCU_LAUNCH((attn_bwd_dkdv<T, DPL>), dim3(tiles, (unsigned)KV, (unsigned)B), AT_THREADS, smem_kv, stream)(
        (const T *)q, (const T *)k, (const T *)v, lse, D, (const T *)dout, (T *)dk, (T *)dv, Tn, H, KV, hd, sq);
    return kcu_launch_check(err, "kcu_attention_backward (dk, dv)");
}

// Whether the tensor-core kernels run (*tc = 1) for this call; KCU_ATTN_TC on a call they cannot
// take is an error, KCU_ATTN_AUTO falls back to the SIMT kernels.
static int attn_pick(kcu_attn_impl impl, fsdp_dtype dt, int hd, const void *const *ptrs, int n, const char *what,
                     int *tc, fsdp_err *err) {
    *tc = 0;
    if (impl == KCU_ATTN_SIMT) return FSDP_OK;
    if (impl != KCU_ATTN_AUTO && impl != KCU_ATTN_TC)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: unknown implementation %d", what, (int)impl);
    const int shape = kcu_attn_tc_shape_ok(dt, hd), aligned = kcu_attn_tc_aligned(ptrs, n);
    if (impl == KCU_ATTN_TC) {
        if (!shape)
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "%s: the tensor-core kernels need bf16 and head_dim 64 or 128 (got %s, head_dim %d)",
                                what, fsdp_dtype_name(dt), hd);
        if (!aligned)
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: the tensor-core kernels need 16-byte aligned tensors", what);
    }
    *tc = shape && aligned;
    return FSDP_OK;
}

KCU_API int kcu_attention_tc_supported(fsdp_dtype dt, int hd) { return kcu_attn_tc_shape_ok(dt, hd); }

KCU_API int kcu_attention_forward_impl(kcu_attn_impl impl, fsdp_dtype dt, const void *q, const void *k, const void *v,
                                       void *out, float *lse, int B, int T, int H, int KV, int hd, kcu_stream stream,
                                       fsdp_err *err) {
    if (attn_check(dt, B, T, H, KV, hd, "kcu_attention_forward", err)) return FSDP_E_INVALID;
    const void *ptrs[4] = {q, k, v, out};
    int tc = 0;
    if (attn_pick(impl, dt, hd, ptrs, 4, "kcu_attention_forward", &tc, err)) return FSDP_E_INVALID;
    if (tc) return kcu_attn_tc_forward(q, k, v, out, lse, B, T, H, KV, hd, stream, err);
    const float sq = (float)sqrt((double)hd); // scores are (q.k) / sqrt(hd), as kc_attention_forward
    int rc = FSDP_OK;
    KCU_DISPATCH(dt, Ty, {
        if (hd <= 64)
            rc = fwd_launch<Ty, 2>(q, k, v, out, lse, B, T, H, KV, hd, sq, stream, err);
        else if (hd <= 128)
            rc = fwd_launch<Ty, 4>(q, k, v, out, lse, B, T, H, KV, hd, sq, stream, err);
        else
            rc = fwd_launch<Ty, 8>(q, k, v, out, lse, B, T, H, KV, hd, sq, stream, err);
    });
    return rc;
}

KCU_API int kcu_attention_forward(fsdp_dtype dt, const void *q, const void *k, const void *v, void *out, float *lse,
                                  int B, int T, int H, int KV, int hd, kcu_stream stream, fsdp_err *err) {
    return kcu_attention_forward_impl(KCU_ATTN_AUTO, dt, q, k, v, out, lse, B, T, H, KV, hd, stream, err);
}

KCU_API size_t kcu_attention_scratch_floats(int B, int T, int H) {
    if (B <= 0 || T <= 0 || H <= 0) return 0;
    return (size_t)B * (size_t)T * (size_t)H;
}

KCU_API int kcu_attention_backward_impl(kcu_attn_impl impl, fsdp_dtype dt, const void *q, const void *k,
                                        const void *v, const void *out, const float *lse, const void *dout, void *dq,
                                        void *dk, void *dv, int B, int T, int H, int KV, int hd, float *scratch,
                                        kcu_stream stream, fsdp_err *err) {
    if (attn_check(dt, B, T, H, KV, hd, "kcu_attention_backward", err)) return FSDP_E_INVALID;
    if (!scratch) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_attention_backward: no scratch buffer");
    const void *ptrs[7] = {q, k, v, dout, dq, dk, dv};
    int tc = 0;
    if (attn_pick(impl, dt, hd, ptrs, 7, "kcu_attention_backward", &tc, err)) return FSDP_E_INVALID;
    const float sq = (float)sqrt((double)hd);
    const int64_t rows = (int64_t)B * T * H;
    int rc = FSDP_OK;
    KCU_DISPATCH(dt, Ty, {
        KCU_LAUNCH(attn_bwd_dot<Ty>, kcu_blocks(rows * 32, 256), 256, 0, stream)((const Ty *)out, (const Ty *)dout,
                                                                                 scratch, rows, T, H, hd);
        rc = kcu_launch_check(err, "kcu_attention_backward (dO.O)");
        if (!rc) {
            if (tc)
                rc = kcu_attn_tc_backward(q, k, v, lse, scratch, dout, dq, dk, dv, B, T, H, KV, hd, stream, err);
            else if (hd <= 64)
                rc = bwd_launch<Ty, 2>(q, k, v, lse, scratch, dout, dq, dk, dv, B, T, H, KV, hd, sq, stream, err);
            else if (hd <= 128)
                rc = bwd_launch<Ty, 4>(q, k, v, lse, scratch, dout, dq, dk, dv, B, T, H, KV, hd, sq, stream, err);
            else
                rc = bwd_launch<Ty, 8>(q, k, v, lse, scratch, dout, dq, dk, dv, B, T, H, KV, hd, sq, stream, err);
        }
    });
    return rc;
}

KCU_API int kcu_attention_backward(fsdp_dtype dt, const void *q, const void *k, const void *v, const void *out,
                                   const float *lse, const void *dout, void *dq, void *dk, void *dv, int B, int T,
                                   int H, int KV, int hd, float *scratch, kcu_stream stream, fsdp_err *err) {
    return kcu_attention_backward_impl(KCU_ATTN_AUTO, dt, q, k, v, out, lse, dout, dq, dk, dv, B, T, H, KV, hd, scratch,
                                       stream, err);
}
