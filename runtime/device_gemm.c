/* Row-major GEMMs through cuBLASLt (column-major): row-major C = op(A) op(B) is column-major
 * C^T = op(B)^T op(A)^T, so the call swaps A and B and keeps each one's transposition flag. */
#include "runtime/device_gemm.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/device_internal.h"

#if FSDP_HAVE_CUDA

#define DG_PLANS 64

typedef struct dg_key {
    int ta, tb, M, N, K, lda, ldb, ldc;
    int ab_dt, c_dt;
    int align_a, align_b, align_c;
} dg_key;

typedef struct dg_plan {
    int valid;
    dg_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} dg_plan;

struct dev_gemm_cache {
    const dev_blas_api *bl;
    dg_plan plans[DG_PLANS];
    int count, next;
    uint64_t queries;
};

dev_gemm_cache *dev_gemm_cache_create(const dev_blas_api *bl, fsdp_err *err) {
    dev_gemm_cache *g = calloc(1, sizeof *g);
    if (!g) fsdp_err_set(err, FSDP_E_NOMEM, "GEMM plan cache: out of host memory");
    else g->bl = bl;
    return g;
}

static void plan_clear(const dev_blas_api *bl, dg_plan *p) {
    if (p->op) bl->cublasLtMatmulDescDestroy(p->op);
    if (p->la) bl->cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) bl->cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) bl->cublasLtMatrixLayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

void dev_gemm_cache_free(dev_gemm_cache *g) {
    if (!g) return;
    for (int i = 0; i < DG_PLANS; i++) plan_clear(g->bl, &g->plans[i]);
    free(g);
}

static int ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uintptr_t low = a & (~a + 1);
    return (low == 0 || low > 256) ? 256 : (int)low;
}

static int lt_fail(const dev_blas_api *bl, fsdp_err *err, cublasStatus_t s, const char *call, const dg_key *k) {
    return fsdp_err_set(err, FSDP_E_DEVICE, "%s failed for GEMM M=%d N=%d K=%d (trans %d%d, %s x %s -> %s): %s", call,
                        k->M, k->N, k->K, k->ta, k->tb, fsdp_dtype_name((fsdp_dtype)k->ab_dt),
                        fsdp_dtype_name((fsdp_dtype)k->ab_dt), fsdp_dtype_name((fsdp_dtype)k->c_dt),
                        bl->cublasLtGetStatusString(s));
}

#define LT_TRY(call, name)                                  \
    do {                                                    \
        cublasStatus_t lt_s_ = (call);                      \
        if (lt_s_ != CUBLAS_STATUS_SUCCESS) {               \
            rc = lt_fail(&d->bl, err, lt_s_, name, k);      \
            goto done;                                      \
        }                                                   \
    } while (0)

/* Builds the descriptors and asks the heuristic for an algorithm. */
static int plan_make(dev_ctx *d, const dg_key *k, dg_plan *p, fsdp_err *err) {
    int rc = FSDP_OK;
    cublasLtMatmulPreference_t pref = NULL;
    memset(p, 0, sizeof *p);
    p->key = *k;
    cudaDataType_t ab = k->ab_dt == FSDP_DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cudaDataType_t ct = k->c_dt == FSDP_DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* column-major A is row-major B */
    cublasOperation_t opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_TRY(d->bl.cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    LT_TRY(d->bl.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
           "cublasLtMatmulDescSetAttribute(TRANSA)");
    LT_TRY(d->bl.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
           "cublasLtMatmulDescSetAttribute(TRANSB)");
    /* stored shapes (column-major rows x cols) */
    LT_TRY(d->bl.cublasLtMatrixLayoutCreate(&p->la, ab, (uint64_t)(k->tb ? k->K : k->N), (uint64_t)(k->tb ? k->N : k->K),
                                      k->ldb),
           "cublasLtMatrixLayoutCreate(A)");
    LT_TRY(d->bl.cublasLtMatrixLayoutCreate(&p->lb, ab, (uint64_t)(k->ta ? k->M : k->K), (uint64_t)(k->ta ? k->K : k->M),
                                      k->lda),
           "cublasLtMatrixLayoutCreate(B)");
    LT_TRY(d->bl.cublasLtMatrixLayoutCreate(&p->lc, ct, (uint64_t)k->N, (uint64_t)k->M, k->ldc),
           "cublasLtMatrixLayoutCreate(C)");
    LT_TRY(d->bl.cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    size_t ws = d->blas_ws_bytes;
    uint32_t al_a = (uint32_t)k->align_b, al_b = (uint32_t)k->align_a, al_c = (uint32_t)k->align_c;
    LT_TRY(d->bl.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
           "cublasLtMatmulPreferenceSetAttribute(workspace)");
    LT_TRY(d->bl.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a),
           "cublasLtMatmulPreferenceSetAttribute(alignment A)");
    LT_TRY(d->bl.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b),
           "cublasLtMatmulPreferenceSetAttribute(alignment B)");
    LT_TRY(d->bl.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c),
           "cublasLtMatmulPreferenceSetAttribute(alignment C)");
    LT_TRY(d->bl.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c),
           "cublasLtMatmulPreferenceSetAttribute(alignment D)");
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    d->gemm->queries++;
    LT_TRY(d->bl.cublasLtMatmulAlgoGetHeuristic(d->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &found),
           "cublasLtMatmulAlgoGetHeuristic");
    if (found < 1) {
        rc = fsdp_err_set(err, FSDP_E_DEVICE, "cuBLASLt has no algorithm for GEMM M=%d N=%d K=%d (trans %d%d, %s -> %s)",
                          k->M, k->N, k->K, k->ta, k->tb, fsdp_dtype_name((fsdp_dtype)k->ab_dt),
                          fsdp_dtype_name((fsdp_dtype)k->c_dt));
        goto done;
    }
    p->algo = res.algo;
    p->valid = 1;
done:
    if (pref) d->bl.cublasLtMatmulPreferenceDestroy(pref);
    if (rc) plan_clear(&d->bl, p);
    return rc;
}

static int plan_get(dev_ctx *d, const dg_key *k, dg_plan **out, fsdp_err *err) {
    dev_gemm_cache *g = d->gemm;
    for (int i = 0; i < g->count; i++) {
        if (g->plans[i].valid && !memcmp(&g->plans[i].key, k, sizeof *k)) {
            *out = &g->plans[i];
            return FSDP_OK;
        }
    }
    int slot;
    if (g->count < DG_PLANS) {
        slot = g->count++;
    } else {
        slot = g->next;
        g->next = (g->next + 1) % DG_PLANS;
        plan_clear(g->bl, &g->plans[slot]);
    }
    int rc = plan_make(d, k, &g->plans[slot], err);
    if (rc) return rc;
    *out = &g->plans[slot];
    return FSDP_OK;
}

int dev_gemm_cd(dev_ctx *d, int trans_a, int trans_b, int M, int N, int K, float alpha, fsdp_dtype ab_dt,
                const void *A, int lda, const void *B, int ldb, float beta, fsdp_dtype c_dt, const void *C, void *D,
                int ldc, fsdp_err *err) {
    if (!d) return fsdp_err_set(err, FSDP_E_INVALID, "dev_gemm: no device context");
    if (M <= 0 || N <= 0 || K <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "dev_gemm: sizes must be positive (M %d, N %d, K %d)", M, N, K);
    if (!A || !B || !C || !D) return fsdp_err_set(err, FSDP_E_INVALID, "dev_gemm: NULL matrix pointer");
    if (lda < (trans_a ? M : K) || ldb < (trans_b ? K : N) || ldc < N)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "dev_gemm: leading dimensions lda %d, ldb %d, ldc %d are smaller than the rows "
                            "(M %d, N %d, K %d, trans %d%d)",
                            lda, ldb, ldc, M, N, K, trans_a, trans_b);
    if (!(ab_dt == FSDP_DT_F32 && c_dt == FSDP_DT_F32) &&
        !(ab_dt == FSDP_DT_BF16 && (c_dt == FSDP_DT_BF16 || c_dt == FSDP_DT_F32)))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "dev_gemm: unsupported dtypes %s x %s -> %s (f32 -> f32, bf16 -> bf16 or f32)",
                            fsdp_dtype_name(ab_dt), fsdp_dtype_name(ab_dt), fsdp_dtype_name(c_dt));
    dg_key key;
    memset(&key, 0, sizeof key);
    key.ta = !!trans_a;
    key.tb = !!trans_b;
    key.M = M;
    key.N = N;
    key.K = K;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.ab_dt = (int)ab_dt;
    key.c_dt = (int)c_dt;
    key.align_a = ptr_align(A);
    key.align_b = ptr_align(B);
    /* C and D share one layout: the plan's alignment is the smaller of the two */
    int al_c = ptr_align(C), al_d = ptr_align(D);
    key.align_c = al_c < al_d ? al_c : al_d;
    dg_plan *p;
    int rc = plan_get(d, &key, &p, err);
    if (rc) return rc;
    cublasStatus_t s = d->bl.cublasLtMatmul(d->lt, p->op, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, D, p->lc, &p->algo,
                                      d->blas_ws, d->blas_ws_bytes, d->streams[DEV_STREAM_COMPUTE]);
    if (s != CUBLAS_STATUS_SUCCESS) return lt_fail(&d->bl, err, s, "cublasLtMatmul", &key);
    return FSDP_OK;
}

int dev_gemm(dev_ctx *d, int trans_a, int trans_b, int M, int N, int K, float alpha, fsdp_dtype ab_dt, const void *A,
             int lda, const void *B, int ldb, float beta, fsdp_dtype c_dt, void *C, int ldc, fsdp_err *err) {
    return dev_gemm_cd(d, trans_a, trans_b, M, N, K, alpha, ab_dt, A, lda, B, ldb, beta, c_dt, C, C, ldc, err);
}

void dev_gemm_plan_stats(const dev_ctx *d, int *plans, uint64_t *heuristic_queries) {
    if (plans) *plans = d && d->gemm ? d->gemm->count : 0;
    if (heuristic_queries) *heuristic_queries = d && d->gemm ? d->gemm->queries : 0;
}

#else /* !FSDP_HAVE_CUDA */

int dev_gemm_cd(dev_ctx *d, int trans_a, int trans_b, int M, int N, int K, float alpha, fsdp_dtype ab_dt,
                const void *A, int lda, const void *B, int ldb, float beta, fsdp_dtype c_dt, const void *C, void *D,
                int ldc, fsdp_err *err) {
    (void)d, (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)ab_dt, (void)A, (void)lda;
    (void)B, (void)ldb, (void)beta, (void)c_dt, (void)C, (void)D, (void)ldc;
    return dev_err_no_cuda(err, "dev_gemm");
}

int dev_gemm(dev_ctx *d, int trans_a, int trans_b, int M, int N, int K, float alpha, fsdp_dtype ab_dt, const void *A,
             int lda, const void *B, int ldb, float beta, fsdp_dtype c_dt, void *C, int ldc, fsdp_err *err) {
    return dev_gemm_cd(d, trans_a, trans_b, M, N, K, alpha, ab_dt, A, lda, B, ldb, beta, c_dt, C, C, ldc, err);
}

void dev_gemm_plan_stats(const dev_ctx *d, int *plans, uint64_t *heuristic_queries) {
    (void)d;
    if (plans) *plans = 0;
    if (heuristic_queries) *heuristic_queries = 0;
}

#endif

/* The linear layers are the same calls as kc_linear_* (kernels/cpu/kc_linear.c). */

int dev_linear_forward(dev_ctx *d, fsdp_dtype dt, const void *x, const void *w, void *y, int n, int in, int out,
                       fsdp_err *err) {
    return dev_gemm(d, 0, 1, n, out, in, 1.0f, dt, x, in, w, in, 0.0f, dt, y, out, err);
}

int dev_linear_forward_residual(dev_ctx *d, fsdp_dtype dt, const void *x, const void *w, const void *res, void *y,
                                int n, int in, int out, fsdp_err *err) {
    return dev_gemm_cd(d, 0, 1, n, out, in, 1.0f, dt, x, in, w, in, 1.0f, dt, res, y, out, err);
}

int dev_linear_backward_input(dev_ctx *d, fsdp_dtype dt, const void *dy, const void *w, void *dx, int n, int in,
                              int out, float beta, fsdp_err *err) {
    return dev_gemm(d, 0, 0, n, in, out, 1.0f, dt, dy, out, w, in, beta, dt, dx, in, err);
}

int dev_linear_backward_weight(dev_ctx *d, fsdp_dtype dt, const void *dy, const void *x, float *dw, int n, int in,
                               int out, fsdp_err *err) {
    return dev_gemm(d, 1, 0, out, in, n, 1.0f, dt, dy, out, x, in, 1.0f, FSDP_DT_F32, dw, in, err);
}
