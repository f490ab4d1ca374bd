/* Llama-3 parameter init from the counter-based RNG (runtime/rng.h): any row range of any
 * parameter can be generated alone, and the values never depend on how a parameter is sharded,
 * on the world size or on the number of threads.
 *
 * Element e (row-major flat index in the full parameter) of parameter p with seed s is drawn from
 * rng stream rng_fnv1a64(p->name), index e, key s, with p->init's rule (llama_params.h):
 * normal -> rng_fill_normal, trunc_normal -> rng_fill_trunc_normal (torch's algorithm, in
 * double, rounded to float), ones -> 1.0f. bf16 output is the float value rounded to nearest even
 * (fsdp_f32_to_bf16). The values are not PyTorch's (which uses mt19937 on CPU, Philox on CUDA, in
 * a sequential stream): the distributions are the same, the bits are our own. */
#ifndef FSDP_MODEL_LLAMA_INIT_H
#define FSDP_MODEL_LLAMA_INIT_H

#include <stdint.h>

#include "fsdp/error.h"
#include "model/llama_params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The rng stream of a parameter: rng_fnv1a64(p->name). */
uint64_t llama_init_stream(const llama_param *p);

/* Rows [r0, r1) of dim 0 of p (a 1-D parameter has rows of one element) into dst, which holds
 * (r1 - r0) * p->row_numel values. 0 <= r0 <= r1 <= p->shape[0]; an empty range is fine. */
int llama_init_rows_f32(const llama_param *p, uint64_t seed, int64_t r0, int64_t r1, float *dst,
                        fsdp_err *err);
int llama_init_rows_bf16(const llama_param *p, uint64_t seed, int64_t r0, int64_t r1,
                         uint16_t *dst, fsdp_err *err);

/* Every parameter of the table into one flat buffer of t->total values (parameter i at
 * t->p[i].offset). */
int llama_init_model_f32(const llama_params *t, uint64_t seed, float *flat, fsdp_err *err);
int llama_init_model_bf16(const llama_params *t, uint64_t seed, uint16_t *flat, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
