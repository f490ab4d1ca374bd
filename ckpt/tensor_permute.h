/* Dim permutations of dense row-major tensors (module prefix tperm_): what torch's
 * `x.permute(*perm).contiguous()` gives, for the loads that turn a stored tensor into a parameter
 * declared with another layout (sio_xform, ckpt/state_io.h). */
#ifndef FSDP_CKPT_TENSOR_PERMUTE_H
#define FSDP_CKPT_TENSOR_PERMUTE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out = in.permute(perm) for a float tensor `in` of shape[nd] (nd <= 8; perm a permutation of
 * 0..nd-1); out holds numel values and must not overlap in. */
void tperm_f32(const float *in, const int64_t *shape, const int *perm, int nd, float *out);
/* 1 when the permutation keeps dim 0 in place (perm[0] == 0), so that each dim-0 row of the result is
 * the permuted row of the same index: a sharded load reads only its own rows. */
int tperm_keeps_rows(const int *perm, int nd);

#ifdef __cplusplus
}
#endif
#endif
