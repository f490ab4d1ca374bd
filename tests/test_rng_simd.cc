// The AVX2+FMA generator (runtime/rng_avx2.c) against the portable path (issue 18, item 3): the same
// bits for every distribution, range and output dtype; and a golden digest of init-cpu's state
// computed before the vectorised generator existed, so the values never change.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

extern "C" {
#include "ckpt/reader.h"
#include "fsdp/tensor.h"
#include "runtime/rng.h"
}

using namespace fsdp_test;

namespace {

uint64_t fnv_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = static_cast<const unsigned char *>(p);
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

// FNV-1a 64 over every tensor of a checkpoint, in its order: name, dtype, and the values as float32
// bits (bf16 / f16 widen exactly).
uint64_t ckpt_digest(const std::string &path, std::string *why) {
    ckpt_reader *r = nullptr;
    fsdp_err err;
    if (ckpt_open(path.c_str(), CKPT_AUTO, &r, &err)) {
        *why = path + ": " + err.msg;
        return 0;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < ckpt_count(r); i++) {
        const ckpt_entry *e = ckpt_entry_at(r, i);
        const int64_t n = fsdp_numel(e->ndim, e->shape);
        std::vector<float> v((size_t)n + 1);
        if (ckpt_read_rows(r, i, 0, e->ndim ? e->shape[0] : 1, v.data(), FSDP_DT_F32, &err)) {
            *why = path + ": " + err.msg;
            ckpt_close(r);
            return 0;
        }
        h = fnv_bytes(h, e->name, strlen(e->name) + 1);
        const int dt = (int)e->dtype;
        h = fnv_bytes(h, &dt, sizeof dt);
        h = fnv_bytes(h, v.data(), (size_t)n * sizeof(float));
    }
    ckpt_close(r);
    return h;
}

// Every init rule the table syntax knows, every dtype, shapes whose sizes are not multiples of the
// vector width nor of RNG_CHUNK, and a 0-d tensor.
const char *const GOLDEN_MODEL =
    "runtime: {device: cpu, seed: 1234}\n"
    "model:\n"
    "  params:\n"
    "    - {name: emb.weight, shape: [301, 67], init: \"normal(0, 0.02)\"}\n"
    "    - {name: emb16.weight, shape: [97, 33], init: \"normal(0.5, 2)\", dtype: bf16}\n"
    "    - {name: tn, shape: [129, 65], init: \"trunc_normal(0.1, 1, a=-1, b=2)\", dtype: f16}\n"
    "    - {name: tn32, shape: [3, 1000], init: \"trunc_normal(0, 0.02, a=-0.04, b=0.04)\"}\n"
    "    - {name: un, shape: [77, 13], init: \"uniform(-0.3, 0.7)\"}\n"
    "    - {name: lin.weight, shape: [130, 250], init: default_linear, dtype: bf16}\n"
    "    - {name: lin.bias, shape: [130], init: default_linear}\n"
    "    - {name: kn, shape: [64, 70], init: \"kaiming_normal(mode=fan_out, nonlinearity=relu)\"}\n"
    "    - {name: ku, shape: [31, 40], init: \"kaiming_uniform(a=0.2)\", dtype: f16}\n"
    "    - {name: xn, shape: [5, 3, 4, 4], init: xavier_normal}\n"
    "    - {name: xu, shape: [6, 9], init: xavier_uniform}\n"
    "    - {name: de, shape: [40, 24], init: default_embedding}\n"
    "    - {name: one, shape: [1, 1, 7], init: ones}\n"
    "    - {name: zero, shape: [9], init: zeros}\n"
    "    - {name: \"scale\", shape: [], init: \"constant(0.5)\"}\n"
    "stages:\n"
    "  - {id: i, uses: init-cpu}\n"
    "  - {id: t, uses: save-safetensors, with: {path: \"${out}\"}}\n";

// The digest of GOLDEN_MODEL's state, computed with the build of main before the AVX2 generator
// (commit efc5aed, portable target_clones fills).
const uint64_t GOLDEN_DIGEST = 0xc8947d410255520cull;

}  // namespace

TEST(RngSimdGolden, InitCpuStateIsUnchangedOnEveryPathAndThreadCount) {
    std::string dir = make_tmpdir("fsdp-rngsimd");
    write_file(dir + "/m.yaml", GOLDEN_MODEL);
    const char *envs[] = {"", "FSDP_RNG_SIMD=0 ", "FSDP_RNG_SIMD=1 "};
    for (const char *env : envs)
        for (int threads : {1, 2, 3}) {
            std::string out = dir + "/s.safetensors", log;
            ASSERT_EQ(run_cmd(std::string(env) + "timeout 120 " + fsdp_run_bin() + " -q " + dir +
                                  "/m.yaml --set runtime.threads=" + std::to_string(threads) +
                                  " --set vars.out=" + out,
                              &log),
                      0)
                << env << log;
            std::string why;
            uint64_t h = ckpt_digest(out, &why);
            ASSERT_TRUE(why.empty()) << why;
            char hex[32];
            snprintf(hex, sizeof hex, "0x%016llx", (unsigned long long)h);
            EXPECT_EQ(h, GOLDEN_DIGEST) << "env '" << env << "', " << threads << " threads: digest " << hex;
            rm_rf(out);
        }
    rm_rf(dir);
}
