// Learning-rate schedule: the fixture's warmup + linear decay, cosine, none, edge cases.
#include <gtest/gtest.h>

#include <jansson.h>

#include <cmath>
#include <string>

#include "test_util.h"

extern "C" {
#include "train/lr_schedule.h"
}

namespace {

// |a - b| within one ulp of b.
::testing::AssertionResult within_ulp(double a, double b) {
    if (a == b || std::nextafter(b, INFINITY) == a || std::nextafter(b, -INFINITY) == a)
        return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << a << " vs " << b << " (more than 1 ulp apart)";
}

}  // namespace

TEST(LrsSchedule, MatchesFixture) {
    json_error_t je;
    json_t *ref = json_load_file(fsdp_test::tiny("reference.json").c_str(), 0, &je);
    ASSERT_TRUE(ref) << je.text;
    json_t *opt = json_object_get(ref, "optimizer");
    json_t *steps = json_object_get(ref, "steps");
    lrs_config c{};
    c.lr = json_real_value(json_object_get(opt, "lr"));
    c.warmup_steps = json_integer_value(json_object_get(opt, "warmup"));
    c.steps = (int64_t)json_array_size(steps);
    c.decay = LRS_DECAY_LINEAR;
    c.min_lr_ratio = 0.1;
    ASSERT_EQ(c.steps, 5);
    fsdp_err err;
    ASSERT_EQ(lrs_validate(&c, &err), 0) << err.msg;
    for (size_t i = 0; i < json_array_size(steps); i++) {
        json_t *st = json_array_get(steps, i);
        double want = json_real_value(json_object_get(st, "lr"));
        int64_t s = json_integer_value(json_object_get(st, "step")) - 1;  // the fixture counts from 1
        EXPECT_TRUE(within_ulp(lrs_at(&c, s), want)) << "step " << s;
    }
    const double expect[] = {5e-4, 1e-3, 1e-3, 7e-4, 4e-4};
    for (int s = 0; s < 5; s++) EXPECT_TRUE(within_ulp(lrs_at(&c, s), expect[s])) << s;
    json_decref(ref);
}

TEST(LrsSchedule, CosineAndNone) {
    lrs_config c{};
    c.lr = 2.0;
    c.warmup_steps = 4;
    c.steps = 14;
    c.decay = LRS_DECAY_COSINE;
    c.min_lr_ratio = 0.25;
    fsdp_err err;
    ASSERT_EQ(lrs_validate(&c, &err), 0) << err.msg;
    EXPECT_DOUBLE_EQ(lrs_at(&c, 0), 0.5);
    EXPECT_DOUBLE_EQ(lrs_at(&c, 3), 2.0);
    EXPECT_DOUBLE_EQ(lrs_at(&c, 4), 2.0);                         // progress 0
    EXPECT_DOUBLE_EQ(lrs_at(&c, 9), 2.0 * (0.25 + 0.75 * 0.5));  // progress 0.5
    for (int s = 5; s < 14; s++) {
        double p = (s - 4) / 10.0;
        EXPECT_DOUBLE_EQ(lrs_at(&c, s), 2.0 * (0.25 + 0.75 * 0.5 * (1 + std::cos(M_PI * p)))) << s;
        EXPECT_LT(lrs_at(&c, s), lrs_at(&c, s - 1)) << s;
    }
    EXPECT_DOUBLE_EQ(lrs_at(&c, 14), 0.5);  // the end: lr * min_lr_ratio
    EXPECT_DOUBLE_EQ(lrs_at(&c, 100), 0.5);  // past the end: stays there
    c.decay = LRS_DECAY_NONE;
    EXPECT_DOUBLE_EQ(lrs_at(&c, 1), 1.0);
    EXPECT_DOUBLE_EQ(lrs_at(&c, 9), 2.0);
    EXPECT_DOUBLE_EQ(lrs_at(&c, 13), 2.0);
    EXPECT_DOUBLE_EQ(lrs_at(&c, -3), 0.5);  // negative steps count as 0
}

TEST(LrsSchedule, EdgeCases) {
    fsdp_err err;
    lrs_config c{};
    c.lr = 1.0;
    c.steps = 3;
    c.warmup_steps = 3;  // steps == warmup: no decay phase, no division by zero
    c.decay = LRS_DECAY_LINEAR;
    c.min_lr_ratio = 0.0;
    ASSERT_EQ(lrs_validate(&c, &err), 0) << err.msg;
    EXPECT_DOUBLE_EQ(lrs_at(&c, 0), 1.0 / 3);
    EXPECT_DOUBLE_EQ(lrs_at(&c, 2), 1.0);
    EXPECT_DOUBLE_EQ(lrs_at(&c, 3), 1.0);
    EXPECT_DOUBLE_EQ(lrs_at(&c, 4), 0.0);
    EXPECT_TRUE(std::isfinite(lrs_at(&c, 1000)));
    c.decay = LRS_DECAY_COSINE;
    EXPECT_DOUBLE_EQ(lrs_at(&c, 3), 1.0);
    c.warmup_steps = 0;  // no warmup: linear from step 0
    c.decay = LRS_DECAY_LINEAR;
    c.min_lr_ratio = 0.5;
    EXPECT_DOUBLE_EQ(lrs_at(&c, 0), 1.0);
    EXPECT_DOUBLE_EQ(lrs_at(&c, 1), 1.0 - 0.5 / 3);
    c.steps = 1;  // one step, no warmup: span max(1, 1) = 1
    EXPECT_DOUBLE_EQ(lrs_at(&c, 0), 1.0);
}

TEST(LrsSchedule, Validation) {
    struct {
        lrs_config c;
        const char *needle;
    } cases[] = {
        {{-1.0, 0, 10, LRS_DECAY_NONE, 0.0, -1.0, LRS_WSD_LINEAR, 0.0}, "lr must be"},
        {{NAN, 0, 10, LRS_DECAY_NONE, 0.0, -1.0, LRS_WSD_LINEAR, 0.0}, "lr must be"},
        {{1.0, 0, 0, LRS_DECAY_NONE, 0.0, -1.0, LRS_WSD_LINEAR, 0.0}, "steps must be >= 1"},
        {{1.0, 11, 10, LRS_DECAY_NONE, 0.0, -1.0, LRS_WSD_LINEAR, 0.0}, "warmup_steps must be in [0, steps = 10]"},
        {{1.0, -1, 10, LRS_DECAY_NONE, 0.0, -1.0, LRS_WSD_LINEAR, 0.0}, "warmup_steps"},
        {{1.0, 0, 10, LRS_DECAY_LINEAR, 1.5, -1.0, LRS_WSD_LINEAR, 0.0}, "min_lr_ratio"},
        {{1.0, 0, 10, LRS_DECAY_LINEAR, NAN, -1.0, LRS_WSD_LINEAR, 0.0}, "min_lr_ratio"},
        {{1.0, 0, 10, (lrs_decay)9, 0.0, -1.0, LRS_WSD_LINEAR, 0.0}, "unknown"},
    };
    for (const auto &k : cases) {
        fsdp_err err;
        EXPECT_EQ(lrs_validate(&k.c, &err), FSDP_E_INVALID) << k.needle;
        EXPECT_NE(std::string(err.msg).find(k.needle), std::string::npos) << err.msg;
    }
    lrs_decay d;
    EXPECT_EQ(lrs_decay_from_name("cosine", &d), 0);
    EXPECT_EQ(d, LRS_DECAY_COSINE);
    EXPECT_EQ(lrs_decay_from_name("linear", &d), 0);
    EXPECT_EQ(d, LRS_DECAY_LINEAR);
    EXPECT_EQ(lrs_decay_from_name("none", &d), 0);
    EXPECT_EQ(d, LRS_DECAY_NONE);
    EXPECT_EQ(lrs_decay_from_name("wsd", &d), 0);
    EXPECT_EQ(d, LRS_DECAY_WSD);
    EXPECT_EQ(lrs_decay_from_name("step", &d), -1);
    EXPECT_EQ(lrs_decay_from_name(nullptr, &d), -1);
    EXPECT_STREQ(lrs_decay_name(LRS_DECAY_COSINE), "cosine");
}
