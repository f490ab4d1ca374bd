// Replays the committed fuzz corpus (tests/fuzz/corpus/<harness>/) through the harnesses:
// every input must be handled without a crash (ASan/UBSan in `make asan`).
#include <gtest/gtest.h>

#include <dirent.h>

#include "fuzz/fuzz.h"
#include "test_util.h"

using namespace fsdp_test;

static size_t replay(const char *name, int (*fn)(const uint8_t *, size_t)) {
    std::string dir = std::string("tests/fuzz/corpus/") + name;
    DIR *d = opendir(dir.c_str());
    EXPECT_TRUE(d) << dir;
    if (!d) return 0;
    size_t n = 0;
    while (struct dirent *e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        std::string data = read_file(dir + "/" + e->d_name);
        fn((const uint8_t *)data.data(), data.size());
        n++;
    }
    closedir(d);
    return n;
}

TEST(FuzzReplay, Pickle) { EXPECT_GT(replay("pickle", fsdp_fuzz_pickle), 0u); }
TEST(FuzzReplay, Zip) { EXPECT_GT(replay("zip", fsdp_fuzz_zip), 0u); }
TEST(FuzzReplay, Safetensors) { EXPECT_GT(replay("safetensors", fsdp_fuzz_safetensors), 0u); }
TEST(FuzzReplay, DcpMetadata) { EXPECT_GT(replay("dcp_meta", fsdp_fuzz_dcp_meta), 0u); }
TEST(FuzzReplay, Recipe) { EXPECT_GT(replay("recipe", fsdp_fuzz_recipe), 0u); }
TEST(FuzzReplay, Model) { EXPECT_GT(replay("model", fsdp_fuzz_model), 0u); }
TEST(FuzzReplay, HfConfig) { EXPECT_GT(replay("hf_config", fsdp_fuzz_hf_config), 0u); }
TEST(FuzzReplay, Pt) { EXPECT_GT(replay("pt", fsdp_fuzz_pt), 0u); }
TEST(FuzzReplay, Llmc) { EXPECT_GT(replay("llmc", fsdp_fuzz_llmc), 0u); }
TEST(FuzzReplay, Tokenizer) { EXPECT_GT(replay("tokenizer", fsdp_fuzz_tokenizer), 0u); }
