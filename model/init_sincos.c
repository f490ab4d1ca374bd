/* The sincos_2d init rule's table (see init_sincos.h). */
#include "model/init_sincos.h"

#include <math.h>
#include <stdio.h>

#include "fsdp/tensor.h"

int init_sincos_make(int64_t grid, double base, int ndim, const int64_t *shape, const char *what, init_sincos *out,
                     fsdp_err *err) {
    char sh[128], why[160] = "";
    if (!what) what = "init";
    fsdp_shape_str(ndim, shape, sh, sizeof sh);
    if (grid < 1 || grid > 2147483647)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: sincos_2d needs grid >= 1 (the side S of the S x S grid), not %lld",
                            what, (long long)grid);
    if (!(base > 0) || !isfinite(base))
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: sincos_2d needs a finite base > 0, not %g", what, base);
    if (ndim != 2) snprintf(why, sizeof why, "it has %d dimension%s", ndim, ndim == 1 ? "" : "s");
    else if (shape[0] != grid * grid) snprintf(why, sizeof why, "it has %lld rows, not %lld", (long long)shape[0],
                                               (long long)(grid * grid));
    else if (shape[1] <= 0 || shape[1] % 4)
        snprintf(why, sizeof why, "D = %lld is not a positive multiple of 4", (long long)shape[1]);
    if (why[0])
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "%s: sincos_2d(grid=%lld) needs a 2-D shape [grid*grid, D] = [%lld, D] with D a positive "
                            "multiple of 4; the parameter is %s (%s)",
                            what, (long long)grid, (long long)(grid * grid), sh, why);
    out->grid = grid;
    out->dim = shape[1];
    out->base = base;
    return 0;
}

void init_sincos_omega(const init_sincos *t, double *omega) {
    /* numpy: omega = arange(D/4, dtype=float64); omega /= (D/2) / 2.; omega = 1. / base**omega */
    const int64_t d4 = t->dim / 4;
    for (int64_t k = 0; k < d4; k++) {
        double e = (double)k / (double)d4;
        omega[k] = 1.0 / pow(t->base, e);
    }
}

/* Element e of the table in float64. */
static double value_at(const init_sincos *t, const double *omega, int64_t e) {
    const int64_t d4 = t->dim / 4, row = e / t->dim, col = e % t->dim;
    const int64_t block = col / d4, k = col % d4;
    /* blocks 0, 1 encode w = row % S, blocks 2, 3 h = row / S; numpy's grid is float32 (exact for any
     * coordinate below 2^24) */
    const int64_t pos = block < 2 ? row % t->grid : row / t->grid;
    const double x = (double)(float)pos * omega[k];
    return block % 2 ? cos(x) : sin(x);
}

void init_sincos_fill_f64(const init_sincos *t, const double *omega, int64_t e0, int64_t n, double *dst) {
    for (int64_t i = 0; i < n; i++) dst[i] = value_at(t, omega, e0 + i);
}

void init_sincos_fill_f32(const init_sincos *t, const double *omega, int64_t e0, int64_t n, float *dst) {
    for (int64_t i = 0; i < n; i++) dst[i] = (float)value_at(t, omega, e0 + i);
}
