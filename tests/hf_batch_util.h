// A Hugging Face fixture's training batch tiled for multi-rank runs (test_hf_train.cc, test_hsdp.cc).
#ifndef FSDP_TESTS_HF_BATCH_UTIL_H
#define FSDP_TESTS_HF_BATCH_UTIL_H

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "st_test_reader.h"
#include "test_util.h"

extern "C" {
#include "ckpt/safetensors.h"
}

namespace hf_batch {

// The fixture's batch repeated `times` times along the batch (rows b, b+2, ... are sample b): the
// same mean loss and gradients, split over `times` ranks of 2 rows each.
inline void write_tiled_batch_of(const std::string &src, int times, const std::string &path) {
    std::map<std::string, st_test::Tensor> b;
    std::string why;
    ASSERT_TRUE(st_test::load(src, &b, &why)) << why;
    st_writer *w;
    fsdp_err err;
    ASSERT_EQ(st_writer_new(&w, path.c_str(), &err), 0) << err.msg;
    const char *names[2] = {"input_ids", "labels"};
    size_t idx[2];
    int64_t rows = b.at("input_ids").shape[0], T = b.at("input_ids").shape[1];
    int64_t shape[2] = {rows * times, T};
    for (int k = 0; k < 2; k++) ASSERT_EQ(st_writer_declare(w, names[k], FSDP_DT_I32, 2, shape, &idx[k], &err), 0);
    ASSERT_EQ(st_writer_begin(w, &err), 0) << err.msg;
    for (int k = 0; k < 2; k++) {
        std::vector<int32_t> v;
        for (int r = 0; r < times; r++) v.insert(v.end(), b.at(names[k]).i32.begin(), b.at(names[k]).i32.end());
        ASSERT_EQ(st_writer_write(w, idx[k], v.data(), v.size() * 4, &err), 0) << err.msg;
    }
    ASSERT_EQ(st_writer_finish(w, &err), 0) << err.msg;
    st_writer_free(w);
}

inline void write_tiled_batch(const std::string &model, int times, const std::string &path) {
    write_tiled_batch_of(fsdp_test::hf_fixture(model, "batch.safetensors"), times, path);
}

}  // namespace hf_batch

#endif
