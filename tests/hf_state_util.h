// A one-rank state of a Hugging Face fixture's model loaded strictly under HF names (tests of the
// Llama-family architectures, CPU and emulated GPU).
#ifndef FSDP_TESTS_HF_STATE_UTIL_H
#define FSDP_TESTS_HF_STATE_UTIL_H

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

extern "C" {
#include "ckpt/state_io.h"
#include "decoder/decoder_params.h"
#include "decoder/decoder_table.h"
#include "runtime/state.h"
}
#include "decoder_state_util.h"
#include "test_util.h"

namespace fsdp_test {

// The parameters of cfg (decoder_params_build) filled from the fixture directory of `model`; the caller
// frees the state.
inline fsdp_state *hf_state(const std::string &model, const decoder_config &cfg) {
    fsdp_err err;
    decoder_params t;
    EXPECT_EQ(decoder_params_build(&cfg, &t, &err), 0) << err.msg;
    fsdp_state *s = decoder_test_state(cfg);
    for (int i = 0; i < t.n; i++)
        EXPECT_EQ(state_add_param(s, t.p[i].name, t.p[i].ndim, t.p[i].shape, t.p[i].layer, &err), 0) << err.msg;
    decoder_params_free(&t);
    sio_load_opts o;
    memset(&o, 0, sizeof o);
    o.names = SIO_NAMES_HF;
    o.strict = 1;
    o.load_optimizer = 0;
    sio_load_result res;
    EXPECT_EQ(sio_load(s, hf_fixture(model).c_str(), &o, &res, &err), 0) << err.msg;
    EXPECT_EQ(res.params_loaded, s->n);
    return s;
}

}  // namespace fsdp_test

#endif
