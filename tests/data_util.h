// The training data loader's batches as the data tests read them (train/data.h).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

extern "C" {
#include "train/data.h"
}

namespace fsdp_test {

// Rank `rank` of `world`'s inputs (or labels) of the global batch at `pos`, the source opened for it alone.
inline std::vector<int32_t> batch(const data_config &c, int vocab, int world, int rank, uint64_t pos,
                                  bool labels = false) {
    data_source *d = nullptr;
    fsdp_err err;
    EXPECT_EQ(data_open(&c, vocab, world, rank, &d, &err), 0) << err.msg;
    if (!d) return {};
    int64_t lb = data_local_batch(d);
    std::vector<int32_t> in((size_t)(lb * c.seq_len)), lab(in.size());
    EXPECT_EQ(data_batch(d, pos, in.data(), lab.data(), &err), 0) << err.msg;
    data_close(d);
    return labels ? lab : in;
}

} // namespace fsdp_test
