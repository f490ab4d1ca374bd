/* The decoder family's output head on the GPU: final RMSNorm, output projection and cross-entropy in chunks of
 * ws->head_chunk rows (the CPU's decoder/decoder_head.c with kcu_ kernels and dev_linear_* GEMMs on the
 * compute stream), so that at most one chunk of logits exists at once. */
#include "decoder/decoder_cuda_internal.h"

#include <string.h>

#include "runtime/device_gemm.h"

/* Stops at the first failing call, prefixing where it happened. */
#define TRY(call, ...)                                              \
    do {                                                            \
        int try_rc_ = (call);                                       \
        if (try_rc_) return err ? fsdp_err_prefix(err, __VA_ARGS__) : try_rc_; \
    } while (0)

static size_t row_bytes(const decoder_cuda_ws *ws, int cols) { return (size_t)cols * fsdp_dtype_size(ws->dt); }

static int head_ready(const decoder_config *c, const decoder_cuda_ws *ws, const char *what, fsdp_err *err) {
    int rc = decoder_cuda_ws_check(c, ws, what, err);
    if (rc) return rc;
    if (ws->phase != DECODER_CUDA_FWD || ws->fwd_next != c->n_layers)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) forward: head run before all %d layers (next layer %d)",
                            c->n_layers, ws->phase == DECODER_CUDA_FWD ? ws->fwd_next : -1);
    return FSDP_OK;
}

/* Logits of rows [r0, r0 + m) into the chunk buffer. */
static int chunk_logits(const decoder_config *c, const void *output_w, decoder_cuda_ws *ws, int r0, int m,
                        fsdp_err *err) {
    const void *x = (const char *)ws->xnf + (size_t)r0 * row_bytes(ws, c->dim);
    TRY(dev_linear_forward(ws->d, ws->dt, x, output_w, ws->logits, m, c->dim, c->vocab_size, err),
        "decoder (cuda) head: output (rows %d..%d)", r0, r0 + m - 1);
    return FSDP_OK;
}

/* The chunk's dlogits (in the chunk buffer) -> dxn rows and d_output +=. */
static int chunk_weight_grads(const decoder_config *c, const void *output_w, float *d_output, decoder_cuda_ws *ws, int r0,
                              int m, fsdp_err *err) {
    const size_t off = (size_t)r0 * row_bytes(ws, c->dim);
    TRY(dev_linear_backward_input(ws->d, ws->dt, ws->logits, output_w, (char *)ws->dxn + off, m, c->dim, c->vocab_size,
                                  0.0f, err),
        "decoder (cuda) backward: output (rows %d..%d)", r0, r0 + m - 1);
    TRY(dev_linear_backward_weight(ws->d, ws->dt, ws->logits, (const char *)ws->xnf + off, d_output, m, c->dim,
                                   c->vocab_size, err),
        "decoder (cuda) backward: output weight (rows %d..%d)", r0, r0 + m - 1);
    return FSDP_OK;
}

static float loss_scale(double loss_denom, int64_t n_valid) {
    double denom = loss_denom > 0.0 ? loss_denom : (double)n_valid;
    return denom > 0.0 ? (float)(1.0 / denom) : 0.0f;
}

/* The final norm's backward from dxn into a fresh dres. */
static int norm_backward(const decoder_config *c, const void *norm_w, float *d_norm, decoder_cuda_ws *ws, fsdp_err *err) {
    const int n = ws->B * ws->T, d = c->dim;
    TRY(dev_memset0(ws->d, ws->dres, (size_t)n * row_bytes(ws, d), DEV_STREAM_COMPUTE, err), "decoder (cuda) backward");
    TRY(kcu_rmsnorm_backward(ws->dt, ws->dxn, ws->x_final, norm_w, ws->rstdf, ws->dres, d_norm, n, d, ws->s, err),
        "decoder (cuda) backward: norm");
    ws->phase = DECODER_CUDA_BWD;
    ws->bwd_next = c->n_layers - 1;
    return FSDP_OK;
}

int decoder_cuda_fwd_head(const decoder_config *c, const void *norm_w, const void *output_w, decoder_cuda_ws *ws,
                        decoder_model_loss *loss, fsdp_err *err) {
    int rc = head_ready(c, ws, "decoder (cuda) forward (head)", err);
    if (rc) return rc;
    const int n = ws->B * ws->T, d = c->dim, V = c->vocab_size, C = ws->head_chunk;
    TRY(kcu_rmsnorm_forward(ws->dt, ws->x_final, norm_w, ws->xnf, ws->rstdf, n, d, (float)c->norm_eps, ws->s, err),
        "decoder (cuda) forward: norm");
    memset(&ws->loss, 0, sizeof ws->loss);
    ws->head_full = n <= C;
    if (ws->has_labels)
        TRY(dev_memset0(ws->d, ws->sums, 2 * sizeof(double), DEV_STREAM_COMPUTE, err), "decoder (cuda) forward: loss");
    /* without labels and over several chunks nothing would be left to read: no logits at all */
    if (ws->has_labels || ws->head_full) {
        for (int r0 = 0; r0 < n; r0 += C) {
            const int m = n - r0 < C ? n - r0 : C;
            if ((rc = chunk_logits(c, output_w, ws, r0, m, err))) return rc;
            if (ws->has_labels)
                TRY(kcu_xent_chunk(ws->dt, ws->logits, ws->labels + r0, m, V, DECODER_MODEL_IGNORE_INDEX, 0.0f,
                                   ws->lse_x + r0, ws->sums, NULL, NULL, ws->s, err),
                    "decoder (cuda) forward: cross-entropy");
        }
    }
    if (ws->has_labels) {
        ws->loss.n_valid = ws->n_valid;
        if (loss) {
            double sums[2];
            TRY(dev_download(ws->d, sums, ws->sums, sizeof sums, err), "decoder (cuda) forward: loss");
            ws->loss.loss_sum = sums[0];
            ws->loss.loss = ws->n_valid > 0 ? sums[0] / (double)ws->n_valid : 0.0;
        }
    }
    if (loss) *loss = ws->loss;
    ws->phase = DECODER_CUDA_HEAD;
    return FSDP_OK;
}

int decoder_cuda_head_train(const decoder_config *c, const void *norm_w, const void *output_w, float *d_norm,
                          float *d_output, double loss_denom, decoder_cuda_ws *ws, fsdp_err *err) {
    int rc = head_ready(c, ws, "decoder (cuda) training head", err);
    if (rc) return rc;
    if (!ws->has_labels)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "decoder (cuda) training head: the forward ran without labels, there is no loss");
    const int n = ws->B * ws->T, d = c->dim, V = c->vocab_size, C = ws->head_chunk;
    const float scale = loss_scale(loss_denom, ws->n_valid);
    TRY(kcu_rmsnorm_forward(ws->dt, ws->x_final, norm_w, ws->xnf, ws->rstdf, n, d, (float)c->norm_eps, ws->s, err),
        "decoder (cuda) forward: norm");
    memset(&ws->loss, 0, sizeof ws->loss);
    ws->head_full = 0; /* the buffer ends holding a gradient */
    TRY(dev_memset0(ws->d, ws->sums, 2 * sizeof(double), DEV_STREAM_COMPUTE, err), "decoder (cuda) forward: loss");
    for (int r0 = 0; r0 < n; r0 += C) {
        const int m = n - r0 < C ? n - r0 : C;
        if ((rc = chunk_logits(c, output_w, ws, r0, m, err))) return rc;
        TRY(kcu_xent_chunk(ws->dt, ws->logits, ws->labels + r0, m, V, DECODER_MODEL_IGNORE_INDEX, scale, ws->lse_x + r0,
                           ws->sums, NULL, ws->logits, ws->s, err),
            "decoder (cuda) training head: cross-entropy");
        if ((rc = chunk_weight_grads(c, output_w, d_output, ws, r0, m, err))) return rc;
    }
    ws->loss.n_valid = ws->n_valid;
    return norm_backward(c, norm_w, d_norm, ws, err);
}

int decoder_cuda_bwd_head(const decoder_config *c, const void *norm_w, const void *output_w, float *d_norm,
                        float *d_output, double loss_denom, decoder_cuda_ws *ws, fsdp_err *err) {
    int rc = decoder_cuda_ws_check(c, ws, "decoder (cuda) backward (head)", err);
    if (rc) return rc;
    if (ws->phase != DECODER_CUDA_HEAD)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) backward: the head backward needs a completed forward");
    if (!ws->has_labels)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder (cuda) backward: the forward ran without labels, there is no loss");
    const int n = ws->B * ws->T, V = c->vocab_size, C = ws->head_chunk;
    const float scale = loss_scale(loss_denom, ws->n_valid);
    /* one chunk: the forward's logits are still there; several: each chunk's logits again (the
     * same GEMM on the same inputs, so the forward's lse still applies) */
    for (int r0 = 0; r0 < n; r0 += C) {
        const int m = n - r0 < C ? n - r0 : C;
        if (!ws->head_full && (rc = chunk_logits(c, output_w, ws, r0, m, err))) return rc;
        TRY(kcu_xent_backward(ws->dt, ws->logits, ws->labels + r0, ws->lse_x + r0, ws->logits, m, V,
                              DECODER_MODEL_IGNORE_INDEX, scale, ws->s, err),
            "decoder (cuda) backward: cross-entropy");
        if ((rc = chunk_weight_grads(c, output_w, d_output, ws, r0, m, err))) return rc;
    }
    return norm_backward(c, norm_w, d_norm, ws, err);
}
