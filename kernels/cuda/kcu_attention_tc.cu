// Causal attention with grouped KV heads on tensor cores: bf16 storage, WMMA 16x16x16 bf16 fragments
// with float32 accumulation (FlashAttention-2). Softmax statistics, scaling and the causal mask are
// float32. Conventions: kcu_attention_forward/backward (kernels/cuda/kcu.h); head_dim 64 or 128.
//
// Tiles: a block has 4 warps; a warp owns 16 rows of the block's 64-row tile and the other side is
// walked in 64-row tiles. Q/K/V/dO tiles are staged in shared memory as bf16 with a row stride of
// hd + 8 elements (a multiple of 8 as WMMA needs; 16 bytes of padding so that the 8 rows of a
// fragment load fall in distinct banks). Products leave the accumulators through a per-warp float
// staging tile (row stride 68 or hd + 4), where each lane owns one row r = lane / 2 and the columns
// of parity lane % 2; probabilities (and dS) go back to shared memory as bf16 A operands.
//
// Forward (grid: query tiles (longest first) x H x B): per key tile, S = Q K^T (Q fragments kept in
// registers), online softmax in the log2 domain (m, l per row, in the lanes owning the row), the
// tile's P V into the staging tile, then o = o * alpha + P V in registers. out = o / l and
// lse = m ln2 + ln l.
//
// Backward, with D = rowsum(dO * O) (computed by the caller) and P = exp(s / sqrt(hd) - lse):
//   dQ kernel (grid like the forward; the warp's Q and dO fragments kept in registers): per key tile
//     S = Q K^T, dP = dO V^T, dS = P (dP - D) / sqrt(hd), dQ += dS K, accumulated in fragments.
//   dK dV kernel (grid: key tiles x KV x B): the block owns 64 keys of one kv head and walks every
//     query tile at or after them for every query head of the group: S^T = K Q^T, dP^T = V dO^T,
//     dV += P^T dO, dK += dS^T Q, accumulated in fragments. No atomics; every output is overwritten.
// On the diagonal tile, 16x16 blocks lying wholly above the diagonal are skipped; every other
// element is masked with (key <= query < T) in float32 before it reaches a product. Each A fragment
// (P, dS, P^T, dS^T) is loaded from shared memory once per tile and used for every output fragment,
// since shared-memory traffic (staging included), not the tensor cores, is expected to bound these
// kernels (not yet measured).
//
// Shared memory (bytes; hd 64 / hd 128): forward 54272 / 95232, dQ 80896 / 113664, dK dV 90624 /
// 123392, all above 48 KiB (opted in with cudaFuncSetAttribute on every launch).
//
// KCU_EMULATE (tests/kcu_emu.h) compiles this file as host C++ against an emulation that runs a block
// as 128 threads with real barriers and a reference WMMA, so that the kernel code itself is tested on
// machines without a GPU (tests/test_kcu_emu_attention.cc).
#include "kernels/cuda/kcu_attention_tc.cuh"
#include "kernels/cuda/kcu_common.cuh"

#ifndef KCU_EMULATE
#include <cuda_bf16.h>
#include <mma.h>
#define TC_SMEM_DECL extern __shared__ __align__(128) unsigned char tc_smem[]
#else
#define TC_SMEM_DECL KCU_DYN_SHARED(unsigned char, tc_smem)
#endif
#define TC_UNROLL KCU_UNROLL
#include <math.h>
#include <stdint.h>

using namespace nvcuda;

#define TC_WARPS 4
#define TC_THREADS (TC_WARPS * 32)
#define TC_BR 64              // rows of a block's own tile (16 per warp)
#define TC_BC 64              // rows of the tiles walked
#define TC_PLD (TC_BC + 8)    // bf16 row stride of the per-warp P / dS tiles
#define TC_SLD (TC_BC + 4)    // float row stride of the backward's per-warp S / dP staging
#define TC_LOG2E 1.4426950408889634f
#define TC_LN2 0.6931471805599453f

typedef __nv_bfloat16 tc_bf16;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, tc_bf16, wmma::row_major> tc_frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, tc_bf16, wmma::row_major> tc_frag_brow;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, tc_bf16, wmma::col_major> tc_frag_bcol;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> tc_frag_c;

template <int HD>
struct tc_cfg {
    static constexpr int LD = HD + 8;                           // bf16 row stride of 64-row tiles
    static constexpr int TILE = TC_BR * LD * 2;                 // bytes of one 64-row tile
    static constexpr int FSLD = (HD > TC_BC ? HD : TC_BC) + 4;  // forward staging row stride (floats)
    static constexpr int FSTAGE = 16 * FSLD * 4;                // forward staging bytes per warp
    static constexpr int SSTAGE = 16 * TC_SLD * 4;              // backward S (or dP) bytes per warp
    static constexpr int PTILE = 16 * TC_PLD * 2;               // P (or dS) bytes per warp
    static constexpr int FWD_SMEM = 3 * TILE + TC_WARPS * (FSTAGE + PTILE);
    static constexpr int DQ_SMEM = 4 * TILE + TC_WARPS * (2 * SSTAGE + PTILE);
    static constexpr int LSD = 2 * TC_BC * 4; // lse and D of a query tile (dK dV kernel)
    static constexpr int DKDV_SMEM = 4 * TILE + LSD + TC_WARPS * (2 * SSTAGE + 2 * PTILE);
    // every region starts on a 128-byte boundary, so every fragment pointer (row a multiple of 16,
    // column a multiple of 16) is 32-byte aligned as load/store_matrix_sync require
    static_assert(HD % 16 == 0, "head_dim must be a multiple of 16");
    static_assert(TILE % 128 == 0 && FSTAGE % 128 == 0 && SSTAGE % 128 == 0 && PTILE % 128 == 0 && LSD % 128 == 0,
                  "shared-memory regions must keep 128-byte alignment");
    static_assert((16 * LD * 2) % 32 == 0 && (16 * TC_PLD * 2) % 32 == 0, "16-row offsets must be 32-byte aligned");
    static_assert(LD % 8 == 0 && TC_PLD % 8 == 0 && FSLD % 4 == 0 && TC_SLD % 4 == 0, "WMMA leading dimensions");
    static_assert(FWD_SMEM <= 227 * 1024 && DQ_SMEM <= 227 * 1024 && DKDV_SMEM <= 227 * 1024,
                  "shared memory beyond the sm_90 limit");
};

static_assert(TC_BR == TC_BC, "the diagonal-tile logic assumes square tiles");
static_assert(TC_BR == 16 * TC_WARPS, "a warp owns 16 rows");

__device__ __forceinline__ uint32_t tc_pack2(float lo, float hi) {
    return (uint32_t)kcu_f2bf(lo) | ((uint32_t)kcu_f2bf(hi) << 16);
}

// Rows t0 .. t0+63 of a [*, ldg] bf16 matrix (row t at g + t * ldg, 16-byte aligned) into a tile of
// row stride LD; rows at or past Tn are zero. Called by all threads of the block.
template <int HD>
__device__ __forceinline__ void tc_load_tile(tc_bf16 *dst, const uint16_t *g, size_t ldg, int t0, int Tn) {
    constexpr int CPR = HD / 8; // 16-byte chunks per row
    constexpr int LD = tc_cfg<HD>::LD;
    for (int e = threadIdx.x; e < TC_BR * CPR; e += TC_THREADS) {
        const int r = e / CPR, c = e - r * CPR, t = t0 + r;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (t < Tn) val = __ldg(reinterpret_cast<const uint4 *>(g + (size_t)t * ldg) + c);
        *reinterpret_cast<uint4 *>(dst + r * LD + c * 8) = val;
    }
}

// Writes a warp's 16 x HD accumulators as bf16 rows t0 .. t0+15 of a [*, ldg] matrix (row t at
// g + t * ldg), rows at or past Tn skipped, through the warp's staging tile (row stride TC_SLD).
template <int HD>
__device__ __forceinline__ void tc_store_rows(const tc_frag_c (&acc)[HD / 16], float *stage, uint16_t *g, size_t ldg,
                                              int t0, int Tn) {
    const int lane = threadIdx.x & 31, r = lane >> 1, c0 = (lane & 1) * 8, t = t0 + r;
TC_UNROLL
    for (int f = 0; f < HD / 16; f++) {
        wmma::store_matrix_sync(stage, acc[f], TC_SLD, wmma::mem_row_major);
        __syncwarp();
        if (t < Tn) {
            const float *s = stage + r * TC_SLD + c0;
            uint4 pk;
            pk.x = tc_pack2(s[0], s[1]);
            pk.y = tc_pack2(s[2], s[3]);
            pk.z = tc_pack2(s[4], s[5]);
            pk.w = tc_pack2(s[6], s[7]);
            *reinterpret_cast<uint4 *>(g + (size_t)t * ldg + f * 16 + c0) = pk;
        }
        __syncwarp(); // the staging tile is read before the next fragment overwrites it
    }
}

// ---- forward ----------------------------------------------------------------------------------------

template <int HD>
__global__ void __launch_bounds__(TC_THREADS)
    attn_tc_fwd(const uint16_t *__restrict__ q, const uint16_t *__restrict__ k, const uint16_t *__restrict__ v,
                uint16_t *__restrict__ out, float *__restrict__ lse, int Tn, int H, int KV, float sl2) {
    typedef tc_cfg<HD> C;
    TC_SMEM_DECL;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    tc_bf16 *Qs = reinterpret_cast<tc_bf16 *>(tc_smem);
    tc_bf16 *Ks = reinterpret_cast<tc_bf16 *>(tc_smem + C::TILE);
    tc_bf16 *Vs = reinterpret_cast<tc_bf16 *>(tc_smem + 2 * C::TILE);
    float *St = reinterpret_cast<float *>(tc_smem + 3 * C::TILE + w * C::FSTAGE);
    tc_bf16 *Ps = reinterpret_cast<tc_bf16 *>(tc_smem + 3 * C::TILE + TC_WARPS * C::FSTAGE + w * C::PTILE);

    const int nt = (Tn + TC_BR - 1) / TC_BR;
    const int qt = nt - 1 - (int)blockIdx.x; // the longest rows first
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / (H / KV), q0 = qt * TC_BR;
    const size_t ldq = (size_t)H * HD, ldk = (size_t)KV * HD;
    const size_t qoff = (size_t)b * Tn * ldq + (size_t)h * HD;
    const uint16_t *kb = k + (size_t)b * Tn * ldk + (size_t)kvh * HD;
    const uint16_t *vb = v + (size_t)b * Tn * ldk + (size_t)kvh * HD;

    tc_load_tile<HD>(Qs, q + qoff, ldq, q0, Tn);
    __syncthreads();
    tc_frag_a qf[HD / 16];
TC_UNROLL
    for (int kk = 0; kk < HD / 16; kk++) wmma::load_matrix_sync(qf[kk], Qs + w * 16 * C::LD + kk * 16, C::LD);

    const int r = lane >> 1, hf = lane & 1;
    const int i = q0 + w * 16 + r; // this lane's query row (may be >= Tn: computed, never stored)
    float m = -INFINITY, l = 0.0f; // running max of s * log2(e) / sqrt(hd) and sum of 2^(. - m)
    float o[HD / 2];               // out[i, hf + 2 jj] unnormalised
TC_UNROLL
    for (int jj = 0; jj < HD / 2; jj++) o[jj] = 0.0f;

    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * TC_BC;
        __syncthreads(); // every warp is done with the previous K and V tiles
        tc_load_tile<HD>(Ks, kb, ldk, k0, Tn);
        tc_load_tile<HD>(Vs, vb, ldk, k0, Tn);
        __syncthreads();
        // on the diagonal tile, key blocks past the warp's last row are wholly masked
        const int nb = kt == qt ? w + 1 : TC_BC / 16;
        for (int n = 0; n < nb; n++) {
            tc_frag_c s;
            wmma::fill_fragment(s, 0.0f);
TC_UNROLL
            for (int kk = 0; kk < HD / 16; kk++) {
                tc_frag_bcol kf; // K^T: element (d, key) at Ks[key * LD + d]
                wmma::load_matrix_sync(kf, Ks + n * 16 * C::LD + kk * 16, C::LD);
                wmma::mma_sync(s, qf[kk], kf, s);
            }
            wmma::store_matrix_sync(St + n * 16, s, C::FSLD, wmma::mem_row_major);
        }
        __syncwarp();
        // online softmax over this lane's half of row r (columns of parity hf); a row always has a
        // valid key in every tile it visits (key k0 <= q0 <= i on the diagonal tile), so mnew is finite
        const float *srow = St + r * C::FSLD;
        float mx = -INFINITY;
TC_UNROLL
        for (int jj = 0; jj < TC_BC / 2; jj++) {
            const int c = hf + 2 * jj, j = k0 + c;
            if (j <= i && j < Tn) mx = fmaxf(mx, srow[c] * sl2);
        }
        mx = fmaxf(mx, __shfl_xor_sync(KCU_FULL_MASK, mx, 1));
        const float mnew = fmaxf(m, mx);
        const float alpha = exp2f(m - mnew); // 0 on the first tile (m = -inf)
        float sum = 0.0f;
        tc_bf16 *prow = Ps + r * TC_PLD;
TC_UNROLL
        for (int jj = 0; jj < TC_BC / 2; jj++) {
            const int c = hf + 2 * jj, j = k0 + c;
            float p = 0.0f;
            if (j <= i && j < Tn) p = exp2f(srow[c] * sl2 - mnew);
            sum += p;
            prow[c] = __float2bfloat16_rn(p);
        }
        sum += __shfl_xor_sync(KCU_FULL_MASK, sum, 1);
        l = l * alpha + sum;
        m = mnew;
        __syncwarp(); // P complete, S read: the staging tile now receives P V
        tc_frag_a pf[TC_BC / 16]; // P is zero in key blocks >= nb (loops predicated: static indices)
TC_UNROLL
        for (int kk = 0; kk < TC_BC / 16; kk++)
            if (kk < nb) wmma::load_matrix_sync(pf[kk], Ps + kk * 16, TC_PLD);
TC_UNROLL
        for (int f = 0; f < HD / 16; f++) {
            tc_frag_c pv;
            wmma::fill_fragment(pv, 0.0f);
TC_UNROLL
            for (int kk = 0; kk < TC_BC / 16; kk++) {
                if (kk < nb) {
                    tc_frag_brow vf; // V: element (key, d) at Vs[key * LD + d]
                    wmma::load_matrix_sync(vf, Vs + kk * 16 * C::LD + f * 16, C::LD);
                    wmma::mma_sync(pv, pf[kk], vf, pv);
                }
            }
            wmma::store_matrix_sync(St + f * 16, pv, C::FSLD, wmma::mem_row_major);
        }
        __syncwarp();
TC_UNROLL
        for (int jj = 0; jj < HD / 2; jj++) o[jj] = o[jj] * alpha + srow[hf + 2 * jj];
    }

    // normalised rows through the staging tile, then 8 bf16 per store
    const float inv = 1.0f / l;
    __syncwarp(); // every lane has read its P V
    float *srow = St + r * C::FSLD;
TC_UNROLL
    for (int jj = 0; jj < HD / 2; jj++) srow[hf + 2 * jj] = o[jj] * inv;
    __syncwarp();
    uint16_t *ob = out + qoff;
    for (int e = lane; e < 16 * (HD / 8); e += 32) {
        const int rr = e / (HD / 8), c8 = e - rr * (HD / 8), t = q0 + w * 16 + rr;
        if (t < Tn) {
            const float *s = St + rr * C::FSLD + c8 * 8;
            uint4 pk;
            pk.x = tc_pack2(s[0], s[1]);
            pk.y = tc_pack2(s[2], s[3]);
            pk.z = tc_pack2(s[4], s[5]);
            pk.w = tc_pack2(s[6], s[7]);
            *reinterpret_cast<uint4 *>(ob + (size_t)t * ldq + c8 * 8) = pk;
        }
    }
    if (hf == 0 && i < Tn) lse[((size_t)b * H + h) * Tn + i] = m * TC_LN2 + logf(l);
}

// ---- backward: dQ --------------------------------------------------------------------------------------

template <int HD>
__global__ void __launch_bounds__(TC_THREADS)
    attn_tc_bwd_dq(const uint16_t *__restrict__ q, const uint16_t *__restrict__ k, const uint16_t *__restrict__ v,
                   const float *__restrict__ lse, const float *__restrict__ D, const uint16_t *__restrict__ dout,
                   uint16_t *__restrict__ dq, int Tn, int H, int KV, float scale, float sl2) {
    typedef tc_cfg<HD> C;
    TC_SMEM_DECL;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    tc_bf16 *Qs = reinterpret_cast<tc_bf16 *>(tc_smem);
    tc_bf16 *dOs = reinterpret_cast<tc_bf16 *>(tc_smem + C::TILE);
    tc_bf16 *Ks = reinterpret_cast<tc_bf16 *>(tc_smem + 2 * C::TILE);
    tc_bf16 *Vs = reinterpret_cast<tc_bf16 *>(tc_smem + 3 * C::TILE);
    float *St = reinterpret_cast<float *>(tc_smem + 4 * C::TILE + w * 2 * C::SSTAGE);
    float *dPt = St + 16 * TC_SLD;
    tc_bf16 *dSs = reinterpret_cast<tc_bf16 *>(tc_smem + 4 * C::TILE + TC_WARPS * 2 * C::SSTAGE + w * C::PTILE);

    const int nt = (Tn + TC_BR - 1) / TC_BR;
    const int qt = nt - 1 - (int)blockIdx.x;
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / (H / KV), q0 = qt * TC_BR;
    const size_t ldq = (size_t)H * HD, ldk = (size_t)KV * HD;
    const size_t qoff = (size_t)b * Tn * ldq + (size_t)h * HD;
    const uint16_t *kb = k + (size_t)b * Tn * ldk + (size_t)kvh * HD;
    const uint16_t *vb = v + (size_t)b * Tn * ldk + (size_t)kvh * HD;

    tc_load_tile<HD>(Qs, q + qoff, ldq, q0, Tn);
    tc_load_tile<HD>(dOs, dout + qoff, ldq, q0, Tn);
    const int r = lane >> 1, hf = lane & 1;
    const int i = q0 + w * 16 + r;
    const size_t at = ((size_t)b * H + h) * Tn;
    const float Li = i < Tn ? lse[at + i] * TC_LOG2E : 0.0f;
    const float Di = i < Tn ? D[at + i] : 0.0f;
    tc_frag_c acc[HD / 16];
TC_UNROLL
    for (int f = 0; f < HD / 16; f++) wmma::fill_fragment(acc[f], 0.0f);
    __syncthreads(); // Qs and dOs written
    tc_frag_a qa[HD / 16], da[HD / 16]; // the warp's 16 rows of Q and dO
TC_UNROLL
    for (int kk = 0; kk < HD / 16; kk++) {
        wmma::load_matrix_sync(qa[kk], Qs + w * 16 * C::LD + kk * 16, C::LD);
        wmma::load_matrix_sync(da[kk], dOs + w * 16 * C::LD + kk * 16, C::LD);
    }

    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * TC_BC;
        __syncthreads(); // the previous K and V tiles are consumed
        tc_load_tile<HD>(Ks, kb, ldk, k0, Tn);
        tc_load_tile<HD>(Vs, vb, ldk, k0, Tn);
        __syncthreads();
        const int nb = kt == qt ? w + 1 : TC_BC / 16;
        for (int n = 0; n < nb; n++) {
            tc_frag_c s, dp;
            wmma::fill_fragment(s, 0.0f);
            wmma::fill_fragment(dp, 0.0f);
TC_UNROLL
            for (int kk = 0; kk < HD / 16; kk++) {
                tc_frag_bcol bt; // K^T / V^T: element (d, key) at [key * LD + d]
                wmma::load_matrix_sync(bt, Ks + n * 16 * C::LD + kk * 16, C::LD);
                wmma::mma_sync(s, qa[kk], bt, s);
                wmma::load_matrix_sync(bt, Vs + n * 16 * C::LD + kk * 16, C::LD);
                wmma::mma_sync(dp, da[kk], bt, dp);
            }
            wmma::store_matrix_sync(St + n * 16, s, TC_SLD, wmma::mem_row_major);
            wmma::store_matrix_sync(dPt + n * 16, dp, TC_SLD, wmma::mem_row_major);
        }
        __syncwarp();
        const float *srow = St + r * TC_SLD, *dprow = dPt + r * TC_SLD;
        tc_bf16 *dsrow = dSs + r * TC_PLD;
TC_UNROLL
        for (int jj = 0; jj < TC_BC / 2; jj++) {
            const int c = hf + 2 * jj, j = k0 + c;
            float ds = 0.0f;
            if (j <= i && i < Tn) {
                const float p = exp2f(srow[c] * sl2 - Li);
                ds = p * (dprow[c] - Di) * scale;
            }
            dsrow[c] = __float2bfloat16_rn(ds);
        }
        __syncwarp();
TC_UNROLL
        for (int kk = 0; kk < TC_BC / 16; kk++) {
            if (kk < nb) { // dS is zero in key blocks >= nb
                tc_frag_a a;
                wmma::load_matrix_sync(a, dSs + kk * 16, TC_PLD);
TC_UNROLL
                for (int f = 0; f < HD / 16; f++) {
                    tc_frag_brow kf; // K: element (key, d) at Ks[key * LD + d]
                    wmma::load_matrix_sync(kf, Ks + kk * 16 * C::LD + f * 16, C::LD);
                    wmma::mma_sync(acc[f], a, kf, acc[f]);
                }
            }
        }
    }
    // St was last read before the __syncwarp above
    tc_store_rows<HD>(acc, St, dq + qoff, ldq, q0 + w * 16, Tn);
}

// ---- backward: dK and dV -----------------------------------------------------------------------------------

template <int HD>
__global__ void __launch_bounds__(TC_THREADS)
    attn_tc_bwd_dkdv(const uint16_t *__restrict__ q, const uint16_t *__restrict__ k, const uint16_t *__restrict__ v,
                     const float *__restrict__ lse, const float *__restrict__ D, const uint16_t *__restrict__ dout,
                     uint16_t *__restrict__ dk, uint16_t *__restrict__ dv, int Tn, int H, int KV, float scale,
                     float sl2) {
    typedef tc_cfg<HD> C;
    TC_SMEM_DECL;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    tc_bf16 *Ks = reinterpret_cast<tc_bf16 *>(tc_smem);
    tc_bf16 *Vs = reinterpret_cast<tc_bf16 *>(tc_smem + C::TILE);
    tc_bf16 *Qs = reinterpret_cast<tc_bf16 *>(tc_smem + 2 * C::TILE);
    tc_bf16 *dOs = reinterpret_cast<tc_bf16 *>(tc_smem + 3 * C::TILE);
    float *Ls = reinterpret_cast<float *>(tc_smem + 4 * C::TILE); // lse * log2(e) of the query tile
    float *Ds = Ls + TC_BC;
    float *St = reinterpret_cast<float *>(tc_smem + 4 * C::TILE + C::LSD + w * 2 * C::SSTAGE);
    float *dPt = St + 16 * TC_SLD;
    tc_bf16 *Pt = reinterpret_cast<tc_bf16 *>(tc_smem + 4 * C::TILE + C::LSD + TC_WARPS * 2 * C::SSTAGE +
                                              w * 2 * C::PTILE);
    tc_bf16 *dSt = Pt + 16 * TC_PLD;

    const int nt = (Tn + TC_BC - 1) / TC_BC;
    const int kt = blockIdx.x; // key tile 0 has the most query tiles and starts first
    const int b = blockIdx.z, kvh = blockIdx.y, rep = H / KV, k0 = kt * TC_BR;
    const size_t ldq = (size_t)H * HD, ldk = (size_t)KV * HD;
    const size_t koff = (size_t)b * Tn * ldk + (size_t)kvh * HD;

    tc_load_tile<HD>(Ks, k + koff, ldk, k0, Tn);
    tc_load_tile<HD>(Vs, v + koff, ldk, k0, Tn);
    const int r = lane >> 1, hf = lane & 1;
    const int j = k0 + w * 16 + r; // this lane's key row
    tc_frag_c adk[HD / 16], adv[HD / 16];
TC_UNROLL
    for (int f = 0; f < HD / 16; f++) {
        wmma::fill_fragment(adk[f], 0.0f);
        wmma::fill_fragment(adv[f], 0.0f);
    }
    // hd 64: the warp's K and V rows stay in registers (at hd 128 the accumulators leave no room)
    constexpr bool KV_REGS = HD <= 64;
    constexpr int NKR = KV_REGS ? HD / 16 : 1;
    tc_frag_a kra[NKR], vra[NKR];
    __syncthreads(); // Ks and Vs written
    if (KV_REGS) {
TC_UNROLL
        for (int kk = 0; kk < NKR; kk++) {
            wmma::load_matrix_sync(kra[kk], Ks + w * 16 * C::LD + kk * 16, C::LD);
            wmma::load_matrix_sync(vra[kk], Vs + w * 16 * C::LD + kk * 16, C::LD);
        }
    }

    for (int g = 0; g < rep; g++) {
        const int h = kvh * rep + g;
        const size_t qoff = (size_t)b * Tn * ldq + (size_t)h * HD;
        const size_t at = ((size_t)b * H + h) * Tn;
        for (int qt = kt; qt < nt; qt++) {
            const int i0 = qt * TC_BC;
            __syncthreads(); // the previous query tile is consumed
            tc_load_tile<HD>(Qs, q + qoff, ldq, i0, Tn);
            tc_load_tile<HD>(dOs, dout + qoff, ldq, i0, Tn);
            if (tid < TC_BC) {
                const int t = i0 + tid;
                Ls[tid] = t < Tn ? lse[at + t] * TC_LOG2E : 0.0f;
                Ds[tid] = t < Tn ? D[at + t] : 0.0f;
            }
            __syncthreads();
            // on the diagonal tile, query blocks before the warp's first key are wholly masked
            const int n0 = qt == kt ? w : 0;
            for (int n = n0; n < TC_BC / 16; n++) {
                tc_frag_c s, dp;
                wmma::fill_fragment(s, 0.0f);
                wmma::fill_fragment(dp, 0.0f);
TC_UNROLL
                for (int kk = 0; kk < HD / 16; kk++) {
                    tc_frag_bcol bt; // Q^T / dO^T: element (d, query) at [query * LD + d]
                    wmma::load_matrix_sync(bt, Qs + n * 16 * C::LD + kk * 16, C::LD);
                    if (KV_REGS) {
                        wmma::mma_sync(s, kra[KV_REGS ? kk : 0], bt, s);
                    } else {
                        tc_frag_a a;
                        wmma::load_matrix_sync(a, Ks + w * 16 * C::LD + kk * 16, C::LD);
                        wmma::mma_sync(s, a, bt, s);
                    }
                    wmma::load_matrix_sync(bt, dOs + n * 16 * C::LD + kk * 16, C::LD);
                    if (KV_REGS) {
                        wmma::mma_sync(dp, vra[KV_REGS ? kk : 0], bt, dp);
                    } else {
                        tc_frag_a a;
                        wmma::load_matrix_sync(a, Vs + w * 16 * C::LD + kk * 16, C::LD);
                        wmma::mma_sync(dp, a, bt, dp);
                    }
                }
                wmma::store_matrix_sync(St + n * 16, s, TC_SLD, wmma::mem_row_major);
                wmma::store_matrix_sync(dPt + n * 16, dp, TC_SLD, wmma::mem_row_major);
            }
            __syncwarp();
            const float *srow = St + r * TC_SLD, *dprow = dPt + r * TC_SLD;
            tc_bf16 *prow = Pt + r * TC_PLD, *dsrow = dSt + r * TC_PLD;
TC_UNROLL
            for (int jj = 0; jj < TC_BC / 2; jj++) {
                const int c = hf + 2 * jj, i = i0 + c;
                float p = 0.0f, ds = 0.0f;
                if (j <= i && i < Tn) { // j <= i < Tn also keeps the padding keys out
                    p = exp2f(srow[c] * sl2 - Ls[c]);
                    ds = p * (dprow[c] - Ds[c]) * scale;
                }
                prow[c] = __float2bfloat16_rn(p);
                dsrow[c] = __float2bfloat16_rn(ds);
            }
            __syncwarp();
TC_UNROLL
            for (int kk = 0; kk < TC_BC / 16; kk++) {
                if (kk >= n0) { // P^T and dS^T are zero in query blocks < n0
                    tc_frag_a a;
                    wmma::load_matrix_sync(a, Pt + kk * 16, TC_PLD);
TC_UNROLL
                    for (int f = 0; f < HD / 16; f++) {
                        tc_frag_brow bm; // dO: element (query, d) at dOs[query * LD + d]
                        wmma::load_matrix_sync(bm, dOs + kk * 16 * C::LD + f * 16, C::LD);
                        wmma::mma_sync(adv[f], a, bm, adv[f]);
                    }
                    wmma::load_matrix_sync(a, dSt + kk * 16, TC_PLD);
TC_UNROLL
                    for (int f = 0; f < HD / 16; f++) {
                        tc_frag_brow bm; // Q: element (query, d) at Qs[query * LD + d]
                        wmma::load_matrix_sync(bm, Qs + kk * 16 * C::LD + f * 16, C::LD);
                        wmma::mma_sync(adk[f], a, bm, adk[f]);
                    }
                }
            }
        }
    }
    // St was last read before the __syncwarp above
    tc_store_rows<HD>(adk, St, dk + koff, ldk, k0 + w * 16, Tn);
    tc_store_rows<HD>(adv, St, dv + koff, ldk, k0 + w * 16, Tn);
}

// ---- host side ------------------------------------------------------------------------------------------

int kcu_attn_tc_shape_ok(fsdp_dtype dt, int hd) { return dt == FSDP_DT_BF16 && (hd == 64 || hd == 128); }

int kcu_attn_tc_aligned(const void *const *ptrs, int n) {
    for (int i = 0; i < n; i++)
        if (((uintptr_t)ptrs[i] & 15u) != 0) return 0;
    return 1;
}

template <int HD>
static int tc_forward(const void *q, const void *k, const void *v, void *out, float *lse, int B, int Tn, int H, int KV,
                      kcu_stream stream, fsdp_err *err) {
    typedef tc_cfg<HD> C;
    int rc = kcu_smem_optin(attn_tc_fwd<HD>, C::FWD_SMEM,
                            "kcu_attention_forward (tensor cores): cudaFuncSetAttribute", err);
    if (rc) return rc;
    const float sl2 = (float)(1.4426950408889634 / sqrt((double)HD));
    const dim3 grid((unsigned)((Tn + TC_BR - 1) / TC_BR), (unsigned)H, (unsigned)B);
    KCU_LAUNCH(attn_tc_fwd<HD>, grid, TC_THREADS, C::FWD_SMEM, stream)((const uint16_t *)q, (const uint16_t *)k,
                                                               (const uint16_t *)v, (uint16_t *)out, lse, Tn, H, KV,
                                                               sl2);
    return kcu_launch_check(err, "kcu_attention_forward (tensor cores)");
}

template <int HD>
static int tc_backward(const void *q, const void *k, const void *v, const float *lse, const float *D, const void *dout,
                       void *dq, void *dk, void *dv, int B, int Tn, int H, int KV, kcu_stream stream, fsdp_err *err) {
    typedef tc_cfg<HD> C;
    int rc = kcu_smem_optin(attn_tc_bwd_dq<HD>, C::DQ_SMEM,
                            "kcu_attention_backward (tensor cores, dq): cudaFuncSetAttribute", err);
    if (!rc)
        rc = kcu_smem_optin(attn_tc_bwd_dkdv<HD>, C::DKDV_SMEM,
                            "kcu_attention_backward (tensor cores, dk dv): cudaFuncSetAttribute", err);
    if (rc) return rc;
    const float scale = (float)(1.0 / sqrt((double)HD));
    const float sl2 = (float)(1.4426950408889634 / sqrt((double)HD));
    const unsigned tiles = (unsigned)((Tn + TC_BR - 1) / TC_BR);
    KCU_LAUNCH(attn_tc_bwd_dq<HD>, dim3(tiles, (unsigned)H, (unsigned)B), TC_THREADS, C::DQ_SMEM, stream)(
        (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, lse, D, (const uint16_t *)dout, (uint16_t *)dq,
        Tn, H, KV, scale, sl2);
    rc = kcu_launch_check(err, "kcu_attention_backward (tensor cores, dq)");
    if (rc) return rc;
    KCU_LAUNCH(attn_tc_bwd_dkdv<HD>, dim3(tiles, (unsigned)KV, (unsigned)B), TC_THREADS, C::DKDV_SMEM, stream)(
        (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, lse, D, (const uint16_t *)dout, (uint16_t *)dk,
        (uint16_t *)dv, Tn, H, KV, scale, sl2);
    return kcu_launch_check(err, "kcu_attention_backward (tensor cores, dk dv)");
}

int kcu_attn_tc_forward(const void *q, const void *k, const void *v, void *out, float *lse, int B, int T, int H,
                        int KV, int hd, kcu_stream stream, fsdp_err *err) {
    if (hd == 64) return tc_forward<64>(q, k, v, out, lse, B, T, H, KV, stream, err);
    if (hd == 128) return tc_forward<128>(q, k, v, out, lse, B, T, H, KV, stream, err);
    return fsdp_err_set(err, FSDP_E_INVALID, "kcu_attention_forward (tensor cores): head_dim %d is not 64 or 128", hd);
}

int kcu_attn_tc_backward(const void *q, const void *k, const void *v, const float *lse, const float *D,
                         const void *dout, void *dq, void *dk, void *dv, int B, int T, int H, int KV, int hd,
                         kcu_stream stream, fsdp_err *err) {
    if (hd == 64) return tc_backward<64>(q, k, v, lse, D, dout, dq, dk, dv, B, T, H, KV, stream, err);
    if (hd == 128) return tc_backward<128>(q, k, v, lse, D, dout, dq, dk, dv, B, T, H, KV, stream, err);
    return fsdp_err_set(err, FSDP_E_INVALID, "kcu_attention_backward (tensor cores): head_dim %d is not 64 or 128",
                        hd);
}
