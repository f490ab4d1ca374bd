/* Parallel init fills (see init_fill.h). */
#include "model/init_fill.h"

#include <stdlib.h>
#include <string.h>

/* Jobs are cut into pieces of this many elements (aligned to the stream, so that the fills write
 * whole chunks); the pieces of all jobs are shared out among the threads. 2 MiB of float32: the
 * threads first-touch (page-fault) different page tables, whose locks they would otherwise take
 * in turn, and a piece is still short next to the whole fill, so the threads end together. */
#define INIT_PIECE ((int64_t)RNG_CHUNK * 2048)

/* Pieces are generated in sub-blocks of this many elements (aligned to the stream), each rounded to
 * bf16 / f16 while it is still in the L1 cache. */
#define INIT_SUB ((int64_t)RNG_CHUNK * 8)

/* Elements [a, b) of job j, on generator path `path`. */
static void run_piece(const init_job *j, uint64_t seed, rng_path path, int64_t a, int64_t b) {
    const int half = j->dtype == FSDP_DT_BF16 || j->dtype == FSDP_DT_F16, bf16 = j->dtype == FSDP_DT_BF16;
    float buf[INIT_SUB];
    for (int64_t e = a; e < b;) {
        int64_t m = INIT_SUB - e % INIT_SUB;
        if (m > b - e) m = b - e;
        if (j->f32) {
            float *dst = j->f32 + (e - j->e0);
            rng_fill_dist_path(path, &j->dist, dst, seed, j->stream, (uint64_t)e, (size_t)m);
            if (half) rng_round_half_path(path, dst, (size_t)m, bf16);
        } else {
            rng_fill_dist_path(path, &j->dist, buf, seed, j->stream, (uint64_t)e, (size_t)m);
            rng_to_half_path(path, buf, j->half + (e - j->e0), (size_t)m, bf16);
        }
        e += m;
    }
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
        const rng_path path = rng_path_default();
        /* dynamic: pieces of different distributions cost different times (a truncated normal about
         * twice a normal), so equal counts of pieces per thread leave one thread idle; which thread
         * fills a piece never changes its values, and each page is first touched by the thread that
         * fills it */
#pragma omp parallel for schedule(dynamic, 1) if (total > 1)
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
            run_piece(j, seed, path, a, b);
        }
    }
    free(first);
    return rc;
}
