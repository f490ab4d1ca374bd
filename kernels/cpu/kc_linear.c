/* GEMM through OpenBLAS cblas_sgemm with the optional timing hook, and the linear layers on it. */
#include "kernels/cpu/kc.h"

#include <cblas.h>
#include <time.h>

void kc_stats_reset(kc_stats *st) {
    if (!st) return;
    st->gemm_calls = 0;
    st->gemm_seconds = 0.0;
    st->gemm_flops = 0.0;
}

double kc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void kc_gemm(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
             float beta, float *C, int ldc, kc_stats *st) {
    double t0 = st ? kc_now() : 0.0;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                1.0f, A, lda, B, ldb, beta, C, ldc);
    if (st) {
        st->gemm_seconds += kc_now() - t0;
        st->gemm_flops += 2.0 * (double)M * (double)N * (double)K;
        st->gemm_calls++;
    }
}

void kc_linear_forward(const float *x, const float *w, float *y, int n, int in, int out, kc_stats *st) {
    /* y[n,out] = x[n,in] * W[out,in]^T */
    kc_gemm(0, 1, n, out, in, x, in, w, in, 0.0f, y, out, st);
}

void kc_linear_backward_input(const float *dy, const float *w, float *dx, int n, int in, int out, float beta,
                              kc_stats *st) {
    /* dx[n,in] = beta*dx + dy[n,out] * W[out,in] */
    kc_gemm(0, 0, n, in, out, dy, out, w, in, beta, dx, in, st);
}

void kc_linear_backward_weight(const float *dy, const float *x, float *dw, int n, int in, int out,
                               kc_stats *st) {
    /* dw[out,in] += dy[n,out]^T * x[n,in] */
    kc_gemm(1, 0, out, in, n, dy, out, x, in, 1.0f, dw, in, st);
}
