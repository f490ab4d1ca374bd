// A sharded fsdp_state for checkpoint tests: named parameters of given shapes, values derived from
// each element's global index (so every shard split gives the same full tensors), optionally the
// AdamW moments.
#ifndef FSDP_TESTS_STATE_FIXTURE_H
#define FSDP_TESTS_STATE_FIXTURE_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

extern "C" {
#include "runtime/state.h"
}

namespace fsdp_test {

struct StateParamSpec {
    const char *name;
    int ndim;
    int64_t shape[2];
    int shard_dim; // as state_add_param (-1: the default)
};

// data = sin(g * freq + i) * amp, exp_avg = g * m1, exp_avg_sq = 1 / (g + m2_off) for the element of
// global index g of parameter i.
struct StateValues {
    double freq, amp, m1, m2_off;
    int64_t opt_step;
};

inline fsdp_state *make_spec_state(int rank, int world, const std::vector<StateParamSpec> &specs,
                                   const StateValues &v, bool fill, bool opt) {
    fsdp_state *s = (fsdp_state *)calloc(1, sizeof *s);
    s->layout = STATE_SHARDED;
    s->rank = rank;
    s->world = world;
    s->beta1 = 0.9;
    s->beta2 = 0.95;
    s->eps = 1e-8;
    fsdp_err err;
    for (const StateParamSpec &p : specs) {
        int64_t shape[2] = {p.shape[0], p.shape[1]};
        EXPECT_EQ(state_add_param(s, p.name, p.ndim, shape, p.shard_dim, &err), 0) << err.msg;
    }
    if (opt) {
        EXPECT_EQ(state_alloc_optimizer(s, &err), 0) << err.msg;
        s->has_optimizer = 1;
        s->opt_step = v.opt_step;
    }
    if (!fill) return s;
    for (size_t i = 0; i < s->n; i++) {
        state_param *p = &s->p[i];
        const size_t n = state_param_local_numel(p);
        for (size_t k = 0; k < n; k++) {
            const double g = (double)(p->row0 * p->row_numel + (int64_t)k);
            p->data[k] = (float)(std::sin(g * v.freq + (double)i) * v.amp);
            if (opt) {
                p->exp_avg[k] = (float)(g * v.m1);
                p->exp_avg_sq[k] = (float)(1.0 / (g + v.m2_off));
            }
        }
    }
    return s;
}

} // namespace fsdp_test

#endif
