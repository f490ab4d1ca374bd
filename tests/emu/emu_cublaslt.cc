// Fake cuBLASLt of the emulated-device build: built as build-emu/lib/libcublasLt.so.<CUBLAS_VER_MAJOR>,
// the name runtime/device_blas.c dlopens; the emulated executables carry that directory as their
// RPATH (searched before LD_LIBRARY_PATH and the system's libraries). Only what
// runtime/device_gemm.c uses exists:
//   matmul descriptors with compute CUBLAS_COMPUTE_32F and scale type CUDA_R_32F; attributes TRANSA and
//   TRANSB (CUBLAS_OP_N / CUBLAS_OP_T) and EPILOGUE (CUBLASLT_EPILOGUE_DEFAULT only); layouts of
//   CUDA_R_32F or CUDA_R_16BF column-major matrices (rows, cols, ld >= rows); preferences
//   MAX_WORKSPACE_BYTES and MIN_ALIGNMENT_{A,B,C,D}_BYTES; A and B of one type, C = D of
//   the same type, or f32 C/D with bf16 A/B. Anything else is CUBLAS_STATUS_INVALID_VALUE or, from the
//   heuristic, CUBLAS_STATUS_NOT_SUPPORTED with no algorithm.
// The heuristic returns one algorithm that remembers the alignments the preference promised;
// cublasLtMatmul fails with CUBLAS_STATUS_INVALID_VALUE when a pointer is less aligned than promised,
// when a matrix is not inside one device allocation or when the algorithm did not come from the
// heuristic. D = alpha op(A) op(B) + beta C (C not read when beta is 0) is a plain loop in float with
// bf16 results rounded to nearest even, queued as a deferred operation on `stream` (the fake runtime,
// tests/emu/emu_cudart.cc; alpha and beta are read at the call, host pointer mode).
#include <cublasLt.h>
#include <string.h>

#include <cstdint>
#include <string>

#include "tests/emu/emu_cudart.h"

namespace {

constexpr uint32_t kDesc = 0x44455343u, kLayout = 0x4c41594fu, kPref = 0x50524546u, kAlgo = 0x414c474fu;

struct Desc {
    uint32_t magic;
    int transa, transb, epilogue;
};
struct Layout {
    uint32_t magic;
    int type;
    uint64_t rows, cols;
    int64_t ld;
};
struct Pref {
    uint32_t magic;
    uint64_t ws;
    uint32_t align[4];
};
struct Algo {
    uint32_t magic;
    uint32_t align[4];
};
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t), "descriptor fits");
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout fits");
static_assert(sizeof(Pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "preference fits");
static_assert(sizeof(Algo) <= sizeof(cublasLtMatmulAlgo_t), "algorithm fits");

template <class T, class O>
T *as(O *o, uint32_t magic) {
    if (!o) return nullptr;
    T *t = reinterpret_cast<T *>(o->data);
    return t->magic == magic ? t : nullptr;
}

float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
size_t type_size(int t) { return t == CUDA_R_32F ? 4 : 2; }

float ld(const void *p, int t, size_t i) {
    return t == CUDA_R_32F ? static_cast<const float *>(p)[i] : bf2f(static_cast<const uint16_t *>(p)[i]);
}
void st(void *p, int t, size_t i, float v) {
    if (t == CUDA_R_32F) static_cast<float *>(p)[i] = v;
    else static_cast<uint16_t *>(p)[i] = f2bf(v);
}

struct Problem {
    int ta, tb;
    uint64_t m, n, k;
    Layout a, b, c, d;
};

// The shapes and types of a matmul; false when they do not fit together or are not emulated.
bool problem(cublasLtMatmulDesc_t od, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
             cublasLtMatrixLayout_t D, Problem *p) {
    Desc *o = as<Desc>(od, kDesc);
    Layout *a = as<Layout>(A, kLayout), *b = as<Layout>(B, kLayout), *c = as<Layout>(C, kLayout),
           *d = as<Layout>(D, kLayout);
    if (!o || !a || !b || !c || !d) return false;
    p->ta = o->transa == CUBLAS_OP_T;
    p->tb = o->transb == CUBLAS_OP_T;
    p->a = *a, p->b = *b, p->c = *c, p->d = *d;
    p->m = p->ta ? a->cols : a->rows;
    p->k = p->ta ? a->rows : a->cols;
    uint64_t kb = p->tb ? b->cols : b->rows;
    p->n = p->tb ? b->rows : b->cols;
    if (kb != p->k || c->rows != p->m || c->cols != p->n || d->rows != p->m || d->cols != p->n) return false;
    if (a->type != b->type || c->type != d->type || c->ld != d->ld) return false;
    return c->type == a->type || (a->type == CUDA_R_16BF && c->type == CUDA_R_32F);
}

bool aligned(const void *p, uint32_t a) { return a == 0 || ((uintptr_t)p % a) == 0; }

// Bytes spanned by a column-major matrix.
size_t span(const Layout &l) { return l.cols ? ((size_t)(l.cols - 1) * (size_t)l.ld + l.rows) * type_size(l.type) : 0; }

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    // the handle holds nothing: any distinct non-null pointer
    *h = reinterpret_cast<cublasLtHandle_t>(new char[1]);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete[] reinterpret_cast<char *>(h);
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    default: return "CUBLAS_STATUS_UNKNOWN (emulated cuBLASLt)";
    }
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t ct, cudaDataType_t scale) {
    if (ct != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    cublasLtMatmulDescOpaque_t *o = new cublasLtMatmulDescOpaque_t();
    Desc d{kDesc, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT};
    memcpy(o->data, &d, sizeof d);
    *desc = o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    if (!as<Desc>(desc, kDesc)) return CUBLAS_STATUS_INVALID_VALUE;
    desc->data[0] = 0;
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
    Desc *d = as<Desc>(desc, kDesc);
    if (!d || !buf || size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    int32_t v;
    memcpy(&v, buf, sizeof v);
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if (v != CUBLAS_OP_N && v != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : d->transb) = v;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (v != CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_INVALID_VALUE; // not emulated
        d->epilogue = v;
        return CUBLAS_STATUS_SUCCESS;
    default: return CUBLAS_STATUS_INVALID_VALUE; // not emulated
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ldv) {
    if ((type != CUDA_R_32F && type != CUDA_R_16BF) || ldv < 1 || (uint64_t)ldv < rows)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatrixLayoutOpaque_t *o = new cublasLtMatrixLayoutOpaque_t();
    Layout l{kLayout, (int)type, rows, cols, ldv};
    memcpy(o->data, &l, sizeof l);
    *layout = o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    if (!as<Layout>(layout, kLayout)) return CUBLAS_STATUS_INVALID_VALUE;
    layout->data[0] = 0;
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    cublasLtMatmulPreferenceOpaque_t *o = new cublasLtMatmulPreferenceOpaque_t();
    Pref p{kPref, 0, {0, 0, 0, 0}};
    memcpy(o->data, &p, sizeof p);
    *pref = o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    if (!as<Pref>(pref, kPref)) return CUBLAS_STATUS_INVALID_VALUE;
    pref->data[0] = 0;
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size) {
    Pref *p = as<Pref>(pref, kPref);
    if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->ws, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    int slot = attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES   ? 0
               : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES ? 1
               : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES ? 2
               : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES ? 3
                                                                    : -1;
    if (slot < 0 || size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE; // not emulated
    memcpy(&p->align[slot], buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t od, cublasLtMatrixLayout_t A,
                                              cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                                              cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *count) {
    Pref *p = as<Pref>(pref, kPref);
    if (!h || !p || requested < 1 || !results || !count) return CUBLAS_STATUS_INVALID_VALUE;
    *count = 0;
    Problem pr;
    if (!problem(od, A, B, C, D, &pr)) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(&results[0], 0, sizeof results[0]);
    Algo a{kAlgo, {p->align[0], p->align[1], p->align[2], p->align[3]}};
    memcpy(results[0].algo.data, &a, sizeof a);
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *count = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t od, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t Ad, const void *B, cublasLtMatrixLayout_t Bd, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cd, void *D, cublasLtMatrixLayout_t Dd,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t stream) {
    (void)ws;
    (void)ws_bytes;
    Problem p;
    if (!h || !alpha || !beta || !algo || !problem(od, Ad, Bd, Cd, Dd, &p)) return CUBLAS_STATUS_INVALID_VALUE;
    Algo al;
    memcpy(&al, algo->data, sizeof al);
    if (al.magic != kAlgo) return CUBLAS_STATUS_INVALID_VALUE;
    if (!aligned(A, al.align[0]) || !aligned(B, al.align[1]) || !aligned(C, al.align[2]) || !aligned(D, al.align[3]))
        return CUBLAS_STATUS_INVALID_VALUE; // the algorithm was chosen for better-aligned pointers
    float fa, fb;
    memcpy(&fa, alpha, 4);
    memcpy(&fb, beta, 4);
    if (!emucu::is_device_range(A, span(p.a)) || !emucu::is_device_range(B, span(p.b)) ||
        !emucu::is_device_range(D, span(p.d)) || (fb != 0.0f && !emucu::is_device_range(C, span(p.c))))
        return CUBLAS_STATUS_INVALID_VALUE;
    cudaError_t e = emucu::enqueue(stream, "cublasLtMatmul", [p, fa, fb, A, B, C, D]() -> std::string {
        const int64_t m = (int64_t)p.m, n = (int64_t)p.n, k = (int64_t)p.k;
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                float s = 0.0f;
                for (int64_t q = 0; q < k; q++) {
                    size_t ia = p.ta ? (size_t)q + (size_t)i * (size_t)p.a.ld : (size_t)i + (size_t)q * (size_t)p.a.ld;
                    size_t ib = p.tb ? (size_t)j + (size_t)q * (size_t)p.b.ld : (size_t)q + (size_t)j * (size_t)p.b.ld;
                    s += ld(A, p.a.type, ia) * ld(B, p.b.type, ib);
                }
                float v = fa * s;
                if (fb != 0.0f) v += fb * ld(C, p.c.type, (size_t)i + (size_t)j * (size_t)p.c.ld);
                st(D, p.d.type, (size_t)i + (size_t)j * (size_t)p.d.ld, v);
            }
        return std::string();
    });
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

} // extern "C"
