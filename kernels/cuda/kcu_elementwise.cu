// Elementwise kernels: casts, add, scale, sum of squares, SwiGLU, RoPE (one tensor, or q and k in one
// launch), embedding.
// Float operations use the _rn intrinsics where the CPU kernel's order of operations is mirrored,
// so that the compiler does not contract them into fused multiply-adds.
#include "kernels/cuda/kcu_common.cuh"

#define KCU_THREADS 256

// ---- casts, add, scale, sumsq ----------------------------------------------------------------------

__global__ void cast_f32_bf16(kcu_bf16 *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i].bits = kcu_f2bf(src[i]);
}

__global__ void cast_bf16_f32(float *dst, const kcu_bf16 *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = kcu_bf2f(src[i].bits);
}

KCU_API int kcu_cast(void *dst, fsdp_dtype dst_dt, const void *src, fsdp_dtype src_dt, int64_t n,
                     kcu_stream stream, fsdp_err *err) {
    if (n < 0) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_cast: negative length %lld", (long long)n);
    if (kcu_check_dt(dst_dt, "kcu_cast", err) || kcu_check_dt(src_dt, "kcu_cast", err)) return FSDP_E_INVALID;
    if (n == 0) return FSDP_OK;
    if (dst_dt == src_dt) {
        cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)n * fsdp_dtype_size(dst_dt), cudaMemcpyDeviceToDevice, stream);
        return e == cudaSuccess ? FSDP_OK : kcu_cuda_fail(err, e, "kcu_cast: cudaMemcpyAsync");
    }
    if (dst_dt == FSDP_DT_BF16)
        KCU_LAUNCH(cast_f32_bf16, kcu_blocks(n, KCU_THREADS), KCU_THREADS, 0, stream)((kcu_bf16 *)dst,
                                                                                      (const float *)src, n);
    else
        KCU_LAUNCH(cast_bf16_f32, kcu_blocks(n, KCU_THREADS), KCU_THREADS, 0, stream)((float *)dst,
                                                                                      (const kcu_bf16 *)src, n);
    return kcu_launch_check(err, "kcu_cast");
}

template <class T>
__global__ void add_kernel(const T *a, const T *b, T *out, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        kcu_st(out, i, __fadd_rn(kcu_ld(a, i), kcu_ld(b, i)));
}

KCU_API int kcu_add(fsdp_dtype dt, const void *a, const void *b, void *out, int64_t n, kcu_stream stream,
                    fsdp_err *err) {
    if (kcu_check_dt(dt, "kcu_add", err)) return FSDP_E_INVALID;
    if (n < 0) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_add: negative length %lld", (long long)n);
    if (n == 0) return FSDP_OK;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(add_kernel<T>, kcu_blocks(n, KCU_THREADS), KCU_THREADS, 0, stream)(
                     (const T *)a, (const T *)b, (T *)out, n));
    return kcu_launch_check(err, "kcu_add");
}

__global__ void acc_f64_kernel(double *acc, const double *x, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        acc[i] = __dadd_rn(acc[i], x[i]);
}

KCU_API int kcu_acc_f64(double *acc, const double *x, int64_t n, kcu_stream stream, fsdp_err *err) {
    if (n < 0) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_acc_f64: negative length %lld", (long long)n);
    if (n == 0) return FSDP_OK;
    KCU_LAUNCH(acc_f64_kernel, kcu_blocks(n, KCU_THREADS), KCU_THREADS, 0, stream)(acc, x, n);
    return kcu_launch_check(err, "kcu_acc_f64");
}

__global__ void scale_kernel(float *x, int64_t n, float s) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], s);
}

KCU_API int kcu_scale(float *x, int64_t n, float s, kcu_stream stream, fsdp_err *err) {
    if (n < 0) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_scale: negative length %lld", (long long)n);
    if (n == 0) return FSDP_OK;
    KCU_LAUNCH(scale_kernel, kcu_blocks(n, KCU_THREADS), KCU_THREADS, 0, stream)(x, n, s);
    return kcu_launch_check(err, "kcu_scale");
}

template <class T>
__global__ void sumsq_kernel(const T *x, int64_t n, double *out) {
    KCU_SHARED(double, sh, 32);
    double s = 0.0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double v = kcu_ld(x, i);
        s += v * v;
    }
    s = kcu_block_sum(s, sh);
    if (threadIdx.x == 0) atomicAdd(out, s);
}

KCU_API int kcu_sumsq(fsdp_dtype dt, const void *x, int64_t n, double *d_out, kcu_stream stream, fsdp_err *err) {
    if (kcu_check_dt(dt, "kcu_sumsq", err)) return FSDP_E_INVALID;
    if (n < 0) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_sumsq: negative length %lld", (long long)n);
    cudaError_t e = cudaMemsetAsync(d_out, 0, sizeof(double), stream);
    if (e != cudaSuccess) return kcu_cuda_fail(err, e, "kcu_sumsq: cudaMemsetAsync");
    if (n == 0) return FSDP_OK;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(sumsq_kernel<T>, kcu_blocks(n, KCU_THREADS, 1024), KCU_THREADS, 0, stream)(
                     (const T *)x, n, d_out));
    return kcu_launch_check(err, "kcu_sumsq");
}

// ---- bias of a linear layer --------------------------------------------------------------------------

template <class T>
__global__ void bias_fwd(T *y, const T *b, int64_t n, int out) {
    const int64_t total = n * out;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x)
        kcu_st(y, (size_t)idx, __fadd_rn(kcu_ld(y, (size_t)idx), kcu_ld(b, (size_t)(idx % out))));
}

KCU_API int kcu_bias_forward(fsdp_dtype dt, void *y, const void *b, int64_t n, int out, kcu_stream stream,
                             fsdp_err *err) {
    if (kcu_check_dt(dt, "kcu_bias_forward", err)) return FSDP_E_INVALID;
    if (n < 0 || out <= 0 || n > INT64_MAX / out)
        return fsdp_err_set(err, FSDP_E_INVALID, "kcu_bias_forward: bad sizes (n %lld, out %d)", (long long)n, out);
    if (n == 0) return FSDP_OK;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(bias_fwd<T>, kcu_blocks(n * out, KCU_THREADS), KCU_THREADS, 0, stream)(
                     (T *)y, (const T *)b, n, out));
    return kcu_launch_check(err, "kcu_bias_forward");
}

// ---- SwiGLU ----------------------------------------------------------------------------------------

template <class T>
__global__ void swiglu_fwd(const T *a, const T *b, T *out, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float ai = kcu_ld(a, i);
        float silu = __fdiv_rn(ai, __fadd_rn(1.0f, expf(-ai)));
        kcu_st(out, i, __fmul_rn(silu, kcu_ld(b, i)));
    }
}

template <class T>
__global__ void swiglu_bwd(const T *a, const T *b, const T *dout, T *da, T *db, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float ai = kcu_ld(a, i), bi = kcu_ld(b, i), go = kcu_ld(dout, i);
        float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-ai)));
        // da = go * b * sig * (1 + a * (1 - sig)); db = go * (a * sig)
        float t = __fadd_rn(1.0f, __fmul_rn(ai, __fsub_rn(1.0f, sig)));
        kcu_st(da, i, __fmul_rn(__fmul_rn(__fmul_rn(go, bi), sig), t));
        kcu_st(db, i, __fmul_rn(go, __fmul_rn(ai, sig)));
    }
}

// swiglu_bwd that also rewrites out = silu(a) * b with swiglu_fwd's operations.
template <class T>
__global__ void swiglu_bwd_recompute(const T *a, const T *b, const T *dout, T *da, T *db, T *out, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float ai = kcu_ld(a, i), bi = kcu_ld(b, i), go = kcu_ld(dout, i);
        float den = __fadd_rn(1.0f, expf(-ai));
        float sig = __fdiv_rn(1.0f, den);
        kcu_st(out, i, __fmul_rn(__fdiv_rn(ai, den), bi));
        float t = __fadd_rn(1.0f, __fmul_rn(ai, __fsub_rn(1.0f, sig)));
        kcu_st(da, i, __fmul_rn(__fmul_rn(__fmul_rn(go, bi), sig), t));
        kcu_st(db, i, __fmul_rn(go, __fmul_rn(ai, sig)));
    }
}

KCU_API int kcu_swiglu_forward(fsdp_dtype dt, const void *a, const void *b, void *out, int64_t n, kcu_stream stream,
                               fsdp_err *err) {
    if (kcu_check_dt(dt, "kcu_swiglu_forward", err)) return FSDP_E_INVALID;
    if (n < 0) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_swiglu_forward: negative length %lld", (long long)n);
    if (n == 0) return FSDP_OK;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(swiglu_fwd<T>, kcu_blocks(n, KCU_THREADS), KCU_THREADS, 0, stream)(
                     (const T *)a, (const T *)b, (T *)out, n));
    return kcu_launch_check(err, "kcu_swiglu_forward");
}

KCU_API int kcu_swiglu_backward(fsdp_dtype dt, const void *a, const void *b, const void *dout, void *da, void *db,
                                int64_t n, kcu_stream stream, fsdp_err *err) {
    if (kcu_check_dt(dt, "kcu_swiglu_backward", err)) return FSDP_E_INVALID;
    if (n < 0) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_swiglu_backward: negative length %lld", (long long)n);
    if (n == 0) return FSDP_OK;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(swiglu_bwd<T>, kcu_blocks(n, KCU_THREADS), KCU_THREADS, 0, stream)(
                     (const T *)a, (const T *)b, (const T *)dout, (T *)da, (T *)db, n));
    return kcu_launch_check(err, "kcu_swiglu_backward");
}

KCU_API int kcu_swiglu_backward_recompute(fsdp_dtype dt, const void *a, const void *b, const void *dout, void *da,
                                          void *db, void *out, int64_t n, kcu_stream stream, fsdp_err *err) {
    if (kcu_check_dt(dt, "kcu_swiglu_backward_recompute", err)) return FSDP_E_INVALID;
    if (n < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "kcu_swiglu_backward_recompute: negative length %lld", (long long)n);
    if (n == 0) return FSDP_OK;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(swiglu_bwd_recompute<T>, kcu_blocks(n, KCU_THREADS), KCU_THREADS, 0, stream)(
                     (const T *)a, (const T *)b, (const T *)dout, (T *)da, (T *)db, (T *)out, n));
    return kcu_launch_check(err, "kcu_swiglu_backward_recompute");
}

// ---- RoPE on interleaved pairs ---------------------------------------------------------------------

// Rotates pair idx (row * nh + head, j) of x [B*T, nh, 2*half] in place.
template <class T>
__device__ __forceinline__ void rope_pair(T *x, int64_t idx, const float *cos_t, const float *sin_t, int T_, int nh,
                                          int half, float sign) {
    const int j = (int)(idx % half);
    const int64_t rh = idx / half; // row * nh + head
    const int t = (int)((rh / nh) % T_);
    const size_t o = (size_t)rh * (size_t)(2 * half) + 2 * (size_t)j;
    const float c = cos_t[(size_t)t * half + j], s = sign * sin_t[(size_t)t * half + j];
    const float a = kcu_ld(x, o), b = kcu_ld(x, o + 1);
    kcu_st(x, o, __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    kcu_st(x, o + 1, __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
}

template <class T>
__global__ void rope_kernel(T *x, const float *cos_t, const float *sin_t, int64_t pairs, int T_, int nh, int half,
                            float sign) {
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < pairs;
         idx += (int64_t)gridDim.x * blockDim.x)
        rope_pair(x, idx, cos_t, sin_t, T_, nh, half, sign);
}

// q and k in one launch: pairs [0, pairs_q) are q's (H heads), the rest k's (KV heads); each pair
// gets rope_kernel's exact operations.
template <class T>
__global__ void rope_qk_kernel(T *q, T *k, const float *cos_t, const float *sin_t, int64_t pairs_q, int64_t pairs,
                               int T_, int H, int KV, int half, float sign) {
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < pairs;
         idx += (int64_t)gridDim.x * blockDim.x) {
        if (idx < pairs_q) rope_pair(q, idx, cos_t, sin_t, T_, H, half, sign);
        else rope_pair(k, idx - pairs_q, cos_t, sin_t, T_, KV, half, sign);
    }
}

static int rope_launch(fsdp_dtype dt, void *x, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd,
                       float sign, kcu_stream stream, const char *what, fsdp_err *err) {
    if (kcu_check_dt(dt, what, err)) return FSDP_E_INVALID;
    if (B <= 0 || T <= 0 || nh <= 0 || hd <= 0 || hd % 2)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: sizes must be positive with an even head_dim (B %d, T %d, heads %d, "
                            "head_dim %d)", what, B, T, nh, hd);
    const int64_t pairs = (int64_t)B * T * nh * (hd / 2);
    KCU_DISPATCH(dt, Tp,
                 KCU_LAUNCH(rope_kernel<Tp>, kcu_blocks(pairs, KCU_THREADS), KCU_THREADS, 0, stream)(
                     (Tp *)x, cos_t, sin_t, pairs, T, nh, hd / 2, sign));
    return kcu_launch_check(err, what);
}

KCU_API int kcu_rope_forward(fsdp_dtype dt, void *x, const float *cos_t, const float *sin_t, int B, int T, int nh,
                             int head_dim, kcu_stream stream, fsdp_err *err) {
    return rope_launch(dt, x, cos_t, sin_t, B, T, nh, head_dim, 1.0f, stream, "kcu_rope_forward", err);
}

KCU_API int kcu_rope_backward(fsdp_dtype dt, void *dx, const float *cos_t, const float *sin_t, int B, int T, int nh,
                              int head_dim, kcu_stream stream, fsdp_err *err) {
    return rope_launch(dt, dx, cos_t, sin_t, B, T, nh, head_dim, -1.0f, stream, "kcu_rope_backward", err);
}

static int rope_qk_launch(fsdp_dtype dt, void *q, void *k, const float *cos_t, const float *sin_t, int B, int T,
                          int H, int KV, int hd, float sign, kcu_stream stream, const char *what, fsdp_err *err) {
    if (kcu_check_dt(dt, what, err)) return FSDP_E_INVALID;
    if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || hd <= 0 || hd % 2)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "%s: sizes must be positive with an even head_dim (B %d, T %d, q heads %d, k heads %d, "
                            "head_dim %d)",
                            what, B, T, H, KV, hd);
    const int64_t pairs_q = (int64_t)B * T * H * (hd / 2), pairs = pairs_q + (int64_t)B * T * KV * (hd / 2);
    KCU_DISPATCH(dt, Tp,
                 KCU_LAUNCH(rope_qk_kernel<Tp>, kcu_blocks(pairs, KCU_THREADS), KCU_THREADS, 0, stream)(
                     (Tp *)q, (Tp *)k, cos_t, sin_t, pairs_q, pairs, T, H, KV, hd / 2, sign));
    return kcu_launch_check(err, what);
}

KCU_API int kcu_rope_qk_forward(fsdp_dtype dt, void *q, void *k, const float *cos_t, const float *sin_t, int B, int T,
                                int H, int KV, int head_dim, kcu_stream stream, fsdp_err *err) {
    return rope_qk_launch(dt, q, k, cos_t, sin_t, B, T, H, KV, head_dim, 1.0f, stream, "kcu_rope_qk_forward", err);
}

KCU_API int kcu_rope_qk_backward(fsdp_dtype dt, void *dq, void *dk, const float *cos_t, const float *sin_t, int B,
                                 int T, int H, int KV, int head_dim, kcu_stream stream, fsdp_err *err) {
    return rope_qk_launch(dt, dq, dk, cos_t, sin_t, B, T, H, KV, head_dim, -1.0f, stream, "kcu_rope_qk_backward", err);
}

// ---- embedding -----------------------------------------------------------------------------------------

template <class T>
__global__ void embedding_fwd(const T *table, const int32_t *tokens, T *out, int64_t n, int vocab, int dim,
                              int *d_bad) {
    const int64_t total = n * dim;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = idx / dim;
        const int j = (int)(idx % dim);
        const int32_t tok = tokens[i];
        if (tok < 0 || tok >= vocab) {
            kcu_st(out, (size_t)idx, 0.0f);
            if (j == 0) kcu_set_bad(d_bad, i);
            continue;
        }
        kcu_st(out, (size_t)idx, kcu_ld(table, (size_t)tok * dim + j));
    }
}

template <class T>
__global__ void embedding_bwd(const T *dout, const int32_t *tokens, float *dtable, int64_t n, int vocab, int dim,
                              int padding_idx, int *d_bad) {
    const int64_t total = n * dim;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = idx / dim;
        const int j = (int)(idx % dim);
        const int32_t tok = tokens[i];
        if (tok < 0 || tok >= vocab) {
            if (j == 0) kcu_set_bad(d_bad, i);
            continue;
        }
        if (tok == padding_idx) continue;
        atomicAdd(dtable + (size_t)tok * dim + j, kcu_ld(dout, (size_t)idx));
    }
}

static int embedding_check(fsdp_dtype dt, int64_t n, int vocab, int dim, const char *what, fsdp_err *err) {
    if (kcu_check_dt(dt, what, err)) return FSDP_E_INVALID;
    if (n < 0 || vocab <= 0 || dim <= 0 || n > INT64_MAX / dim)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: bad sizes (n %lld, vocab %d, dim %d)", what, (long long)n, vocab,
                            dim);
    return FSDP_OK;
}

KCU_API int kcu_embedding_forward(fsdp_dtype dt, const void *table, const int32_t *tokens, void *out, int64_t n,
                                  int vocab, int dim, int *d_bad, kcu_stream stream, fsdp_err *err) {
    if (embedding_check(dt, n, vocab, dim, "kcu_embedding_forward", err)) return FSDP_E_INVALID;
    if (n == 0) return FSDP_OK;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(embedding_fwd<T>, kcu_blocks(n * dim, KCU_THREADS), KCU_THREADS, 0, stream)(
                     (const T *)table, tokens, (T *)out, n, vocab, dim, d_bad));
    return kcu_launch_check(err, "kcu_embedding_forward");
}

KCU_API int kcu_embedding_backward(fsdp_dtype dt, const void *dout, const int32_t *tokens, float *dtable, int64_t n,
                                   int vocab, int dim, int padding_idx, int *d_bad, kcu_stream stream, fsdp_err *err) {
    if (embedding_check(dt, n, vocab, dim, "kcu_embedding_backward", err)) return FSDP_E_INVALID;
    if (padding_idx < -1 || padding_idx >= vocab)
        return fsdp_err_set(err, FSDP_E_INVALID, "kcu_embedding_backward: padding_idx %d, expected -1 (none) or 0 <= it "
                            "< vocab %d", padding_idx, vocab);
    if (n == 0) return FSDP_OK;
    KCU_DISPATCH(dt, T,
                 KCU_LAUNCH(embedding_bwd<T>, kcu_blocks(n * dim, KCU_THREADS), KCU_THREADS, 0, stream)(
                     (const T *)dout, tokens, dtable, n, vocab, dim, padding_idx, d_bad));
    return kcu_launch_check(err, "kcu_embedding_backward");
}
