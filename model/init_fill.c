/* Parallel init fills (see init_fill.h). */
#include "model/init_fill.h"

#include <stdlib.h>
#include <string.h>

/* Jobs are cut into pieces of this many elements (aligned to the stream, so that the fills write
 * whole chunks); the pieces of all jobs are shared out among the threads. */
#define INIT_PIECE ((int64_t)RNG_CHUNK * 64)

static float round_to(float v, fsdp_dtype dt) {
    if (dt == FSDP_DT_BF16) return fsdp_bf16_to_f32(fsdp_f32_to_bf16(v));
    return fsdp_f16_to_f32(fsdp_f32_to_f16(v));
}

/* Elements [a, b) of job j. */
static void run_piece(const init_job *j, uint64_t seed, int64_t a, int64_t b) {
    const size_t n = (size_t)(b - a);
    if (j->f32) {
        float *dst = j->f32 + (a - j->e0);
        rng_fill_dist_serial(&j->dist, dst, seed, j->stream, (uint64_t)a, n);
        if (j->dtype == FSDP_DT_BF16 || j->dtype == FSDP_DT_F16)
            for (size_t k = 0; k < n; k++) dst[k] = round_to(dst[k], j->dtype);
        return;
    }
    float buf[INIT_PIECE];
    uint16_t *dst = j->half + (a - j->e0);
    rng_fill_dist_serial(&j->dist, buf, seed, j->stream, (uint64_t)a, n);
    if (j->dtype == FSDP_DT_BF16)
        for (size_t k = 0; k < n; k++) dst[k] = fsdp_f32_to_bf16(buf[k]);
    else
        for (size_t k = 0; k < n; k++) dst[k] = fsdp_f32_to_f16(buf[k]);
}

static int check_job(const init_job *j, int i, const char *what, fsdp_err *err) {
    if (j->e0 < 0 || j->n < 0 || j->e0 > INT64_MAX - j->n)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: job %d: elements [%lld, +%lld) are out of range", what, i,
                            (long long)j->e0, (long long)j->n);
    if (j->n > 0 && !j->f32 && !j->half)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: job %d: no output buffer", what, i);
    int half_dt = j->dtype == FSDP_DT_BF16 || j->dtype == FSDP_DT_F16;
    if (!(j->dtype == 0 || j->dtype == FSDP_DT_F32 || half_dt) || (!j->f32 && j->n > 0 && !half_dt))
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: job %d: init writes f32, bf16 or f16, not %s", what, i,
                            fsdp_dtype_name(j->dtype));
    if (j->dist.kind < RNG_DIST_UNIFORM || j->dist.kind > RNG_DIST_UNIFORM_AB)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: job %d: unknown distribution kind %d", what, i, j->dist.kind);
    return 0;
}

int init_fill_jobs(const init_job *jobs, int n, uint64_t seed, const char *what, fsdp_err *err) {
    if (!what) what = "init";
    if (n < 0 || (n > 0 && !jobs)) return fsdp_err_set(err, FSDP_E_INVALID, "%s: no jobs given", what);
    if (n == 0) return FSDP_OK;
    int64_t *first = malloc(((size_t)n + 1) * sizeof *first); /* first piece of each job */
    if (!first) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory for %d jobs", what, n);
    int rc = FSDP_OK;
    first[0] = 0;
    for (int i = 0; i < n && !rc; i++) {
        const init_job *j = &jobs[i];
        if ((rc = check_job(j, i, what, err))) break;
        const int64_t s = j->e0, e = j->e0 + j->n;
        const int64_t pieces = e > s ? (e - 1) / INIT_PIECE - s / INIT_PIECE + 1 : 0;
        if (first[i] > INT64_MAX - pieces) {
            rc = fsdp_err_set(err, FSDP_E_INVALID, "%s: too much work", what);
            break;
        }
        first[i + 1] = first[i] + pieces;
    }
    if (!rc) {
        const int64_t total = first[n];
#pragma omp parallel for schedule(static) if (total > 1)
        for (int64_t q = 0; q < total; q++) {
            int lo = 0, hi = n - 1; /* the job holding piece q: first[lo] <= q < first[lo + 1] */
            while (lo < hi) {
                int mid = (lo + hi + 1) / 2;
                if (first[mid] <= q) lo = mid;
                else hi = mid - 1;
            }
            const init_job *j = &jobs[lo];
            const int64_t s = j->e0, e = j->e0 + j->n;
            int64_t a = (s / INIT_PIECE + (q - first[lo])) * INIT_PIECE, b = a + INIT_PIECE;
            if (a < s) a = s;
            if (b > e) b = e;
            run_piece(j, seed, a, b);
        }
    }
    free(first);
    return rc;
}
