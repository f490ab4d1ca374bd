/* Parallel init fills (see init_fill.h). */
#include "model/init_fill.h"
#include "runtime/mempages.h"

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

int init_job_for_rule(init_job *j, const init_rule *r, int ndim, const int64_t *shape, const char *what,
                      fsdp_err *err) {
    memset(&j->dist, 0, sizeof j->dist);
    memset(&j->sincos, 0, sizeof j->sincos);
    int rc = init_rule_zero_range(r, ndim, shape, 0, INT64_MAX, what, &j->zero_e0, &j->zero_e1, err);
    if (rc) return rc;
    if (r->kind == INIT_SINCOS_2D) return init_sincos_make(r->grid, r->base, ndim, shape, what, &j->sincos, err);
    return init_rule_dist(r, ndim, shape, what, &j->dist, err);
}

/* Elements [e, e + m) of job j into dst: its table's (omega: the table's frequencies), else drawn on
 * generator path `path`. */
static void gen(const init_job *j, const double *omega, uint64_t seed, rng_path path, int64_t e, int64_t m,
                float *dst) {
    if (omega) init_sincos_fill_f32(&j->sincos, omega, e, m, dst);
    else rng_fill_dist_path(path, &j->dist, dst, seed, j->stream, (uint64_t)e, (size_t)m);
}

/* The job's zero row within elements [e, e + m) written at dst (element e at dst[0]). */
static void zero_overlap(const init_job *j, int64_t e, int64_t m, float *dst) {
    int64_t a = j->zero_e0 > e ? j->zero_e0 : e, b = j->zero_e1 < e + m ? j->zero_e1 : e + m;
    if (a < b) memset(dst + (a - e), 0, (size_t)(b - a) * sizeof(float));
}

/* Elements [a, b) of job j. */
static void run_piece(const init_job *j, const double *omega, uint64_t seed, rng_path path, int64_t a, int64_t b) {
    const int half = j->dtype == FSDP_DT_BF16 || j->dtype == FSDP_DT_F16, bf16 = j->dtype == FSDP_DT_BF16;
    float buf[INIT_SUB];
    /* fresh memory (init-meta, init-cpu): the piece's pages in one call, not a trap each (runtime/mempages.h) */
    if (j->f32) mempages_prefault(j->f32 + (a - j->e0), (size_t)(b - a) * sizeof(float));
    else mempages_prefault(j->half + (a - j->e0), (size_t)(b - a) * sizeof(uint16_t));
    for (int64_t e = a; e < b;) {
        int64_t m = INIT_SUB - e % INIT_SUB;
        if (m > b - e) m = b - e;
        if (j->f32) {
            float *dst = j->f32 + (e - j->e0);
            gen(j, omega, seed, path, e, m, dst);
            zero_overlap(j, e, m, dst);
            if (half) rng_round_half_path(path, dst, (size_t)m, bf16);
        } else {
            gen(j, omega, seed, path, e, m, buf);
            zero_overlap(j, e, m, buf);
            rng_to_half_path(path, buf, j->half + (e - j->e0), (size_t)m, bf16);
        }
        e += m;
    }
}

/* A sincos_2d job: a table init_sincos_make accepts, and elements inside it. */
static int check_table(const init_job *j, int i, const char *what, fsdp_err *err) {
    const init_sincos *t = &j->sincos;
    if (t->grid > 2147483647 || t->dim <= 0 || t->dim % 4 || !(t->base > 0) || t->grid * t->grid > INT64_MAX / t->dim)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: job %d: not a sincos_2d table (grid %lld, D %lld, base %g)", what,
                            i, (long long)t->grid, (long long)t->dim, t->base);
    if (j->e0 + j->n > t->grid * t->grid * t->dim)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: job %d: elements [%lld, +%lld) are outside the sincos_2d table "
                            "[%lld, %lld]", what, i, (long long)j->e0, (long long)j->n, (long long)(t->grid * t->grid),
                            (long long)t->dim);
    return 0;
}

/* The frequencies of every table job with elements to fill (NULL for the others), in *out (NULL when
 * there is none). */
static int make_omegas(const init_job *jobs, int n, double ***out, const char *what, fsdp_err *err) {
    *out = NULL;
    int any = 0;
    for (int i = 0; i < n; i++) any |= jobs[i].sincos.grid > 0 && jobs[i].n > 0;
    if (!any) return 0;
    double **om = calloc((size_t)n, sizeof *om);
    if (!om) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory for %d jobs", what, n);
    *out = om;
    for (int i = 0; i < n; i++) {
        const init_job *j = &jobs[i];
        if (j->sincos.grid <= 0 || j->n == 0) continue;
        if (!(om[i] = malloc((size_t)(j->sincos.dim / 4) * sizeof **om)))
            return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory for the sincos_2d frequencies of job %d", what, i);
        init_sincos_omega(&j->sincos, om[i]);
    }
    return 0;
}

static void free_omegas(double **om, int n) {
    for (int i = 0; om && i < n; i++) free(om[i]);
    free(om);
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
    if (j->sincos.grid > 0) return check_table(j, i, what, err);
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
    double **omegas = NULL;
    if (!rc) rc = make_omegas(jobs, n, &omegas, what, err);
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
            run_piece(j, omegas ? omegas[lo] : NULL, seed, path, a, b);
        }
    }
    free_omegas(omegas, n);
    free(first);
    return rc;
}

int init_fill_one(const init_job *j, uint64_t seed, const char *what, fsdp_err *err) {
    if (!what) what = "init";
    int rc = check_job(j, 0, what, err);
    if (rc || j->n == 0) return rc;
    double *omega = NULL;
    if (j->sincos.grid > 0) {
        if (!(omega = malloc((size_t)(j->sincos.dim / 4) * sizeof *omega)))
            return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory for the sincos_2d frequencies", what);
        init_sincos_omega(&j->sincos, omega);
    }
    run_piece(j, omega, seed, rng_path_default(), j->e0, j->e0 + j->n);
    free(omega);
    return 0;
}
