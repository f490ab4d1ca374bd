// A bare sharded state of world 1 whose trainer is the decoder config cfg (decoder_state_set_config),
// with no parameters yet: what the training-step tests fill from their fixtures. Free with state_free.
#ifndef FSDP_TESTS_DECODER_STATE_UTIL_H
#define FSDP_TESTS_DECODER_STATE_UTIL_H

#include <gtest/gtest.h>

#include <cstdlib>

#include "decoder/decoder_table.h"
#include "runtime/state.h"

inline fsdp_state *decoder_test_state(const decoder_config &cfg) {
    fsdp_state *s = (fsdp_state *)calloc(1, sizeof(fsdp_state));
    s->layout = STATE_SHARDED;
    s->world = 1;
    fsdp_err err;
    EXPECT_EQ(decoder_state_set_config(s, &cfg, &err), 0) << err.msg;
    return s;
}

#endif
