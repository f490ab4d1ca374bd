// Corrupt, truncated and inconsistent checkpoints give clear errors, never crashes.
#include <gtest/gtest.h>

#include "ckpt_compare.h"
#include "fuzz/fuzz.h"
#include "test_util.h"

#include <set>
#include <zlib.h>

extern "C" {
#include "ckpt/dcp.h"
#include "ckpt/pickle.h"
#include "ckpt/torchsave.h"
#include "ckpt/zip.h"
}

using namespace fsdp_test;

namespace {
std::string copy_ckpt(const std::string &src, const std::string &dst) {
    system(("rm -rf '" + dst + "' && cp -r '" + src + "' '" + dst + "'").c_str());
    return dst;
}
std::string open_err(const std::string &p) {
    ckpt_reader *r = nullptr;
    fsdp_err err;
    err.msg[0] = 0;
    int rc = ckpt_open(p.c_str(), CKPT_AUTO, &r, &err);
    if (rc == 0) {
        // opened: reading every tensor must then fail or succeed cleanly
        for (size_t i = 0; i < ckpt_count(r); i++) {
            const ckpt_entry *e = ckpt_entry_at(r, i);
            if (!e->is_tensor) continue;
            std::vector<double> b((size_t)std::max<int64_t>(1, fsdp_numel(e->ndim, e->shape)));
            if (ckpt_read_rows(r, i, 0, e->ndim ? e->shape[0] : 1, b.data(), FSDP_DT_F64, &err)) {
                ckpt_close(r);
                return err.msg;
            }
        }
        ckpt_close(r);
        return "";
    }
    return err.msg;
}
}  // namespace

TEST(CkptErrors, TruncatedAndFlippedMetadata) {
    std::string meta = read_file(tiny("dcp_full_ws3/.metadata"));
    ASSERT_FALSE(meta.empty());
    // every truncation is an error (or, at the very end, the same parse)
    for (size_t n = 0; n < meta.size(); n += 97) {
        dcp_item *items;
        size_t cnt;
        char ver[32];
        fsdp_err err;
        EXPECT_NE(dcp_parse_metadata(meta.data(), n, "t", &items, &cnt, ver, sizeof ver, &err), 0) << n;
        EXPECT_NE(std::string(err.msg).find("t:"), std::string::npos) << err.msg;
    }
    // flipped bytes: handled (error or a consistent parse), never a crash
    for (size_t i = 0; i < meta.size(); i += 131) {
        std::string m = meta;
        m[i] ^= 0x5a;
        fsdp_fuzz_dcp_meta((const uint8_t *)m.data(), m.size());
        fsdp_fuzz_pickle((const uint8_t *)m.data(), m.size());
    }
    pkl_doc *doc;
    const pkl_obj *root;
    fsdp_err err;
    const unsigned char bad_op[] = {0x80, 0x02, 0xff, '.'};
    EXPECT_NE(pkl_parse(bad_op, sizeof bad_op, "x", &doc, &root, &err), 0);
    EXPECT_NE(std::string(err.msg).find("unknown or unsupported opcode 0xff"), std::string::npos) << err.msg;
    const unsigned char bad_memo[] = {0x80, 0x02, 'h', 7, '.'};
    EXPECT_NE(pkl_parse(bad_memo, sizeof bad_memo, "x", &doc, &root, &err), 0);
    EXPECT_NE(std::string(err.msg).find("memo reference 7 out of range"), std::string::npos) << err.msg;
    std::string deep = "\x80\x02";
    for (int i = 0; i < 1000; i++) deep += "]";
    for (int i = 0; i < 999; i++) deep += "a";
    deep += ".";
    EXPECT_NE(pkl_parse(deep.data(), deep.size(), "x", &doc, &root, &err), 0);
    EXPECT_NE(std::string(err.msg).find("nesting deeper than the limit"), std::string::npos) << err.msg;
}

TEST(CkptErrors, DamagedDcpDirectories) {
    std::string t = make_tmpdir("fsdp-ckerr");
    // .metadata pointing past the end of a .distcp (the data file was truncated)
    std::string d = copy_ckpt(tiny("dcp_model_ws2"), t + "/trunc");
    ASSERT_EQ(truncate((d + "/__1_0.distcp").c_str(), 1000), 0);
    std::string e = open_err(d);
    EXPECT_NE(e.find("__1_0.distcp"), std::string::npos) << e;
    EXPECT_NE(e.find("has only 1000 bytes"), std::string::npos) << e;
    // flipped bytes inside the data: errors or values, never a crash
    d = copy_ckpt(tiny("dcp_seed_ws1"), t + "/flip");
    std::string data = read_file(d + "/__0_0.distcp");
    for (size_t i = 0; i < data.size(); i += 997) {
        std::string x = data;
        x[i] ^= 0x77;
        write_file(d + "/__0_0.distcp", x);
        open_err(d);
    }
    // a chunk list that does not cover the tensor: a rank-local checkpoint missing a rank
    d = copy_ckpt(tiny("dcp_model_ws2"), t + "/hole");
    std::string meta = read_file(d + "/.metadata");
    // the two chunks of output.weight are (0,0) and (128,0): rename the second's offset key
    // so that it no longer has storage -> missing pieces
    unlink((d + "/.metadata").c_str());
    e = open_err(d);
    EXPECT_NE(e.find("incomplete"), std::string::npos) << e;
    // a mismatched shape (stored piece vs its chunk) and a missing file
    d = copy_ckpt(tiny("dcp_model_ws2"), t + "/nofile");
    unlink((d + "/__0_0.distcp").c_str());
    e = open_err(d);
    EXPECT_NE(e.find("cannot open __0_0.distcp"), std::string::npos) << e;
    // compressed zip entries are refused by name
    rm_rf(t);
}

TEST(CkptErrors, CoverageAndBoundsAreChecked) {
    // write a 2-chunk tensor, then a .metadata that lists only one chunk
    std::string t = make_tmpdir("fsdp-cov");
    dcp_file_writer w;
    fsdp_err err;
    ASSERT_EQ(dcp_file_open(&w, t.c_str(), 0, &err), 0) << err.msg;
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t shape[2] = {4, 2}, off0[2] = {0, 0}, off1[2] = {2, 0}, sz[2] = {2, 2};
    dcp_record rec[2];
    ASSERT_EQ(dcp_file_add_tensor(&w, "w", FSDP_DT_F32, 2, shape, off0, sz, a, &rec[0], &err), 0);
    ASSERT_EQ(dcp_file_add_tensor(&w, "w", FSDP_DT_F32, 2, shape, off1, sz, a + 4, &rec[1], &err), 0);
    ASSERT_EQ(dcp_file_close(&w, &err), 0);
    ASSERT_EQ(dcp_write_metadata(t.c_str(), rec, 1, &err), 0);
    std::string e = open_err(t);
    EXPECT_NE(e.find("w: the chunks cover 4 of 8 elements"), std::string::npos) << e;
    // out of bounds
    dcp_record bad = rec[1];
    bad.offsets[0] = 3;
    dcp_record two[2] = {rec[0], bad};
    ASSERT_EQ(dcp_write_metadata(t.c_str(), two, 2, &err), 0);
    e = open_err(t);
    EXPECT_NE(e.find("chunk 1 reaches index 5 of dim 0 (size 4)"), std::string::npos) << e;
    // both chunks: reads back
    ASSERT_EQ(dcp_write_metadata(t.c_str(), rec, 2, &err), 0);
    EXPECT_EQ(open_err(t), "");
    rm_rf(t);
}

TEST(CkptPickleWriter, IntegersUseTheRightOpcodes) {
    auto enc = [](int64_t v) {
        pkl_w w;
        pkl_w_init(&w);
        pkl_w_int(&w, v);
        std::string s((const char *)w.buf, w.len);
        pkl_w_free(&w);
        return s;
    };
    EXPECT_EQ(enc(5), std::string("K\x05", 2));
    EXPECT_EQ(enc(718), std::string("M\xce\x02", 3));
    EXPECT_EQ(enc(70000), std::string("J\x70\x11\x01\x00", 5));
    // offsets beyond 2 GiB: LONG1, e.g. 2^33 + 5 = 8a 05 05 00 00 00 02
    EXPECT_EQ(enc((1ll << 33) + 5), std::string("\x8a\x05\x05\x00\x00\x00\x02", 7));
    EXPECT_EQ(enc(1ll << 31), std::string("\x8a\x05\x00\x00\x00\x80\x00", 7));
    // and they read back
    for (int64_t v : std::vector<int64_t>{0, 255, 65536, -1, (1ll << 31), (1ll << 33) + 5, -(1ll << 40), INT64_MAX}) {
        std::string p = "\x80\x02" + enc(v) + ".";
        pkl_doc *doc;
        const pkl_obj *root;
        fsdp_err err;
        ASSERT_EQ(pkl_parse(p.data(), p.size(), "x", &doc, &root, &err), 0) << err.msg;
        EXPECT_EQ(root->kind, PKL_INT);
        EXPECT_EQ(root->i, v);
        pkl_free(doc);
    }
}

TEST(CkptZipWriter, AlignedPayloadsAndCorrectCrcs) {
    std::string t = make_tmpdir("fsdp-zip");
    FILE *tf = fopen((t + "/a.pt").c_str(), "w+b");
    ASSERT_TRUE(tf);
    float v[37];
    for (int i = 0; i < 37; i++) v[i] = (float)i * 0.5f;
    int64_t shape[1] = {37};
    uint64_t alen = 0;
    fsdp_err err;
    ASSERT_EQ(ts_write_tensor(tf, FSDP_DT_F32, 1, shape, v, nullptr, nullptr, &alen, &err), 0) << err.msg;
    fclose(tf);
    std::string data = read_file(t + "/a.pt");
    ASSERT_EQ(data.size(), alen);
    zip_reader z;
    ASSERT_EQ(zip_open_mem(&z, data.data(), data.size(), "a.pt", &err), 0) << err.msg;
    std::set<std::string> names;
    for (size_t i = 0; i < z.n; i++) {
        void *p;
        size_t n;
        ASSERT_EQ(zip_read_all(&z, &z.entries[i], &p, &n, &err), 0) << err.msg;
        EXPECT_EQ(z.entries[i].crc, (uint32_t)crc32(0, (const Bytef *)p, (uInt)n)) << z.entries[i].name;
        EXPECT_EQ(z.entries[i].data_off % 64, 0u) << z.entries[i].name;
        names.insert(z.entries[i].name);
        free(p);
    }
    EXPECT_EQ(names, (std::set<std::string>{"archive/data.pkl", "archive/byteorder", "archive/data/0", "archive/version"}));
    // and the tensor reads back
    pkl_doc *doc;
    const pkl_obj *root;
    ts_tensor tt;
    ASSERT_EQ(ts_load_pickle(&z, &doc, &root, &err), 0) << err.msg;
    ASSERT_EQ(ts_tensor_from_pickle(root, "a.pt", &tt, &err), 0) << err.msg;
    pkl_free(doc);
    float back[37];
    int64_t off[1] = {0}, l[1] = {37};
    ASSERT_EQ(ts_read_box(&z, &tt, off, l, back, FSDP_DT_F32, &err), 0);
    EXPECT_EQ(0, memcmp(back, v, sizeof v));
    zip_close(&z);
    rm_rf(t);
}
