#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "fsdp/tensor.h"

TEST(Dtype, NamesRoundTrip) {
    for (int i = 1; i < FSDP_DT_COUNT; i++) {
        fsdp_dtype dt = (fsdp_dtype)i;
        EXPECT_EQ(fsdp_dtype_from_name(fsdp_dtype_name(dt)), dt);
        EXPECT_EQ(fsdp_dtype_from_name(fsdp_dtype_torch_name(dt)), dt);
        if (fsdp_dtype_st_name(dt)) {
            EXPECT_EQ(fsdp_dtype_from_name(fsdp_dtype_st_name(dt)), dt);
        }
        EXPECT_GT(fsdp_dtype_size(dt), 0u);
    }
    EXPECT_EQ(fsdp_dtype_from_name("nope"), FSDP_DT_INVALID);
}

TEST(Dtype, Bf16RoundNearestEven) {
    EXPECT_EQ(fsdp_f32_to_bf16(1.0f), 0x3f80);
    // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even -> 1.0
    EXPECT_EQ(fsdp_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
    EXPECT_EQ(fsdp_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
    EXPECT_TRUE(std::isnan(fsdp_bf16_to_f32(fsdp_f32_to_bf16(NAN))));
    EXPECT_EQ(fsdp_bf16_to_f32(0x4049), 3.140625f);
}

TEST(Dtype, F16Conversions) {
    const float vals[] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f,
                          0.1f, 1e-6f};
    for (float v : vals) {
        uint16_t h = fsdp_f32_to_f16(v);
        float back = fsdp_f16_to_f32(h);
        EXPECT_NEAR(back, v, std::fabs(v) * 1e-3 + 6e-8) << v;
    }
    EXPECT_EQ(fsdp_f32_to_f16(1.0f), 0x3c00);
    EXPECT_EQ(fsdp_f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
    EXPECT_EQ(fsdp_f16_to_f32(0x0001), 5.960464477539063e-08f);
}

TEST(Dtype, ConvertIntsAndFloats) {
    int32_t src[4] = {-3, 0, 7, 100000};
    double d[4];
    fsdp_err err;
    ASSERT_EQ(fsdp_convert(d, FSDP_DT_F64, src, FSDP_DT_I32, 4, &err), 0);
    EXPECT_EQ(d[0], -3.0);
    EXPECT_EQ(d[3], 100000.0);
    float f[2] = {1.5f, -2.0f};
    uint16_t b[2];
    ASSERT_EQ(fsdp_convert(b, FSDP_DT_BF16, f, FSDP_DT_F32, 2, &err), 0);
    EXPECT_EQ(b[0], 0x3fc0);
    int64_t shape[2] = {3, 4};
    EXPECT_EQ(fsdp_numel(2, shape), 12);
    EXPECT_EQ(fsdp_numel(0, shape), 1);
    char buf[64];
    EXPECT_STREQ(fsdp_shape_str(2, shape, buf, sizeof buf), "[3, 4]");
    EXPECT_NE(fsdp_convert(b, FSDP_DT_C64, f, FSDP_DT_F32, 2, &err), 0);
}
