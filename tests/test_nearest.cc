// The edit distance behind "did you mean" hints (runtime/nearest.h).
#include <gtest/gtest.h>

extern "C" {
#include "runtime/nearest.h"
}

TEST(Nearest, DistanceCountsEditsAndNeighbourSwaps) {
    EXPECT_EQ(nearest_distance("", ""), 0u);
    EXPECT_EQ(nearest_distance("abc", ""), 3u);
    EXPECT_EQ(nearest_distance("kitten", "sitting"), 3u);
    EXPECT_EQ(nearest_distance("warmup_step", "warmup_steps"), 1u);
    EXPECT_EQ(nearest_distance("sed_len", "seq_len"), 1u);
    EXPECT_EQ(nearest_distance("lr", "rl"), 1u);  // a transposition is one edit
    EXPECT_EQ(nearest_distance("LR", "lr"), 0u);  // without case
}

TEST(Nearest, OnlyLikelyTyposAreSuggested) {
    char out[64];
    EXPECT_STREQ(nearest_name("warmup_step", "steps, lr, warmup_steps", out, sizeof out), "warmup_steps");
    EXPECT_STREQ(nearest_name("warmup", "steps, lr, warmup_steps", out, sizeof out), "warmup_steps");
    EXPECT_STREQ(nearest_name("llama3_8bb", "tiny, llama3_3b, llama3_8b, llama3_70b", out, sizeof out), "llama3_8b");
    EXPECT_STREQ(nearest_name("zzzz", "steps, lr, warmup_steps", out, sizeof out), "");
    EXPECT_STREQ(nearest_name("steps", "steps, lr", out, sizeof out), ""); // known: nothing to suggest
    EXPECT_STREQ(nearest_hint("lrr", "steps,lr", out, sizeof out), ": did you mean 'lr'?");
    EXPECT_STREQ(nearest_name("y", "x", out, sizeof out), ""); // one letter for another is no typo
}
