/* The init rule sincos_2d(grid=S, base=10000) (model/init_rule.h): the fixed 2-D sine-cosine position
 * table of MAE / DiT, numpy's get_2d_sincos_pos_embed(D, S) (MAE's util/pos_embed.py; Bagel's
 * PositionEmbedding), for a parameter of FULL shape [S*S, D], D a positive multiple of 4.
 *
 * With D4 = D / 4, row i = h*S + w (h = i / S, w = i % S) holds four blocks of D4 columns
 *   [sin(w * omega_k) | cos(w * omega_k) | sin(h * omega_k) | cos(h * omega_k)],  k = 0 .. D4-1
 * (the first half encodes the column index w), computed in float64 as numpy does:
 *   omega_k = 1 / base^(k / D4)      (k / D4 one float64 division, pow, one division)
 *   x       = pos * omega_k          (one float64 multiply; pos = the float32 grid coordinate)
 * then sin / cos (libm's), and the float64 value cast to float32 (round to nearest). No RNG: the
 * values depend on nothing but the element's index, so every seed, world size, sharding and device
 * gives the same bits (the GPU path computes them on the host and uploads them). */
#ifndef FSDP_MODEL_INIT_SINCOS_H
#define FSDP_MODEL_INIT_SINCOS_H

#include <stdint.h>

#include "fsdp/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A sincos_2d table: grid S, width D, base. grid 0: not a table. */
typedef struct init_sincos {
    int64_t grid, dim;
    double base;
} init_sincos;

/* The table of sincos_2d(grid, base) for a parameter of FULL shape (ndim, shape): FSDP_E_INVALID,
 * naming `what`, its shape and what the rule needs, unless grid >= 1, base > 0 and the shape is
 * [grid*grid, D] with D a positive multiple of 4. */
int init_sincos_make(int64_t grid, double base, int ndim, const int64_t *shape, const char *what, init_sincos *out,
                     fsdp_err *err);

/* omega[k], k < dim / 4, as above. */
void init_sincos_omega(const init_sincos *t, double *omega);

/* Elements [e0, e0 + n) (flat row-major indices of the full table) in float64 / as float32, from
 * the table's omega (init_sincos_omega). The range must lie in the table. */
void init_sincos_fill_f64(const init_sincos *t, const double *omega, int64_t e0, int64_t n, double *dst);
void init_sincos_fill_f32(const init_sincos *t, const double *omega, int64_t e0, int64_t n, float *dst);

#ifdef __cplusplus
}
#endif
#endif
