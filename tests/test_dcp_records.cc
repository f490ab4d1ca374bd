// Issue 40 item 4: the records every rank sends the coordinator of a multi-rank save (ckpt/dcp_records.c) are
// their fields' bytes only: a grid of records (every ndim, fqn and file-name length at their limits, values and
// tensors, nested keys) reads back field for field, much smaller than the struct, and a list cut at any byte or
// holding an impossible count is an error naming the byte, never records of garbage.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "ckpt/dcp.h"
}

namespace {
std::vector<dcp_record> grid() {
    std::vector<dcp_record> v;
    uint32_t x = 12345;
    auto rnd = [&]() { return x = x * 1664525u + 1013904223u; };
    const size_t fqn_lens[] = {0, 1, 37, 200, sizeof(((dcp_record *)0)->fqn) - 1};
    const size_t rel_lens[] = {0, 12, DCP_REL_PATH_MAX - 1};
    for (int nd = 0; nd <= FSDP_MAX_DIMS; nd++)
        for (size_t fl : fqn_lens)
            for (size_t rl : rel_lens) {
                dcp_record r;
                memset(&r, 0, sizeof r);
                for (size_t i = 0; i < fl; i++) r.fqn[i] = (char)('a' + rnd() % 26);
                for (size_t i = 0; i < rl; i++) r.where.relative_path[i] = (char)('0' + rnd() % 10);
                r.is_tensor = nd > 0 || rnd() % 2;
                r.dtype = (fsdp_dtype)(rnd() % 8);
                r.ndim = nd;
                for (int d = 0; d < nd; d++) {
                    r.shape[d] = (int64_t)(rnd() % 100000) + ((int64_t)1 << 40);
                    r.offsets[d] = (int64_t)(rnd() % 1000);
                    r.sizes[d] = -(int64_t)(rnd() % 7);
                }
                r.where.offset = ((uint64_t)rnd() << 32) | rnd();
                r.where.length = ((uint64_t)rnd() << 32) | rnd();
                r.nest = (int16_t)(rnd() % 5 - 1);
                r.int_mask = (uint16_t)rnd();
                r.tail = (int16_t)(rnd() % 3);
                v.push_back(r);
            }
    return v;
}

void expect_same(const dcp_record &a, const dcp_record &b, size_t i) {
    EXPECT_STREQ(a.fqn, b.fqn) << i;
    EXPECT_EQ(a.is_tensor, b.is_tensor) << i;
    EXPECT_EQ(a.dtype, b.dtype) << i;
    ASSERT_EQ(a.ndim, b.ndim) << i;
    for (int d = 0; d < a.ndim; d++) {
        EXPECT_EQ(a.shape[d], b.shape[d]) << i << " dim " << d;
        EXPECT_EQ(a.offsets[d], b.offsets[d]) << i << " dim " << d;
        EXPECT_EQ(a.sizes[d], b.sizes[d]) << i << " dim " << d;
    }
    EXPECT_STREQ(a.where.relative_path, b.where.relative_path) << i;
    EXPECT_EQ(a.where.offset, b.where.offset) << i;
    EXPECT_EQ(a.where.length, b.where.length) << i;
    EXPECT_EQ(a.nest, b.nest) << i;
    EXPECT_EQ(a.int_mask, b.int_mask) << i;
    EXPECT_EQ(a.tail, b.tail) << i;
}
}  // namespace

TEST(DcpRecords, EveryFieldReadsBackAtEveryLengthAndDimCount) {
    std::vector<dcp_record> v = grid();
    void *buf = nullptr;
    size_t len = 0;
    fsdp_err err;
    ASSERT_EQ(dcp_records_pack(v.data(), v.size(), &buf, &len, &err), 0) << err.msg;
    dcp_record *back = nullptr;
    size_t n = 0;
    ASSERT_EQ(dcp_records_unpack(buf, len, &back, &n, &err), 0) << err.msg;
    ASSERT_EQ(n, v.size());
    for (size_t i = 0; i < n; i++) expect_same(v[i], back[i], i);
    free(back);
    free(buf);
    // none and one
    ASSERT_EQ(dcp_records_pack(v.data(), 0, &buf, &len, &err), 0);
    EXPECT_EQ(len, 0u);
    ASSERT_EQ(dcp_records_unpack(buf, len, &back, &n, &err), 0);
    EXPECT_EQ(n, 0u);
    free(back);
    free(buf);
}

TEST(DcpRecords, AChunkOfATwoDimTensorTakesAboutATenthOfTheStruct) {
    dcp_record r;
    memset(&r, 0, sizeof r);
    snprintf(r.fqn, sizeof r.fqn, "model.layers.117.attention.wq.weight");
    snprintf(r.where.relative_path, sizeof r.where.relative_path, "__4095_0.distcp");
    r.is_tensor = 1, r.ndim = 2, r.shape[0] = 16384, r.shape[1] = 16384, r.sizes[0] = 4, r.sizes[1] = 16384;
    void *buf = nullptr;
    size_t len = 0;
    fsdp_err err;
    ASSERT_EQ(dcp_records_pack(&r, 1, &buf, &len, &err), 0);
    EXPECT_LT(len, (size_t)140);
    EXPECT_LT(len * 7, sizeof r);
    free(buf);
}

TEST(DcpRecords, AListCutAnywhereOrWithAnImpossibleCountIsAnErrorNamingTheByte) {
    std::vector<dcp_record> v = grid();
    v.resize(6);
    void *buf = nullptr;
    size_t len = 0;
    fsdp_err err;
    ASSERT_EQ(dcp_records_pack(v.data(), v.size(), &buf, &len, &err), 0);
    const unsigned char *b = (const unsigned char *)buf;
    // every cut that does not fall between two records
    std::vector<size_t> ends;
    {
        size_t at = 0;
        for (size_t i = 1; i <= v.size(); i++) {
            void *one = nullptr;
            size_t l1 = 0;
            ASSERT_EQ(dcp_records_pack(v.data(), i, &one, &l1, &err), 0);
            free(one);
            ends.push_back(l1);
            at = l1;
        }
        ASSERT_EQ(at, len);
    }
    for (size_t cut = 1; cut < len; cut++) {
        bool boundary = false;
        for (size_t e : ends) boundary |= e == cut;
        dcp_record *back = nullptr;
        size_t n = 0;
        int rc = dcp_records_unpack(b, cut, &back, &n, &err);
        if (boundary) {
            EXPECT_EQ(rc, 0) << cut;
        } else {
            EXPECT_EQ(rc, FSDP_E_FORMAT) << cut;
            if (rc) {
                EXPECT_NE(std::string(err.msg).find("malformed record list"), std::string::npos) << err.msg;
            }
        }
        if (!rc) free(back);
    }
    // a dim count past FSDP_MAX_DIMS, a flag that is not 0 or 1, a name longer than its field
    std::vector<unsigned char> bad(b, b + len);
    const size_t fl = strlen(v[0].fqn);
    bad[2 + fl + 1] = FSDP_MAX_DIMS + 1;
    dcp_record *back = nullptr;
    size_t n = 0;
    EXPECT_EQ(dcp_records_unpack(bad.data(), bad.size(), &back, &n, &err), FSDP_E_FORMAT);
    EXPECT_NE(std::string(err.msg).find("at byte 0 of"), std::string::npos) << err.msg;
    bad.assign(b, b + len);
    bad[2 + fl] = 2;
    EXPECT_EQ(dcp_records_unpack(bad.data(), bad.size(), &back, &n, &err), FSDP_E_FORMAT);
    bad.assign(b, b + len);
    uint16_t big = sizeof(v[0].fqn);
    memcpy(bad.data(), &big, sizeof big);
    EXPECT_EQ(dcp_records_unpack(bad.data(), bad.size(), &back, &n, &err), FSDP_E_FORMAT);
    free(buf);
}
