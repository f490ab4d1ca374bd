/* The decoder family's output head on the CPU: final RMSNorm, output projection and cross-entropy, in chunks of
 * ws->head_chunk rows so that the logits of at most one chunk exist at once (decoder_model.h). */
#include "decoder/decoder_model_internal.h"

#include <string.h>

/* Labels of the batch: in range or ignored; the number kept. */
static int count_labels(const decoder_config *c, const decoder_model_ws *ws, int64_t *kept, fsdp_err *err) {
    const int64_t n = (int64_t)ws->B * ws->T;
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        const int32_t lab = ws->labels[i];
        if (lab == DECODER_MODEL_IGNORE_INDEX) continue;
        if (lab < 0 || lab >= c->vocab_size)
            return fsdp_err_set(err, FSDP_E_INVALID,
                                "decoder forward: labels: cross-entropy: label %lld is %d, expected 0 <= label < vocab "
                                "%d or ignore_index %d",
                                (long long)i, (int)lab, c->vocab_size, DECODER_MODEL_IGNORE_INDEX);
        k++;
    }
    *kept = k;
    return FSDP_OK;
}

/* Logits of rows [r0, r0 + m) into the chunk buffer. */
static void chunk_logits(const decoder_config *c, const float *output_w, decoder_model_ws *ws, int r0, int m) {
    kc_linear_forward(ws->xnf + (size_t)r0 * c->dim, output_w, ws->logits, m, c->dim, c->vocab_size, ws->stats);
}

/* Loss of the chunk's rows (lse into lse_x), added to ws->loss. */
static int chunk_loss(const decoder_config *c, decoder_model_ws *ws, int r0, int m, fsdp_err *err) {
    double sum = 0;
    int64_t kept = 0;
    int rc = kc_xent_forward(ws->logits, ws->labels + r0, m, c->vocab_size, DECODER_MODEL_IGNORE_INDEX, ws->lse_x + r0,
                             &sum, &kept, err);
    if (rc) return fsdp_err_prefix(err, "decoder forward: labels");
    ws->loss.loss_sum += sum;
    ws->loss.n_valid += kept;
    return FSDP_OK;
}

/* The chunk's logits -> dlogits in place, then dxn rows = dlogits W_out, d_output += dlogits^T xnf. */
static void chunk_backward(const decoder_config *c, const float *output_w, float *d_output, float scale,
                           decoder_model_ws *ws, int r0, int m) {
    const int d = c->dim, V = c->vocab_size;
    kc_xent_backward(ws->logits, ws->labels + r0, ws->lse_x + r0, ws->logits, m, V, DECODER_MODEL_IGNORE_INDEX, scale);
    kc_linear_backward_input(ws->logits, output_w, ws->dxn + (size_t)r0 * d, m, d, V, 0.0f, ws->stats);
    kc_linear_backward_weight(ws->logits, ws->xnf + (size_t)r0 * d, d_output, m, d, V, ws->stats);
}

static float loss_scale(double loss_denom, int64_t n_valid) {
    double denom = loss_denom > 0.0 ? loss_denom : (double)n_valid;
    return denom > 0.0 ? (float)(1.0 / denom) : 0.0f;
}

/* The final norm's backward from dxn into a fresh dres. */
static void norm_backward(const decoder_config *c, const float *norm_w, float *d_norm, decoder_model_ws *ws) {
    const int n = ws->B * ws->T, d = c->dim;
    memset(ws->dres, 0, (size_t)n * (size_t)d * sizeof(float));
    kc_rmsnorm_backward(ws->dxn, ws->x_final, norm_w, ws->rstdf, ws->dres, d_norm, n, d);
    ws->phase = DECODER_PHASE_BWD;
    ws->bwd_next = c->n_layers - 1;
}

static int head_ready(const decoder_config *c, const decoder_model_ws *ws, const char *what, fsdp_err *err) {
    int rc = decoder_model_ws_check(c, ws, what, err);
    if (rc) return rc;
    if (ws->phase != DECODER_PHASE_FWD || ws->fwd_next != c->n_layers)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder forward: head run before all %d layers (next layer %d)",
                            c->n_layers, ws->phase == DECODER_PHASE_FWD ? ws->fwd_next : -1);
    return FSDP_OK;
}

int decoder_fwd_head(const decoder_config *c, const float *norm_w, const float *output_w, decoder_model_ws *ws,
                   decoder_model_loss *loss, fsdp_err *err) {
    int rc = head_ready(c, ws, "decoder forward (head)", err);
    if (rc) return rc;
    const int n = ws->B * ws->T, C = ws->head_chunk;
    int64_t kept = 0;
    if (ws->has_labels && (rc = count_labels(c, ws, &kept, err))) return rc;
    kc_rmsnorm_forward(ws->x_final, norm_w, ws->xnf, ws->rstdf, n, c->dim, (float)c->norm_eps);
    memset(&ws->loss, 0, sizeof ws->loss);
    ws->head_full = n <= C;
    /* without labels and over several chunks nothing would be left to read: no logits at all */
    if (ws->has_labels || ws->head_full) {
        for (int r0 = 0; r0 < n; r0 += C) {
            const int m = n - r0 < C ? n - r0 : C;
            chunk_logits(c, output_w, ws, r0, m);
            if (ws->has_labels && (rc = chunk_loss(c, ws, r0, m, err))) return rc;
        }
    }
    if (ws->has_labels) ws->loss.loss = ws->loss.n_valid > 0 ? ws->loss.loss_sum / (double)ws->loss.n_valid : 0.0;
    if (loss) *loss = ws->loss;
    ws->phase = DECODER_PHASE_HEAD;
    return FSDP_OK;
}

int decoder_bwd_head(const decoder_config *c, const float *norm_w, const float *output_w, float *d_norm,
                   float *d_output, double loss_denom, decoder_model_ws *ws, fsdp_err *err) {
    int rc = decoder_model_ws_check(c, ws, "decoder backward (head)", err);
    if (rc) return rc;
    if (ws->phase != DECODER_PHASE_HEAD)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder backward: the head backward needs a completed forward");
    if (!ws->has_labels)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder backward: the forward ran without labels, there is no loss");
    const int n = ws->B * ws->T, C = ws->head_chunk;
    const float scale = loss_scale(loss_denom, ws->loss.n_valid);
    /* one chunk: the forward's logits are still there; several: each chunk's logits again (the
     * same GEMM on the same inputs, so the forward's lse still applies) */
    for (int r0 = 0; r0 < n; r0 += C) {
        const int m = n - r0 < C ? n - r0 : C;
        if (!ws->head_full) chunk_logits(c, output_w, ws, r0, m);
        chunk_backward(c, output_w, d_output, scale, ws, r0, m);
    }
    norm_backward(c, norm_w, d_norm, ws);
    return FSDP_OK;
}

int decoder_head_train(const decoder_config *c, const float *norm_w, const float *output_w, float *d_norm,
                     float *d_output, double loss_denom, decoder_model_ws *ws, decoder_model_loss *loss, fsdp_err *err) {
    int rc = head_ready(c, ws, "decoder training head", err);
    if (rc) return rc;
    if (!ws->has_labels)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder training head: the forward ran without labels, there is no loss");
    const int n = ws->B * ws->T, C = ws->head_chunk;
    int64_t kept = 0;
    if ((rc = count_labels(c, ws, &kept, err))) return rc;
    const float scale = loss_scale(loss_denom, kept);
    kc_rmsnorm_forward(ws->x_final, norm_w, ws->xnf, ws->rstdf, n, c->dim, (float)c->norm_eps);
    memset(&ws->loss, 0, sizeof ws->loss);
    ws->head_full = 0; /* the buffer ends holding a gradient */
    for (int r0 = 0; r0 < n; r0 += C) {
        const int m = n - r0 < C ? n - r0 : C;
        chunk_logits(c, output_w, ws, r0, m);
        if ((rc = chunk_loss(c, ws, r0, m, err))) return rc;
        chunk_backward(c, output_w, d_output, scale, ws, r0, m);
    }
    ws->loss.loss = ws->loss.n_valid > 0 ? ws->loss.loss_sum / (double)ws->loss.n_valid : 0.0;
    if (loss) *loss = ws->loss;
    norm_backward(c, norm_w, d_norm, ws);
    return FSDP_OK;
}
