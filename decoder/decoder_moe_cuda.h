/* The mixture-of-experts feed-forward on the GPU (module prefix decoder_moe_cuda_): kernels/cpu/kc_moe.h's
 * computation on device pointers, with the kcu_moe_* kernels (kernels/cuda/kcu.h) and the cuBLASLt
 * GEMMs of runtime/device_gemm.h, all on the device context's compute stream. Shapes, the routing rule
 * (ties: the lower expert), the slot order (expert, token, k) and every formula are kc_moe.h's.
 *
 * Storage: x, out, dout, dx, the weights (router [E,d], w1/w3 [E,F,d], w2 [E,d,F]) and the saved expert
 * activations (xs, a, b, g, y) have dtype dt (FSDP_DT_F32, or FSDP_DT_BF16 for bf16 compute with float32
 * accumulation); the router logits, probabilities, routing weights and every weight gradient are float32.
 * Weight gradients ACCUMULATE (+=); dx is overwritten.
 *
 * Expert GEMMs: a loop over the experts, each a cuBLASLt GEMM (dev_linear_*) on its contiguous range of
 * slots; an expert that receives no token launches nothing. Launching them needs the expert counts on
 * the host, so decoder_moe_cuda_forward synchronises the host with the compute stream ONCE, after the
 * routing and the counting sort: it downloads offsets [E+1] and the router's bad-row flag (one
 * E+2-int copy). The host copy of offsets is kept in the activations (host_offsets), so the backward
 * does not synchronise. (cuBLAS's grouped GEMM, cublasGemmGroupedBatchedEx, also takes its per-group
 * sizes in host arrays; only a custom device-side grouped GEMM reading the offsets on the device would
 * avoid the copy.) The same copy lets the forward report a non-finite router logit as kc_moe_forward
 * does (FSDP_E_NUMERIC naming the lowest such token), before any expert GEMM runs.
 *
 * Deterministic: no float atomics; the combine sums every token's K expert outputs in k order. */
#ifndef FSDP_DECODER_DECODER_MOE_CUDA_H
#define FSDP_DECODER_DECODER_MOE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/tensor.h"
#include "kernels/cpu/kc_moe.h"
#include "runtime/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the forward saves for the backward (device memory unless said otherwise; nK = n*K). */
typedef struct decoder_moe_cuda_acts {
    float *logits;        /* [n, E]  router logits (float32) */
    float *probs;         /* [n, E]  their softmax */
    int32_t *top;         /* [n, K]  chosen experts, descending probability */
    float *topw;          /* [n, K]  their weights (renormalised when norm_topk) */
    int32_t *slot_of;     /* [nK]    pair t*K+k -> its slot */
    int32_t *pair_of;     /* [nK]    slot -> pair */
    int32_t *offsets;     /* [E+2]   expert e's slots are offsets[e] .. offsets[e+1]-1; [E+1]: the bad-row flag */
    int32_t *sort_scratch; /* kcu_moe_sort_scratch_ints */
    void *xs;             /* [nK, d] the input rows in slot order (dtype dt) */
    void *a, *b, *g;      /* [nK, F] w1 and w3 outputs, silu(a) * b (dtype dt) */
    void *y;              /* [nK, d] expert outputs before the routing weight (dtype dt) */
    int32_t *host_offsets; /* HOST [E+2]: the forward's copy of offsets (and flag), read by the backward */
} decoder_moe_cuda_acts;

/* Scratch of the backward (device), overwritten by every call. */
typedef struct decoder_moe_cuda_scratch {
    void *dys;       /* [nK, d] (dtype dt) */
    void *dg;        /* [nK, F] (dtype dt) */
    void *da, *db;   /* [nK, F] (dtype dt) */
    void *dxs;       /* [nK, d] (dtype dt) */
    float *dtopw;    /* [nK] */
    float *dp;       /* [n, E] */
    float *dlogits;  /* [n, E] */
    void *dlogits_dt; /* [n, E] dlogits in dtype dt for the router GEMMs (== dlogits when dt is float32) */
} decoder_moe_cuda_scratch;

/* Bytes of device memory of the activations and of the scratch for dims m and dtype dt (each
 * sub-buffer 256-byte aligned); 0 on bad dims or dtype. */
size_t decoder_moe_cuda_acts_bytes(const kc_moe_dims *m, fsdp_dtype dt);
size_t decoder_moe_cuda_scratch_bytes(const kc_moe_dims *m, fsdp_dtype dt);
/* Points a (s) into dev_base, which holds decoder_moe_cuda_acts_bytes (_scratch_bytes) bytes;
 * host_offsets: E+2 ints of host memory (pinned or not) that the forward fills. */
int decoder_moe_cuda_acts_bind(const kc_moe_dims *m, fsdp_dtype dt, void *dev_base, int32_t *host_offsets,
                               decoder_moe_cuda_acts *a, fsdp_err *err);
int decoder_moe_cuda_scratch_bind(const kc_moe_dims *m, fsdp_dtype dt, void *dev_base, decoder_moe_cuda_scratch *s,
                                  fsdp_err *err);

/* out [n, d] = the MoE feed-forward of x (overwritten); fills a (device and a->host_offsets).
 * FSDP_E_INVALID on bad dims; FSDP_E_NUMERIC on a router logit that is not finite (the error names the
 * lowest such token, as kc_moe_forward's; out is then not written). Synchronises the host with the compute stream once (see above). */
int decoder_moe_cuda_forward(dev_ctx *d, fsdp_dtype dt, const kc_moe_dims *m, const void *x, const void *router,
                             const void *w1, const void *w2, const void *w3, decoder_moe_cuda_acts *a, void *out,
                             fsdp_err *err);

/* kc_moe_stats on the device: d_counts[e] += pairs routed to e, d_psum[e] += sum over tokens of
 * p[t][e] (device doubles [E]). Nothing synchronises. */
int decoder_moe_cuda_stats(dev_ctx *d, const kc_moe_dims *m, const decoder_moe_cuda_acts *a, double *d_counts,
                           double *d_psum, fsdp_err *err);

/* Backward of decoder_moe_cuda_forward (after it, with the same a) for the loss whose gradient with
 * respect to out is dout [n, d]: dx [n, d] overwritten; drouter [E,d], dw1, dw3 [E,F,d], dw2 [E,d,F]
 * (float32) accumulated; d_dp_aux [E] (device float32, may be NULL: kc_moe_aux's gradient) added to
 * dL/dp[t][e] for every token. Routing choices are not differentiated. No host synchronisation. */
int decoder_moe_cuda_backward(dev_ctx *d, fsdp_dtype dt, const kc_moe_dims *m, const void *dout, const void *x,
                              const void *router, const void *w1, const void *w2, const void *w3,
                              const decoder_moe_cuda_acts *a, const float *d_dp_aux, decoder_moe_cuda_scratch *s,
                              void *dx, float *drouter, float *dw1, float *dw2, float *dw3, fsdp_err *err);

/* ---- the phases of the two calls above, for expert parallelism to move rows between them ---------
 * forward = route (router, top-k, sort, the offsets' one host copy, gather into a->xs), experts_forward
 * (every expert on its slots), kcu_moe_combine; backward = backward_router (combine's and the router's
 * backward, dx = dlogits router, s->dys written), experts_backward, kcu_moe_combine of s->dxs into dx. */
int decoder_moe_cuda_route(dev_ctx *d, fsdp_dtype dt, const kc_moe_dims *m, const void *x, const void *router,
                           decoder_moe_cuda_acts *a, fsdp_err *err);
/* n_experts experts (w1, w3 [n_experts, F, d], w2 [n_experts, d, F]) on their rows off[e] .. off[e+1]-1
 * (off: a HOST array of n_experts + 1) of xs: a, b, g [rows, F] and y [rows, d] overwritten (dtype dt). */
int decoder_moe_cuda_experts_forward(dev_ctx *d, fsdp_dtype dt, int dim, int F, int n_experts, const int32_t *off,
                                     const void *xs, const void *w1, const void *w2, const void *w3, void *a, void *b,
                                     void *g, void *y, fsdp_err *err);
/* Their backward from dys [rows, d]: dg, da, db [rows, F] and dxs [rows, d] overwritten, dw1, dw2, dw3 (float32)
 * accumulated. */
int decoder_moe_cuda_experts_backward(dev_ctx *d, fsdp_dtype dt, int dim, int F, int n_experts, const int32_t *off,
                                      const void *dys, const void *xs, const void *w1, const void *w2, const void *w3,
                                      const void *a, const void *b, const void *g, void *dg, void *da, void *db,
                                      void *dxs, float *dw1, float *dw2, float *dw3, fsdp_err *err);
int decoder_moe_cuda_backward_router(dev_ctx *d, fsdp_dtype dt, const kc_moe_dims *m, const void *dout,
                                     const void *x, const void *router, const decoder_moe_cuda_acts *a,
                                     const float *d_dp_aux, decoder_moe_cuda_scratch *s, void *dx, float *drouter,
                                     fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
