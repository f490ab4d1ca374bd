// Tensor-core (WMMA, bf16) causal attention: the launchers kcu_attention.cu dispatches to. Shapes and
// conventions are those of kcu_attention_forward/backward (kernels/cuda/kcu.h); arguments are checked
// by the caller (attn_check) before these are called.
#ifndef FSDP_KERNELS_CUDA_KCU_ATTENTION_TC_CUH
#define FSDP_KERNELS_CUDA_KCU_ATTENTION_TC_CUH

#include "kernels/cuda/kcu.h"

// 1 when the tensor-core kernels handle dtype dt and head_dim hd (bf16, hd 64 or 128).
int kcu_attn_tc_shape_ok(fsdp_dtype dt, int hd);
// 1 when every pointer is 16-byte aligned (the kernels move 8 bf16 at a time); NULLs are skipped.
int kcu_attn_tc_aligned(const void *const *ptrs, int n);

// q, k, v, out bf16; lse float32 [B,H,T].
int kcu_attn_tc_forward(const void *q, const void *k, const void *v, void *out, float *lse, int B, int T, int H,
                        int KV, int hd, kcu_stream stream, fsdp_err *err);
// D [B,H,T] = rowsum(dO * O), computed by the caller; overwrites dq, dk, dv (bf16).
int kcu_attn_tc_backward(const void *q, const void *k, const void *v, const float *lse, const float *D,
                         const void *dout, void *dq, void *dk, void *dv, int B, int T, int H, int KV, int hd,
                         kcu_stream stream, fsdp_err *err);

#endif
