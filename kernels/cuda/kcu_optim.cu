// Multi-tensor optimizer kernels: one launch covers every shard of a kcu_tensor_list. The list
// holds, on the device, the descriptors and the first block of each tensor (a tensor of n elements
// takes ceil(n / OPT_CHUNK) blocks); a block finds its tensor by binary search.
#include "kernels/cuda/kcu_common.cuh"

#include <math.h>
#include <stdlib.h>

#define OPT_CHUNK 4096
#define OPT_THREADS 256

struct kcu_tensor_list {
    kcu_tensor *d_tensors; // [count]
    int64_t *d_starts;     // [count + 1] first block of each tensor; d_starts[count] = blocks
    int count;
    int64_t blocks;
    int has_state; // every non-empty tensor has m and v
};

KCU_API int kcu_tensor_list_create(const kcu_tensor *t, int count, kcu_tensor_list **out, fsdp_err *err) {
    *out = NULL;
    if (count < 0 || (count > 0 && !t))
        return fsdp_err_set(err, FSDP_E_INVALID, "kcu_tensor_list_create: bad tensor count %d", count);
    int64_t *starts = (int64_t *)malloc(((size_t)count + 1) * sizeof(int64_t));
    if (!starts) return fsdp_err_set(err, FSDP_E_NOMEM, "kcu_tensor_list_create: out of host memory");
    int64_t blocks = 0;
    int has_state = 1;
    for (int i = 0; i < count; i++) {
        if (t[i].n < 0 || (t[i].n > 0 && (!t[i].p || !t[i].g))) {
            free(starts);
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "kcu_tensor_list_create: tensor %d has %lld elements and a NULL param or grad", i,
                                (long long)t[i].n);
        }
        if (t[i].n > 0 && (!t[i].m || !t[i].v)) has_state = 0;
        starts[i] = blocks;
        blocks += (t[i].n + OPT_CHUNK - 1) / OPT_CHUNK;
        if (blocks > INT32_MAX) {
            free(starts);
            return fsdp_err_set(err, FSDP_E_INVALID, "kcu_tensor_list_create: %d tensors are too large for one launch",
                                count);
        }
    }
    starts[count] = blocks;
    kcu_tensor_list *l = (kcu_tensor_list *)calloc(1, sizeof *l);
    if (!l) {
        free(starts);
        return fsdp_err_set(err, FSDP_E_NOMEM, "kcu_tensor_list_create: out of host memory");
    }
    l->count = count;
    l->blocks = blocks;
    l->has_state = has_state;
    cudaError_t e = cudaMalloc((void **)&l->d_starts, ((size_t)count + 1) * sizeof(int64_t));
    if (e == cudaSuccess && count > 0) e = cudaMalloc((void **)&l->d_tensors, (size_t)count * sizeof(kcu_tensor));
    if (e == cudaSuccess)
        e = cudaMemcpy(l->d_starts, starts, ((size_t)count + 1) * sizeof(int64_t), cudaMemcpyHostToDevice);
    if (e == cudaSuccess && count > 0)
        e = cudaMemcpy(l->d_tensors, t, (size_t)count * sizeof(kcu_tensor), cudaMemcpyHostToDevice);
    free(starts);
    if (e != cudaSuccess) {
        kcu_tensor_list_free(l);
        return kcu_cuda_fail(err, e, "kcu_tensor_list_create: cudaMalloc/cudaMemcpy of the descriptors");
    }
    *out = l;
    return FSDP_OK;
}

KCU_API void kcu_tensor_list_free(kcu_tensor_list *l) {
    if (!l) return;
    if (l->d_tensors) cudaFree(l->d_tensors);
    if (l->d_starts) cudaFree(l->d_starts);
    free(l);
}

// The tensor whose block range holds blk: the last t with starts[t] <= blk (non-empty, since
// starts[t + 1] > blk).
__device__ __forceinline__ int opt_find(const int64_t *starts, int count, int64_t blk) {
    int lo = 0, hi = count; // starts[lo] <= blk < starts[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (starts[mid] <= blk)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

struct adamw_consts {
    double decay, b1, w1, b2, w2, bc2_sqrt, eps, neg_step;
};

// kc_adamw_step's loop body, operation for operation in double (no contraction into FMAs), each of p, m
// and v rounded to float once.
__global__ void __launch_bounds__(OPT_THREADS)
    adamw_kernel(const kcu_tensor *ts, const int64_t *starts, int count, adamw_consts c, const float *guard) {
    if (guard && guard[1] != 0.0f) return; // a non-finite step: nothing changes
    const int64_t blk = blockIdx.x;
    const int t = opt_find(starts, count, blk);
    const kcu_tensor x = ts[t];
    const int64_t i0 = (blk - starts[t]) * OPT_CHUNK;
    const int64_t i1 = i0 + OPT_CHUNK < x.n ? i0 + OPT_CHUNK : x.n;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += OPT_THREADS) {
        const double gi = x.g[i];
        const double mi = __dadd_rn(__dmul_rn(c.b1, (double)x.m[i]), __dmul_rn(c.w1, gi));
        const double vi = __dadd_rn(__dmul_rn(c.b2, (double)x.v[i]), __dmul_rn(__dmul_rn(c.w2, gi), gi));
        const double denom = __dadd_rn(__ddiv_rn(__dsqrt_rn(vi), c.bc2_sqrt), c.eps);
        x.p[i] = (float)__dadd_rn(__dmul_rn((double)x.p[i], c.decay), __ddiv_rn(__dmul_rn(c.neg_step, mi), denom));
        x.m[i] = (float)mi;
        x.v[i] = (float)vi;
    }
}

__global__ void __launch_bounds__(OPT_THREADS)
    grad_sumsq_kernel(const kcu_tensor *ts, const int64_t *starts, int count, double *out) {
    KCU_SHARED(double, sh, 32);
    const int64_t blk = blockIdx.x;
    const int t = opt_find(starts, count, blk);
    const kcu_tensor x = ts[t];
    const int64_t i0 = (blk - starts[t]) * OPT_CHUNK;
    const int64_t i1 = i0 + OPT_CHUNK < x.n ? i0 + OPT_CHUNK : x.n;
    double s = 0.0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += OPT_THREADS) s += (double)x.g[i] * (double)x.g[i];
    s = kcu_block_sum(s, sh);
    if (threadIdx.x == 0) atomicAdd(out, s);
}

__global__ void __launch_bounds__(OPT_THREADS)
    grad_scale_kernel(const kcu_tensor *ts, const int64_t *starts, int count, float sc, const float *clip) {
    if (clip) {
        if (clip[1] != 0.0f || !(clip[0] < 1.0f)) return; // non-finite step, or no clipping needed
        sc = clip[0];
    }
    const int64_t blk = blockIdx.x;
    const int t = opt_find(starts, count, blk);
    const kcu_tensor x = ts[t];
    const int64_t i0 = (blk - starts[t]) * OPT_CHUNK;
    const int64_t i1 = i0 + OPT_CHUNK < x.n ? i0 + OPT_CHUNK : x.n;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += OPT_THREADS) x.g[i] = __fmul_rn(x.g[i], sc);
}

// kc_clip_coef on the device from the all-reduced statistics (one thread).
__global__ void clip_coef_kernel(const double *stats, double max_norm, float *clip) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const double sumsq = stats[1];
    const double norm = sumsq >= 0 ? sqrt(sumsq) : (double)NAN;
    const int finite = isfinite(stats[0]) && isfinite(norm);
    double c = 1.0;
    if (max_norm > 0) {
        c = max_norm / (norm + 1e-6);
        c = c < 1.0 ? c : 1.0;
    }
    clip[0] = finite ? (float)c : 1.0f;
    clip[1] = finite ? 0.0f : 1.0f;
}

KCU_API int kcu_clip_coef(const double *d_stats, double max_norm, float *d_clip, kcu_stream stream, fsdp_err *err) {
    if (!d_stats || !d_clip) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_clip_coef: no statistics or output");
    KCU_LAUNCH(clip_coef_kernel, 1, 32, 0, stream)(d_stats, max_norm, d_clip);
    return kcu_launch_check(err, "kcu_clip_coef");
}

KCU_API int kcu_adamw_step(const kcu_tensor_list *l, const kc_adamw_hparams *h, int64_t step, kcu_stream stream,
                           fsdp_err *err) {
    return kcu_adamw_step_guarded(l, h, step, NULL, stream, err);
}

KCU_API int kcu_adamw_step_guarded(const kcu_tensor_list *l, const kc_adamw_hparams *h, int64_t step,
                                   const float *d_clip, kcu_stream stream, fsdp_err *err) {
    if (!l || !h) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_adamw_step: no tensor list or hyperparameters");
    if (!l->has_state)
        return fsdp_err_set(err, FSDP_E_INVALID, "kcu_adamw_step: the tensor list has no exp_avg/exp_avg_sq buffers");
    if (step < 1) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_adamw_step: step %lld must be >= 1", (long long)step);
    if (l->blocks == 0) return FSDP_OK;
    // The constants of kc_adamw_step (kernels/cpu/kc_adamw.c), computed the same way on the host.
    adamw_consts c;
    c.decay = 1.0 - h->lr * h->weight_decay;
    c.b1 = h->beta1;
    c.w1 = 1.0 - h->beta1;
    c.b2 = h->beta2;
    c.w2 = 1.0 - h->beta2;
    c.bc2_sqrt = sqrt(1.0 - pow(h->beta2, (double)step));
    c.eps = h->eps;
    c.neg_step = -(h->lr / (1.0 - pow(h->beta1, (double)step)));
    KCU_LAUNCH(adamw_kernel, (unsigned)l->blocks, OPT_THREADS, 0, stream)(l->d_tensors, l->d_starts, l->count, c, d_clip);
    return kcu_launch_check(err, "kcu_adamw_step");
}

KCU_API int kcu_list_grad_sumsq(const kcu_tensor_list *l, double *d_out, kcu_stream stream, fsdp_err *err) {
    if (!l) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_list_grad_sumsq: no tensor list");
    cudaError_t e = cudaMemsetAsync(d_out, 0, sizeof(double), stream);
    if (e != cudaSuccess) return kcu_cuda_fail(err, e, "kcu_list_grad_sumsq: cudaMemsetAsync");
    if (l->blocks == 0) return FSDP_OK;
    KCU_LAUNCH(grad_sumsq_kernel, (unsigned)l->blocks, OPT_THREADS, 0, stream)(l->d_tensors, l->d_starts, l->count,
                                                                               d_out);
    return kcu_launch_check(err, "kcu_list_grad_sumsq");
}

KCU_API int kcu_list_grad_scale(const kcu_tensor_list *l, float s, kcu_stream stream, fsdp_err *err) {
    if (!l) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_list_grad_scale: no tensor list");
    if (l->blocks == 0) return FSDP_OK;
    KCU_LAUNCH(grad_scale_kernel, (unsigned)l->blocks, OPT_THREADS, 0, stream)(l->d_tensors, l->d_starts, l->count, s,
                                                                               (const float *)NULL);
    return kcu_launch_check(err, "kcu_list_grad_scale");
}

KCU_API int kcu_list_grad_scale_dev(const kcu_tensor_list *l, const float *d_clip, kcu_stream stream, fsdp_err *err) {
    if (!l || !d_clip) return fsdp_err_set(err, FSDP_E_INVALID, "kcu_list_grad_scale_dev: no tensor list or coefficient");
    if (l->blocks == 0) return FSDP_OK;
    KCU_LAUNCH(grad_scale_kernel, (unsigned)l->blocks, OPT_THREADS, 0, stream)(l->d_tensors, l->d_starts, l->count,
                                                                               1.0f, d_clip);
    return kcu_launch_check(err, "kcu_list_grad_scale_dev");
}
