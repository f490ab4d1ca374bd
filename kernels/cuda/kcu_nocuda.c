/* The kernels of kernels/cuda/kcu.h in a build without CUDA (the .cu files are not compiled):
 * every entry point fails with FSDP_E_DEVICE "built without CUDA", so that callers link and report
 * a clear error in both builds. In a CUDA build this file is empty. */
#include "kernels/cuda/kcu.h"
#include "runtime/device_internal.h"

typedef int dev_nocuda_unit; /* keeps the translation unit non-empty in CUDA builds */

#if !FSDP_HAVE_CUDA

#define NOCUDA(name) return dev_err_no_cuda(err, #name)

int kcu_cast(void *dst, fsdp_dtype dst_dt, const void *src, fsdp_dtype src_dt, int64_t n, kcu_stream stream,
             fsdp_err *err) {
    (void)dst, (void)dst_dt, (void)src, (void)src_dt, (void)n, (void)stream;
    NOCUDA(kcu_cast);
}

int kcu_add(fsdp_dtype dt, const void *a, const void *b, void *out, int64_t n, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)a, (void)b, (void)out, (void)n, (void)stream;
    NOCUDA(kcu_add);
}

int kcu_acc_f64(double *acc, const double *x, int64_t n, kcu_stream stream, fsdp_err *err) {
    (void)acc, (void)x, (void)n, (void)stream;
    NOCUDA(kcu_acc_f64);
}

int kcu_scale(float *x, int64_t n, float s, kcu_stream stream, fsdp_err *err) {
    (void)x, (void)n, (void)s, (void)stream;
    NOCUDA(kcu_scale);
}

int kcu_sumsq(fsdp_dtype dt, const void *x, int64_t n, double *d_out, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)x, (void)n, (void)d_out, (void)stream;
    NOCUDA(kcu_sumsq);
}

int kcu_bias_forward(fsdp_dtype dt, void *y, const void *b, int64_t n, int out, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)y, (void)b, (void)n, (void)out, (void)stream;
    NOCUDA(kcu_bias_forward);
}

int kcu_bias_backward(fsdp_dtype dt, const void *dy, float *db, int64_t n, int out, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)dy, (void)db, (void)n, (void)out, (void)stream;
    NOCUDA(kcu_bias_backward);
}

int kcu_embedding_forward(fsdp_dtype dt, const void *table, const int32_t *tokens, void *out, int64_t n, int vocab,
                          int dim, int *d_bad, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)table, (void)tokens, (void)out, (void)n, (void)vocab, (void)dim, (void)d_bad, (void)stream;
    NOCUDA(kcu_embedding_forward);
}

int kcu_embedding_backward(fsdp_dtype dt, const void *dout, const int32_t *tokens, float *dtable, int64_t n, int vocab,
                           int dim, int padding_idx, int *d_bad, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)dout, (void)tokens, (void)dtable, (void)n, (void)vocab, (void)dim, (void)padding_idx, (void)d_bad,
        (void)stream;
    NOCUDA(kcu_embedding_backward);
}

int kcu_rmsnorm_forward(fsdp_dtype dt, const void *x, const void *w, void *y, float *rstd, int64_t n, int dim,
                        float eps, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)x, (void)w, (void)y, (void)rstd, (void)n, (void)dim, (void)eps, (void)stream;
    NOCUDA(kcu_rmsnorm_forward);
}

int kcu_rmsnorm_apply(fsdp_dtype dt, const void *x, const void *w, const float *rstd, void *y, int64_t n, int dim,
                      kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)x, (void)w, (void)rstd, (void)y, (void)n, (void)dim, (void)stream;
    NOCUDA(kcu_rmsnorm_apply);
}

int kcu_rmsnorm_backward(fsdp_dtype dt, const void *dy, const void *x, const void *w, const float *rstd, void *dx,
                         float *dw, int64_t n, int dim, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)dy, (void)x, (void)w, (void)rstd, (void)dx, (void)dw, (void)n, (void)dim, (void)stream;
    NOCUDA(kcu_rmsnorm_backward);
}

int kcu_rope_forward(fsdp_dtype dt, void *x, const float *cos_t, const float *sin_t, int B, int T, int nh,
                     int head_dim, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)x, (void)cos_t, (void)sin_t, (void)B, (void)T, (void)nh, (void)head_dim, (void)stream;
    NOCUDA(kcu_rope_forward);
}

int kcu_rope_backward(fsdp_dtype dt, void *dx, const float *cos_t, const float *sin_t, int B, int T, int nh,
                      int head_dim, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)dx, (void)cos_t, (void)sin_t, (void)B, (void)T, (void)nh, (void)head_dim, (void)stream;
    NOCUDA(kcu_rope_backward);
}

int kcu_rope_qk_forward(fsdp_dtype dt, void *q, void *k, const float *cos_t, const float *sin_t, int B, int T, int H,
                        int KV, int head_dim, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)q, (void)k, (void)cos_t, (void)sin_t, (void)B, (void)T, (void)H, (void)KV, (void)head_dim,
        (void)stream;
    NOCUDA(kcu_rope_qk_forward);
}

int kcu_rope_qk_backward(fsdp_dtype dt, void *dq, void *dk, const float *cos_t, const float *sin_t, int B, int T,
                         int H, int KV, int head_dim, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)dq, (void)dk, (void)cos_t, (void)sin_t, (void)B, (void)T, (void)H, (void)KV, (void)head_dim,
        (void)stream;
    NOCUDA(kcu_rope_qk_backward);
}

int kcu_attention_forward(fsdp_dtype dt, const void *q, const void *k, const void *v, void *out, float *lse, int B,
                          int T, int H, int KV, int hd, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)B, (void)T, (void)H, (void)KV, (void)hd,
        (void)stream;
    NOCUDA(kcu_attention_forward);
}

int kcu_attention_tc_supported(fsdp_dtype dt, int hd) {
    (void)dt, (void)hd;
    return 0;
}

int kcu_attention_forward_impl(kcu_attn_impl impl, fsdp_dtype dt, const void *q, const void *k, const void *v,
                               void *out, float *lse, int B, int T, int H, int KV, int hd, kcu_stream stream,
                               fsdp_err *err) {
    (void)impl, (void)dt, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)B, (void)T, (void)H, (void)KV,
        (void)hd, (void)stream;
    NOCUDA(kcu_attention_forward_impl);
}

int kcu_attention_backward_impl(kcu_attn_impl impl, fsdp_dtype dt, const void *q, const void *k, const void *v,
                                const void *out, const float *lse, const void *dout, void *dq, void *dk, void *dv,
                                int B, int T, int H, int KV, int hd, float *scratch, kcu_stream stream,
                                fsdp_err *err) {
    (void)impl, (void)dt, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)dout, (void)dq, (void)dk, (void)dv,
        (void)B, (void)T, (void)H, (void)KV, (void)hd, (void)scratch, (void)stream;
    NOCUDA(kcu_attention_backward_impl);
}

size_t kcu_attention_scratch_floats(int B, int T, int H) {
    if (B <= 0 || T <= 0 || H <= 0) return 0;
    return (size_t)B * (size_t)T * (size_t)H;
}

int kcu_attention_backward(fsdp_dtype dt, const void *q, const void *k, const void *v, const void *out,
                           const float *lse, const void *dout, void *dq, void *dk, void *dv, int B, int T, int H,
                           int KV, int hd, float *scratch, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)dout, (void)dq, (void)dk, (void)dv, (void)B,
        (void)T, (void)H, (void)KV, (void)hd, (void)scratch, (void)stream;
    NOCUDA(kcu_attention_backward);
}

int kcu_swiglu_forward(fsdp_dtype dt, const void *a, const void *b, void *out, int64_t n, kcu_stream stream,
                       fsdp_err *err) {
    (void)dt, (void)a, (void)b, (void)out, (void)n, (void)stream;
    NOCUDA(kcu_swiglu_forward);
}

int kcu_swiglu_backward(fsdp_dtype dt, const void *a, const void *b, const void *dout, void *da, void *db, int64_t n,
                        kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)a, (void)b, (void)dout, (void)da, (void)db, (void)n, (void)stream;
    NOCUDA(kcu_swiglu_backward);
}

int kcu_swiglu_backward_recompute(fsdp_dtype dt, const void *a, const void *b, const void *dout, void *da, void *db,
                                  void *out, int64_t n, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)a, (void)b, (void)dout, (void)da, (void)db, (void)out, (void)n, (void)stream;
    NOCUDA(kcu_swiglu_backward_recompute);
}

int kcu_xent_forward(fsdp_dtype dt, const void *logits, const int32_t *labels, int64_t n, int vocab, int ignore_index,
                     float *lse, double *d_sums, int *d_bad, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)logits, (void)labels, (void)n, (void)vocab, (void)ignore_index, (void)lse, (void)d_sums,
        (void)d_bad, (void)stream;
    NOCUDA(kcu_xent_forward);
}

int kcu_xent_backward(fsdp_dtype dt, const void *logits, const int32_t *labels, const float *lse, void *dlogits,
                      int64_t n, int vocab, int ignore_index, float scale, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)logits, (void)labels, (void)lse, (void)dlogits, (void)n, (void)vocab, (void)ignore_index,
        (void)scale, (void)stream;
    NOCUDA(kcu_xent_backward);
}

int kcu_xent_chunk(fsdp_dtype dt, const void *logits, const int32_t *labels, int64_t n, int vocab, int ignore_index,
                   float scale, float *lse, double *d_sums, int *d_bad, void *dlogits, kcu_stream stream,
                   fsdp_err *err) {
    (void)dt, (void)logits, (void)labels, (void)n, (void)vocab, (void)ignore_index, (void)scale, (void)lse,
        (void)d_sums, (void)d_bad, (void)dlogits, (void)stream;
    NOCUDA(kcu_xent_chunk);
}

int kcu_tensor_list_create(const kcu_tensor *t, int count, kcu_tensor_list **out, fsdp_err *err) {
    (void)t, (void)count;
    *out = NULL;
    NOCUDA(kcu_tensor_list_create);
}

void kcu_tensor_list_free(kcu_tensor_list *l) { (void)l; }

int kcu_adamw_step(const kcu_tensor_list *l, const kc_adamw_hparams *h, int64_t step, kcu_stream stream,
                   fsdp_err *err) {
    (void)l, (void)h, (void)step, (void)stream;
    NOCUDA(kcu_adamw_step);
}

int kcu_list_grad_sumsq(const kcu_tensor_list *l, double *d_out, kcu_stream stream, fsdp_err *err) {
    (void)l, (void)d_out, (void)stream;
    NOCUDA(kcu_list_grad_sumsq);
}

int kcu_list_grad_scale(const kcu_tensor_list *l, float s, kcu_stream stream, fsdp_err *err) {
    (void)l, (void)s, (void)stream;
    NOCUDA(kcu_list_grad_scale);
}

int kcu_clip_coef(const double *d_stats, double max_norm, float *d_clip, kcu_stream stream, fsdp_err *err) {
    (void)d_stats, (void)max_norm, (void)d_clip, (void)stream;
    NOCUDA(kcu_clip_coef);
}

int kcu_list_grad_scale_dev(const kcu_tensor_list *l, const float *d_clip, kcu_stream stream, fsdp_err *err) {
    (void)l, (void)d_clip, (void)stream;
    NOCUDA(kcu_list_grad_scale_dev);
}

int kcu_adamw_step_guarded(const kcu_tensor_list *l, const kc_adamw_hparams *h, int64_t step, const float *d_clip,
                           kcu_stream stream, fsdp_err *err) {
    (void)l, (void)h, (void)step, (void)d_clip, (void)stream;
    NOCUDA(kcu_adamw_step_guarded);
}

int kcu_init_fill(float *dst, const rng_dist *dist, uint64_t seed, uint64_t stream, uint64_t start, int64_t n,
                  kcu_stream s, fsdp_err *err) {
    (void)dst, (void)dist, (void)seed, (void)stream, (void)start, (void)n, (void)s;
    NOCUDA(kcu_init_fill);
}

int kcu_moe_route(const float *logits, int64_t n, int E, int K, int norm_topk, float *probs, int32_t *top,
                  float *topw, int *d_bad, kcu_stream stream, fsdp_err *err) {
    (void)logits, (void)n, (void)E, (void)K, (void)norm_topk, (void)probs, (void)top, (void)topw, (void)d_bad,
        (void)stream;
    NOCUDA(kcu_moe_route);
}

int kcu_moe_sort(const int32_t *top, int64_t n, int E, int K, int32_t *offsets, int32_t *slot_of, int32_t *pair_of,
                 int32_t *scratch, int *d_bad, kcu_stream stream, fsdp_err *err) {
    (void)top, (void)n, (void)E, (void)K, (void)offsets, (void)slot_of, (void)pair_of, (void)scratch, (void)d_bad,
        (void)stream;
    NOCUDA(kcu_moe_sort);
}

int kcu_moe_gather(fsdp_dtype dt, const void *x, const int32_t *pair_of, int64_t n, int K, int d, void *xs,
                   kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)x, (void)pair_of, (void)n, (void)K, (void)d, (void)xs, (void)stream;
    NOCUDA(kcu_moe_gather);
}

int kcu_moe_combine(fsdp_dtype dt, const void *ys, const float *w, const int32_t *slot_of, int64_t n, int K, int d,
                    int accumulate, void *out, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)ys, (void)w, (void)slot_of, (void)n, (void)K, (void)d, (void)accumulate, (void)out, (void)stream;
    NOCUDA(kcu_moe_combine);
}

int kcu_moe_combine_backward(fsdp_dtype dt, const void *dout, const void *ys, const float *w, const int32_t *slot_of,
                             int64_t n, int K, int d, void *dys, float *dw, kcu_stream stream, fsdp_err *err) {
    (void)dt, (void)dout, (void)ys, (void)w, (void)slot_of, (void)n, (void)K, (void)d, (void)dys, (void)dw,
        (void)stream;
    NOCUDA(kcu_moe_combine_backward);
}

int kcu_moe_router_backward(const float *probs, const int32_t *top, const float *topw, const float *dtopw,
                            const float *dp_aux, int64_t n, int E, int K, int norm_topk, float *dp, float *dlogits,
                            kcu_stream stream, fsdp_err *err) {
    (void)probs, (void)top, (void)topw, (void)dtopw, (void)dp_aux, (void)n, (void)E, (void)K, (void)norm_topk,
        (void)dp, (void)dlogits, (void)stream;
    NOCUDA(kcu_moe_router_backward);
}

int kcu_moe_stats(const float *probs, const int32_t *offsets, int64_t n, int E, double *counts, double *psum,
                  kcu_stream stream, fsdp_err *err) {
    (void)probs, (void)offsets, (void)n, (void)E, (void)counts, (void)psum, (void)stream;
    NOCUDA(kcu_moe_stats);
}

#endif
