/* Private to decoder/decoder_*.c: the mixture-of-experts feed-forward of a MoE layer (decoder_layer_is_moe)
 * inside the decoder's forward and backward, on the workspace's MoE buffers. */
#ifndef FSDP_DECODER_DECODER_MOE_H
#define FSDP_DECODER_DECODER_MOE_H

#include "decoder/decoder_model_internal.h"

/* Clears the load-balancing statistics and gradient (a new forward). */
void decoder_moe_ws_reset(decoder_model_ws *ws);
/* out = the experts' feed-forward of xn (the ffn_norm output) for layer `layer`; records the routing
 * statistics unless ws->recompute. */
int decoder_moe_forward(const decoder_config *c, const decoder_model_layer *lw, int layer, decoder_model_ws *ws,
                        const float *xn, float *out, fsdp_err *err);
/* dxn (overwritten) and the layer's expert and router gradients (+=) from dout. */
int decoder_moe_backward(const decoder_config *c, const decoder_model_layer *lw, decoder_model_layer *lg, int layer,
                         decoder_model_ws *ws, const float *xn, const float *dout, float *dxn, fsdp_err *err);

#endif
