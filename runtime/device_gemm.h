/* GEMMs on the GPU through cuBLASLt, row-major like kernels/cpu (kc_gemm, kc_linear_*), on the
 * context's compute stream.
 *
 * Two precisions:
 * - FSDP_DT_F32 inputs: float32 compute (CUBLAS_COMPUTE_32F, TF32 disabled) so results match the
 *   CPU kernels to about 1e-6 relative; C must be float32.
 * - FSDP_DT_BF16 inputs: bfloat16 A and B with float32 accumulation; C is bfloat16 or float32.
 *
 * Matmul descriptors and the heuristic's algorithm are cached per shape, transposition, dtype and
 * pointer alignment, so a training step after the first one makes no heuristic queries. */
#ifndef FSDP_RUNTIME_DEVICE_GEMM_H
#define FSDP_RUNTIME_DEVICE_GEMM_H

#include "fsdp/tensor.h"
#include "runtime/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Row-major C[M,N] = alpha * op(A) op(B) + beta * C (op = transpose when trans_* != 0).
 * A is [M,K] (or [K,M] when trans_a) with row stride lda, B is [K,N] (or [N,K]) with ldb.
 * Sizes must be positive and fit cuBLASLt; leading dimensions at least the row length. */
int dev_gemm(dev_ctx *d, int trans_a, int trans_b, int M, int N, int K, float alpha, fsdp_dtype ab_dt, const void *A,
             int lda, const void *B, int ldb, float beta, fsdp_dtype c_dt, void *C, int ldc, fsdp_err *err);

/* y[n,out] = x[n,in] W^T, W [out,in]; x, w, y all of dtype dt (overwrites y). */
int dev_linear_forward(dev_ctx *d, fsdp_dtype dt, const void *x, const void *w, void *y, int n, int in, int out,
                       fsdp_err *err);
/* y[n,out] = res[n,out] + x[n,in] W^T in one GEMM: the residual is read by cuBLASLt's epilogue
 * (C = res, beta = 1) and the sum is rounded once into dtype dt. res may be y. This is the
 * transformer block's residual add fused into the projection before it (no separate add kernel,
 * no pass over the GEMM output). */
int dev_linear_forward_residual(dev_ctx *d, fsdp_dtype dt, const void *x, const void *w, const void *res, void *y,
                                int n, int in, int out, fsdp_err *err);
/* dx[n,in] = beta*dx + dy[n,out] W; dy, w, dx of dtype dt. */
int dev_linear_backward_input(dev_ctx *d, fsdp_dtype dt, const void *dy, const void *w, void *dx, int n, int in,
                              int out, float beta, fsdp_err *err);
/* dw[out,in] += dy^T x: dy, x of dtype dt; dw is always float32 (gradients accumulate in f32). */
int dev_linear_backward_weight(dev_ctx *d, fsdp_dtype dt, const void *dy, const void *x, float *dw, int n, int in,
                               int out, fsdp_err *err);

/* Number of cached matmul plans and heuristic queries so far (to check that a step loop stops
 * querying after warm-up). */
void dev_gemm_plan_stats(const dev_ctx *d, int *plans, uint64_t *heuristic_queries);

#ifdef __cplusplus
}
#endif
#endif
