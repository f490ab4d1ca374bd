/* The decoder family's parameter init from the counter-based RNG (runtime/rng.h): any row range of any
 * parameter can be generated alone, and the values never depend on how a parameter is sharded,
 * on the world size or on the number of threads.
 *
 * Element e (row-major flat index in the full parameter) of parameter p with seed s is drawn from
 * rng stream rng_fnv1a64(p->name), index e, key s, with p->init's rule (decoder_params.h) turned
 * into an rng_dist (decoder_init_dist): normal -> rng_dist_normal, trunc_normal ->
 * rng_dist_trunc_normal (torch's inverse-CDF algorithm in float32), ones -> the constant 1.0f.
 * The same function runs on the GPU (decoder_init_rows_dev, decoder/decoder_init_cuda.c) and gives the
 * same bits. bf16 output is the float value rounded to nearest even (fsdp_f32_to_bf16). The values
 * are not PyTorch's (which uses mt19937 on CPU, Philox on CUDA, in a sequential stream): the
 * distributions are the same, the bits are our own.
 *
 * The host fills are vectorised and run on all OpenMP threads; decoder_init_jobs runs many
 * (parameter, row range) pieces in one parallel region, so small parameters are filled side by
 * side. */
#ifndef FSDP_DECODER_DECODER_INIT_H
#define FSDP_DECODER_DECODER_INIT_H

#include <stdint.h>

#include "fsdp/error.h"
#include "decoder/decoder_params.h"
#include "runtime/device.h"
#include "runtime/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The rng stream of a parameter: rng_fnv1a64(p->name). */
uint64_t decoder_init_stream(const decoder_param *p);

/* The distribution of p's init rule (FSDP_E_INVALID naming p for a bad rule). */
int decoder_init_dist(const decoder_param *p, rng_dist *d, fsdp_err *err);

/* One piece of init work: rows [r0, r1) of p into f32 (or, when f32 is NULL, into bf16 as bf16
 * bits). round_bf16 (f32 output only) stores each value rounded to bf16 precision, as a float. */
typedef struct decoder_init_job {
    const decoder_param *p;
    int64_t r0, r1;
    float *f32;
    uint16_t *bf16;
    int round_bf16;
} decoder_init_job;

/* Runs every job on all OpenMP threads (one parallel region; the values are those of
 * decoder_init_rows_f32/bf16 whatever the thread count). Every job is checked before any is run. */
int decoder_init_jobs(const decoder_init_job *jobs, int n, uint64_t seed, fsdp_err *err);

/* Rows [r0, r1) of dim 0 of p (a 1-D parameter has rows of one element) into dst, which holds
 * (r1 - r0) * p->row_numel values. 0 <= r0 <= r1 <= p->shape[0]; an empty range is fine. */
int decoder_init_rows_f32(const decoder_param *p, uint64_t seed, int64_t r0, int64_t r1, float *dst,
                        fsdp_err *err);
int decoder_init_rows_bf16(const decoder_param *p, uint64_t seed, int64_t r0, int64_t r1,
                         uint16_t *dst, fsdp_err *err);

/* Rows [r0, r1) of p into d_dst, a device buffer of (r1 - r0) * p->row_numel floats, generated on
 * the current GPU of d (queued on its compute stream, not synchronised) with the same bits as
 * decoder_init_rows_f32. FSDP_E_DEVICE in a build without CUDA. */
int decoder_init_rows_dev(dev_ctx *d, const decoder_param *p, uint64_t seed, int64_t r0, int64_t r1, float *d_dst,
                        fsdp_err *err);

/* Every parameter of the table into one flat buffer of t->total values (parameter i at
 * t->p[i].offset). */
int decoder_init_model_f32(const decoder_params *t, uint64_t seed, float *flat, fsdp_err *err);
int decoder_init_model_bf16(const decoder_params *t, uint64_t seed, uint16_t *flat, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
