/* Filling parameter values from their init distributions (runtime/rng.h), on all OpenMP threads:
 * many (parameter, element range) pieces in one parallel region, so small parameters are filled
 * side by side. Element e (flat row-major index in the FULL parameter) of a parameter is element e
 * of its stream (init_stream(name), see init_rule.h) under its distribution: the values never
 * depend on how a parameter is sharded, on the world size or on the number of threads. The GPU
 * generates the same bits with kcu_init_fill (kernels/cuda/kcu.h). A job of a fixed table
 * (sincos_2d, model/init_sincos.h) computes element e of the table instead of drawing it. */
#ifndef FSDP_MODEL_INIT_FILL_H
#define FSDP_MODEL_INIT_FILL_H

#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/tensor.h"
#include "model/init_rule.h"
#include "model/init_sincos.h"
#include "runtime/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements [e0, e0 + n) of a parameter's stream under dist. Output: f32 (values as float, rounded
 * to bf16 / f16 precision when dtype is FSDP_DT_BF16 / FSDP_DT_F16), or, when f32 is NULL, half:
 * the bf16 / f16 bits (dtype must then be one of those). */
typedef struct init_job {
    uint64_t stream;
    rng_dist dist;
    init_sincos sincos; /* grid > 0: the job fills this table and dist is not used */
    int64_t e0, n;
    float *f32;
    uint16_t *half;
    fsdp_dtype dtype; /* FSDP_DT_F32 (or 0), FSDP_DT_BF16, FSDP_DT_F16 */
    int64_t zero_e0, zero_e1; /* elements [zero_e0, zero_e1) of the parameter are zeros (a padding row); empty: none */
} init_job;

/* The values of rule r for a parameter of FULL shape (ndim, shape): j->dist (init_rule_dist) or, for
 * a fixed table, j->sincos, and its zero row (j->zero_e0 / zero_e1, init_rule_zero_range); the other
 * fields are left alone. Errors name `what`. */
int init_job_for_rule(init_job *j, const init_rule *r, int ndim, const int64_t *shape, const char *what,
                      fsdp_err *err);

/* Runs every job (each checked before any runs; `what` names the work in errors). */
int init_fill_jobs(const init_job *jobs, int n, uint64_t seed, const char *what, fsdp_err *err);

/* One job on the calling thread (the values of init_fill_jobs, bit for bit: each element's value depends
 * on its index alone); safe to call from several threads at once. */
int init_fill_one(const init_job *j, uint64_t seed, const char *what, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
