// Row-reduction kernels: RMSNorm (and its output from a saved rstd) and cross-entropy fused with softmax. One thread block per row;
// sums that the CPU kernels take in double are taken in double here too.
#include "kernels/cuda/kcu_common.cuh"

// Threads per row: enough warps to cover short rows, at most 256.
static int row_threads(int dim) {
    int t = ((dim + 31) / 32) * 32;
    return t < 32 ? 32 : t > 256 ? 256 : t;
}

// ---- RMSNorm --------------------------------------------------------------------------------------

template <class T>
__global__ void rmsnorm_fwd(const T *x, const T *w, T *y, float *rstd, int64_t n, int dim, float eps) {
    KCU_SHARED(double, sh, 32);
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const size_t off = (size_t)i * dim;
        double ss = 0.0;
        for (int j = threadIdx.x; j < dim; j += blockDim.x) {
            double v = kcu_ld(x, off + j);
            ss += v * v;
        }
        ss = kcu_block_sum(ss, sh);
        const float ms = (float)(ss / dim);
        const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
        if (threadIdx.x == 0) rstd[i] = r;
        for (int j = threadIdx.x; j < dim; j += blockDim.x)
            kcu_st(y, off + j, __fmul_rn(__fmul_rn(kcu_ld(x, off + j), r), kcu_ld(w, j)));
    }
}

// y = (x * rstd[row]) * w: rmsnorm_fwd's output from a saved rstd, the same two roundings.
template <class T>
__global__ void rmsnorm_apply(const T *x, const T *w, const float *rstd, T *y, int64_t n, int dim) {
    const int64_t total = n * dim;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = idx / dim;
        const int j = (int)(idx % dim);
        kcu_st(y, (size_t)idx, __fmul_rn(__fmul_rn(kcu_ld(x, (size_t)idx), rstd[i]), kcu_ld(w, j)));
    }
}

#define KCU_NORM_ROWS 32 /* rows per block in the backward: one set of dw atomics per block */

template <class T>
__global__ void rmsnorm_bwd(const T *dy, const T *x, const T *w, const float *rstd, T *dx, float *dw, int64_t n,
                            int dim) {
    KCU_DYN_SHARED(float, dwp); // [dim] this block's partial dw
    KCU_SHARED(double, sh, 32);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) dwp[j] = 0.0f;
    const int64_t i0 = (int64_t)blockIdx.x * KCU_NORM_ROWS;
    const int64_t i1 = i0 + KCU_NORM_ROWS < n ? i0 + KCU_NORM_ROWS : n;
    for (int64_t i = i0; i < i1; i++) {
        const size_t off = (size_t)i * dim;
        double dot = 0.0;
        for (int j = threadIdx.x; j < dim; j += blockDim.x)
            dot += (double)kcu_ld(dy, off + j) * (double)kcu_ld(w, j) * (double)kcu_ld(x, off + j);
        dot = kcu_block_sum(dot, sh);
        const double r = rstd[i];
        const float c = (float)(dot * r * r * r / dim);
        const float rf = rstd[i];
        for (int j = threadIdx.x; j < dim; j += blockDim.x) {
            const float dyj = kcu_ld(dy, off + j), xj = kcu_ld(x, off + j), wj = kcu_ld(w, j);
            // dx += rf * (dy * w) - x * c
            const float g = __fsub_rn(__fmul_rn(rf, __fmul_rn(dyj, wj)), __fmul_rn(xj, c));
            kcu_st(dx, off + j, __fadd_rn(kcu_ld(dx, off + j), g));
            dwp[j] += (float)((double)dyj * (double)xj * r);
        }
    }
    for (int j = threadIdx.x; j < dim; j += blockDim.x) atomicAdd(dw + j, dwp[j]);
}

static int norm_check(fsdp_dtype dt, int64_t n, int dim, const char *what, fsdp_err *err) {
    if (kcu_check_dt(dt, what, err)) return FSDP_E_INVALID;
    if (n < 0 || dim <= 0) return fsdp_err_set(err, FSDP_E_INVALID, "%s: bad sizes (n %lld, dim %d)", what, (long long)n, dim);
    return FSDP_OK;
}

KCU_API int kcu_rmsnorm_forward(fsdp_dtype dt, const void *x, const void *w, void *y, float *rstd, int64_t n,
                                int dim, float eps, kcu_stream stream, fsdp_err *err) {
    if (norm_check(dt, n, dim, "kcu_rmsnorm_forward", err)) return FSDP_E_INVALID;
    if (n == 0) return FSDP_OK;
    const unsigned blocks = n > (1 << 20) ? (1u << 20) : (unsigned)n;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(rmsnorm_fwd<T>, blocks, row_threads(dim), 0, stream)((const T *)x, (const T *)w, (T *)y,
                                                                                 rstd, n, dim, eps));
    return kcu_launch_check(err, "kcu_rmsnorm_forward");
}

KCU_API int kcu_rmsnorm_apply(fsdp_dtype dt, const void *x, const void *w, const float *rstd, void *y, int64_t n,
                              int dim, kcu_stream stream, fsdp_err *err) {
    if (norm_check(dt, n, dim, "kcu_rmsnorm_apply", err)) return FSDP_E_INVALID;
    if (n > INT64_MAX / dim)
        return fsdp_err_set(err, FSDP_E_INVALID, "kcu_rmsnorm_apply: %lld rows of %d overflow", (long long)n, dim);
    if (n == 0) return FSDP_OK;
    const int threads = 256;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(rmsnorm_apply<T>, kcu_blocks(n * dim, threads), threads, 0, stream)(
                     (const T *)x, (const T *)w, rstd, (T *)y, n, dim));
    return kcu_launch_check(err, "kcu_rmsnorm_apply");
}

KCU_API int kcu_rmsnorm_backward(fsdp_dtype dt, const void *dy, const void *x, const void *w, const float *rstd,
                                 void *dx, float *dw, int64_t n, int dim, kcu_stream stream, fsdp_err *err) {
    if (norm_check(dt, n, dim, "kcu_rmsnorm_backward", err)) return FSDP_E_INVALID;
    const size_t smem = (size_t)dim * sizeof(float);
    if (smem > 200 * 1024)
        return fsdp_err_set(err, FSDP_E_INVALID, "kcu_rmsnorm_backward: dim %d is too large (at most %d)", dim,
                            200 * 1024 / 4);
    if (n == 0) return FSDP_OK;
    const int64_t blocks = (n + KCU_NORM_ROWS - 1) / KCU_NORM_ROWS;
    if (blocks > INT32_MAX) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_rmsnorm_backward: too many rows %lld", (long long)n);
    int rc = FSDP_OK;
    KCU_DISPATCH(dt, T, {
        rc = kcu_smem_optin(rmsnorm_bwd<T>, smem, "kcu_rmsnorm_backward: cudaFuncSetAttribute", err);
        if (!rc)
            KCU_LAUNCH(rmsnorm_bwd<T>, (unsigned)blocks, row_threads(dim), smem, stream)(
                (const T *)dy, (const T *)x, (const T *)w, rstd, (T *)dx, dw, n, dim);
    });
    return rc ? rc : kcu_launch_check(err, "kcu_rmsnorm_backward");
}

// ---- bias gradient: column sums -------------------------------------------------------------------------

// One thread per column, its rows summed in double in row order (kc_bias_backward's order): no
// atomics, the same bits as the CPU kernel.
template <class T>
__global__ void bias_bwd(const T *dy, float *db, int64_t n, int out) {
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < out; j += gridDim.x * blockDim.x) {
        double acc = 0.0;
        for (int64_t i = 0; i < n; i++) acc += (double)kcu_ld(dy, (size_t)i * out + j);
        db[j] = __fadd_rn(db[j], (float)acc);
    }
}

KCU_API int kcu_bias_backward(fsdp_dtype dt, const void *dy, float *db, int64_t n, int out, kcu_stream stream,
                              fsdp_err *err) {
    if (norm_check(dt, n, out, "kcu_bias_backward", err)) return FSDP_E_INVALID;
    if (n == 0) return FSDP_OK;
    const int threads = 128;
    const unsigned blocks = (unsigned)((out + threads - 1) / threads);
    KCU_DISPATCH(dt, T, KCU_LAUNCH(bias_bwd<T>, blocks, threads, 0, stream)((const T *)dy, db, n, out));
    return kcu_launch_check(err, "kcu_bias_backward");
}

// ---- cross-entropy ------------------------------------------------------------------------------------

// d(loss)/d(logits) of one labelled row from its float lse: scale * (softmax - onehot(lab)).
template <class T>
__device__ void xent_row_grad(const T *logits, size_t off, int vocab, int lab, float lse, float scale, T *dlogits) {
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        float v = __fmul_rn(expf(__fsub_rn(kcu_ld(logits, off + j), lse)), scale);
        if (j == lab) v = __fsub_rn(v, scale);
        kcu_st(dlogits, off + j, v);
    }
}

template <class T>
__global__ void xent_bwd(const T *logits, const int32_t *labels, const float *lse, T *dlogits, int64_t n, int vocab,
                         int ignore_index, float scale) {
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int32_t lab = labels[i];
        const size_t off = (size_t)i * vocab;
        if (lab == ignore_index || lab < 0 || lab >= vocab) {
            for (int j = threadIdx.x; j < vocab; j += blockDim.x) kcu_st(dlogits, off + j, 0.0f);
            continue;
        }
        xent_row_grad(logits, off, vocab, lab, lse[i], scale, dlogits);
    }
}

KCU_API int kcu_xent_backward(fsdp_dtype dt, const void *logits, const int32_t *labels, const float *lse,
                              void *dlogits, int64_t n, int vocab, int ignore_index, float scale, kcu_stream stream,
                              fsdp_err *err) {
    if (norm_check(dt, n, vocab, "kcu_xent_backward", err)) return FSDP_E_INVALID;
    if (n == 0) return FSDP_OK;
    const unsigned blocks = n > (1 << 20) ? (1u << 20) : (unsigned)n;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(xent_bwd<T>, blocks, 256, 0, stream)((const T *)logits, labels, lse, (T *)dlogits, n, vocab,
                                                         ignore_index, scale));
    return kcu_launch_check(err, "kcu_xent_backward");
}

// ---- cross-entropy on a chunk of rows: forward and, optionally, backward in one pass ----------------

// Per row the lse (double sum of exp, rounded to float) and the loss sums; when dlogits is set, also
// xent_bwd's gradient from the same float lse, so a chunk gives the separate forward and backward's
// results bit for bit (kcu_xent_forward is this kernel without dlogits). The label's logit is read
// before the first block reduction: with dlogits == logits another thread may overwrite it in the
// last pass.
template <class T>
__global__ void xent_chunk(const T *logits, const int32_t *labels, int64_t n, int vocab, int ignore_index,
                           float scale, float *lse, double *sums, int *d_bad, T *dlogits) {
    KCU_SHARED(float, shf, 32);
    KCU_SHARED(double, shd, 32);
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int32_t lab = labels[i]; // uniform over the block
        const size_t off = (size_t)i * vocab;
        if (lab == ignore_index || lab < 0 || lab >= vocab) {
            if (threadIdx.x == 0) {
                lse[i] = 0.0f;
                if (lab != ignore_index) kcu_set_bad(d_bad, i);
            }
            if (dlogits)
                for (int j = threadIdx.x; j < vocab; j += blockDim.x) kcu_st(dlogits, off + j, 0.0f);
            continue;
        }
        const float xl = kcu_ld(logits, off + lab);
        float mx = -INFINITY;
        for (int j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, kcu_ld(logits, off + j));
        mx = kcu_block_max(mx, shf);
        double s = 0.0;
        for (int j = threadIdx.x; j < vocab; j += blockDim.x) s += (double)expf(__fsub_rn(kcu_ld(logits, off + j), mx));
        s = kcu_block_sum(s, shd);
        const double l = (double)mx + log(s);
        const float lf = (float)l;
        if (threadIdx.x == 0) {
            lse[i] = lf;
            atomicAdd(sums, l - (double)xl);
            atomicAdd(sums + 1, 1.0);
        }
        if (dlogits) xent_row_grad(logits, off, vocab, lab, lf, scale, dlogits);
    }
}

KCU_API int kcu_xent_forward(fsdp_dtype dt, const void *logits, const int32_t *labels, int64_t n, int vocab,
                             int ignore_index, float *lse, double *d_sums, int *d_bad, kcu_stream stream,
                             fsdp_err *err) {
    if (norm_check(dt, n, vocab, "kcu_xent_forward", err)) return FSDP_E_INVALID;
    cudaError_t e = cudaMemsetAsync(d_sums, 0, 2 * sizeof(double), stream);
    if (e != cudaSuccess) return kcu_cuda_fail(err, e, "kcu_xent_forward: cudaMemsetAsync");
    if (n == 0) return FSDP_OK;
    const unsigned blocks = n > (1 << 20) ? (1u << 20) : (unsigned)n;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(xent_chunk<T>, blocks, 256, 0, stream)((const T *)logits, labels, n, vocab, ignore_index,
                                                           0.0f, lse, d_sums, d_bad, (T *)NULL));
    return kcu_launch_check(err, "kcu_xent_forward");
}

KCU_API int kcu_xent_chunk(fsdp_dtype dt, const void *logits, const int32_t *labels, int64_t n, int vocab,
                           int ignore_index, float scale, float *lse, double *d_sums, int *d_bad, void *dlogits,
                           kcu_stream stream, fsdp_err *err) {
    if (norm_check(dt, n, vocab, "kcu_xent_chunk", err)) return FSDP_E_INVALID;
    if (n == 0) return FSDP_OK;
    const unsigned blocks = n > (1 << 20) ? (1u << 20) : (unsigned)n;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(xent_chunk<T>, blocks, 256, 0, stream)((const T *)logits, labels, n, vocab, ignore_index,
                                                           scale, lse, d_sums, d_bad, (T *)dlogits));
    return kcu_launch_check(err, "kcu_xent_chunk");
}
