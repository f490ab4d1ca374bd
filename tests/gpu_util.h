// Whether this machine can run the GPU tests: a CUDA build and at least one usable device.
// GPU tests skip (GTEST_SKIP) only when this says no.
#ifndef FSDP_TESTS_GPU_UTIL_H
#define FSDP_TESTS_GPU_UTIL_H

#include <string>

extern "C" {
#include "runtime/device.h"
}

namespace fsdp_test {

// Number of usable GPUs (0 without CUDA or without a device; *why then says which).
inline int gpu_count(std::string *why = nullptr) {
    if (!dev_built_with_cuda()) {
        if (why) *why = "built without CUDA";
        return 0;
    }
    fsdp_err err;
    fsdp_err_clear(&err);
    int n = 0;
    if (dev_count(&n, &err) != FSDP_OK) n = 0;
    if (n == 0 && why) *why = err.msg;
    return n;
}

inline bool gpu_present(std::string *why = nullptr) { return gpu_count(why) > 0; }

}  // namespace fsdp_test

#endif
