// safetensors reader/writer against the PyTorch/safetensors 0.8.0 fixtures.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <jansson.h>

#include "ckpt/safetensors.h"
#include "test_util.h"

using fsdp_test::tiny;

namespace {

struct Reader {
    st_reader *r = nullptr;
    fsdp_err err{};
    int rc = 0;
    explicit Reader(const std::string &path) { rc = st_open(&r, path.c_str(), &err); }
    ~Reader() { st_close(r); }
    const st_tensor_info *find(const char *name) const { return st_find(r, name); }
};

std::string bytes_of(const st_reader *r, const st_tensor_info *t) {
    return std::string(static_cast<const char *>(st_data(r, t)), t->nbytes);
}

// A safetensors file from a header text (padded with spaces to 8) and a data buffer.
std::string make_st(const std::string &header, const std::string &data, bool pad = true) {
    std::string h = header;
    while (pad && h.size() % 8) h += ' ';
    std::string out(8, '\0');
    uint64_t n = h.size();
    for (int i = 0; i < 8; i++) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out + h + data;
}

struct TmpDir {
    std::string path = fsdp_test::make_tmpdir("st");
    ~TmpDir() { fsdp_test::rm_rf(path); }
    std::string file(const std::string &name) const { return path + "/" + name; }
};

// Opens a file made of header + data and returns the error (rc, message).
int open_bad(const std::string &content, std::string *msg, const std::string &name = "bad.safetensors") {
    TmpDir d;
    std::string p = d.file(name);
    fsdp_test::write_file(p, content);
    st_reader *r = nullptr;
    fsdp_err err{};
    int rc = st_open(&r, p.c_str(), &err);
    st_close(r);
    *msg = err.msg;
    EXPECT_EQ(r == nullptr, rc != 0);
    if (rc) { EXPECT_NE(msg->find(name), std::string::npos) << *msg; }
    return rc;
}

const char *kFixtures[] = {"model_init.safetensors", "model_step5.safetensors", "adam_step5.safetensors",
                           "grads_step0.safetensors", "batch.safetensors", "dcp_dtypes_expected.safetensors",
                           "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};

}  // namespace

TEST(StReader, EveryFixtureOpensAndTilesTheFile) {
    for (const char *f : kFixtures) {
        Reader rd(tiny(f));
        ASSERT_EQ(rd.rc, 0) << f << ": " << rd.err.msg;
        ASSERT_GT(st_count(rd.r), 0u);
        uint64_t end = 0;
        size_t file_size = fsdp_test::read_file(tiny(f)).size();
        for (size_t i = 0; i < st_count(rd.r); i++) {
            const st_tensor_info *t = st_tensor(rd.r, i);
            ASSERT_GE(t->offset, end == 0 ? 8u : end);
            if (i) { EXPECT_EQ(t->offset, end) << t->name; }  // listed in offset order, contiguous
            end = t->offset + t->nbytes;
            EXPECT_EQ(st_find(rd.r, t->name), t);
            EXPECT_TRUE(st_is_aligned(rd.r, t)) << t->name;  // safetensors >= 0.3 aligns
        }
        EXPECT_EQ(end, file_size) << f;
        EXPECT_EQ(st_find(rd.r, "no.such.tensor"), nullptr);
        EXPECT_EQ(st_file_count(rd.r), 1u);
        EXPECT_EQ(st_index_path(rd.r), nullptr);
    }
}

TEST(StReader, ModelInitNamesShapesMetadata) {
    Reader rd(tiny("model_init.safetensors"));
    ASSERT_EQ(rd.rc, 0) << rd.err.msg;
    EXPECT_EQ(st_count(rd.r), 21u);  // 2 layers x 9 + embeddings, norm, output
    ASSERT_EQ(st_metadata_count(rd.r, 0), 1u);
    EXPECT_STREQ(st_metadata_get(rd.r, 0, "format"), "pt");
    const char *k, *v;
    ASSERT_EQ(st_metadata_at(rd.r, 0, 0, &k, &v), 0);
    EXPECT_STREQ(k, "format");
    EXPECT_NE(st_metadata_at(rd.r, 0, 1, &k, &v), 0);
    struct {
        const char *name;
        int ndim;
        int64_t d0, d1;
    } want[] = {{"tok_embeddings.weight", 2, 256, 64},      {"layers.0.attention.wq.weight", 2, 64, 64},
                {"layers.1.attention.wk.weight", 2, 32, 64}, {"layers.0.feed_forward.w2.weight", 2, 64, 192},
                {"layers.1.ffn_norm.weight", 1, 64, 0},      {"norm.weight", 1, 64, 0},
                {"output.weight", 2, 256, 64}};
    for (auto &w : want) {
        const st_tensor_info *t = rd.find(w.name);
        ASSERT_NE(t, nullptr) << w.name;
        EXPECT_EQ(t->dtype, FSDP_DT_F32);
        ASSERT_EQ(t->ndim, w.ndim);
        EXPECT_EQ(t->shape[0], w.d0);
        if (w.ndim == 2) { EXPECT_EQ(t->shape[1], w.d1); }
        EXPECT_EQ(t->nbytes, 4u * (uint64_t)w.d0 * (w.ndim == 2 ? w.d1 : 1));
    }
    // norm weights are initialised to ones
    std::vector<float> ones(64);
    ASSERT_EQ(st_read_named(rd.r, "layers.0.attention_norm.weight", ones.data(), FSDP_DT_F32, &rd.err), 0);
    for (float x : ones) EXPECT_EQ(x, 1.0f);
    EXPECT_NE(st_read_named(rd.r, "missing", ones.data(), FSDP_DT_F32, &rd.err), 0);
    EXPECT_NE(std::string(rd.err.msg).find("missing"), std::string::npos);
}

TEST(StReader, BatchIsInt32) {
    Reader rd(tiny("batch.safetensors"));
    ASSERT_EQ(rd.rc, 0) << rd.err.msg;
    EXPECT_EQ(st_count(rd.r), 2u);
    EXPECT_EQ(st_metadata_count(rd.r, 0), 0u);
    for (const char *n : {"input_ids", "labels"}) {
        const st_tensor_info *t = rd.find(n);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->dtype, FSDP_DT_I32);
        EXPECT_EQ(t->shape[0], 2);
        EXPECT_EQ(t->shape[1], 32);
        std::vector<int32_t> ids(64);
        ASSERT_EQ(st_read(rd.r, t, ids.data(), FSDP_DT_INVALID, &rd.err), 0);
        for (int32_t x : ids) {
            EXPECT_GE(x, 0);
            EXPECT_LT(x, 256);  // vocab 256
        }
        std::vector<int64_t> wide(64);
        ASSERT_EQ(st_read(rd.r, t, wide.data(), FSDP_DT_I64, &rd.err), 0);
        for (int i = 0; i < 64; i++) EXPECT_EQ(wide[i], ids[i]);
    }
    // labels are the inputs shifted by one
    std::vector<int32_t> in(64), lab(64);
    ASSERT_EQ(st_read_named(rd.r, "input_ids", in.data(), FSDP_DT_I32, &rd.err), 0);
    ASSERT_EQ(st_read_named(rd.r, "labels", lab.data(), FSDP_DT_I32, &rd.err), 0);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t + 1 < 32; t++) EXPECT_EQ(lab[b * 32 + t], in[b * 32 + t + 1]);
}

TEST(StReader, ManyDtypesValues) {
    Reader rd(tiny("dcp_dtypes_expected.safetensors"));
    ASSERT_EQ(rd.rc, 0) << rd.err.msg;
    EXPECT_EQ(st_count(rd.r), 14u);
    auto dt = [&](const char *n) { return rd.find(n) ? rd.find(n)->dtype : FSDP_DT_INVALID; };
    EXPECT_EQ(dt("i64"), FSDP_DT_I64);
    EXPECT_EQ(dt("f64"), FSDP_DT_F64);
    EXPECT_EQ(dt("bf16"), FSDP_DT_BF16);
    EXPECT_EQ(dt("f16"), FSDP_DT_F16);
    EXPECT_EQ(dt("i8"), FSDP_DT_I8);
    EXPECT_EQ(dt("u8"), FSDP_DT_U8);
    EXPECT_EQ(dt("bool"), FSDP_DT_U8);

    int64_t i64[10];
    ASSERT_EQ(st_read_named(rd.r, "i64", i64, FSDP_DT_I64, &rd.err), 0);
    for (int i = 0; i < 10; i++) EXPECT_EQ(i64[i], i - 3);
    float i64f[10];
    ASSERT_EQ(st_read_named(rd.r, "i64", i64f, FSDP_DT_F32, &rd.err), 0);
    for (int i = 0; i < 10; i++) EXPECT_EQ(i64f[i], (float)(i - 3));
    int32_t i32[12];
    ASSERT_EQ(st_read_named(rd.r, "i32", i32, FSDP_DT_I32, &rd.err), 0);
    for (int i = 0; i < 12; i++) EXPECT_EQ(i32[i], i);
    int8_t i8[5];
    ASSERT_EQ(st_read_named(rd.r, "i8", i8, FSDP_DT_I8, &rd.err), 0);
    const int8_t i8w[5] = {-128, -1, 0, 1, 127};
    for (int i = 0; i < 5; i++) EXPECT_EQ(i8[i], i8w[i]);
    uint8_t u8[6];
    ASSERT_EQ(st_read_named(rd.r, "u8", u8, FSDP_DT_U8, &rd.err), 0);
    for (int i = 0; i < 6; i++) EXPECT_EQ(u8[i], 250 + i);
    uint8_t b[3];
    ASSERT_EQ(st_read_named(rd.r, "bool", b, FSDP_DT_BOOL, &rd.err), 0);
    EXPECT_EQ(b[0], 1);
    EXPECT_EQ(b[1], 0);
    EXPECT_EQ(b[2], 1);

    const st_tensor_info *sc = rd.find("scalar");
    ASSERT_NE(sc, nullptr);
    EXPECT_EQ(sc->ndim, 0);
    EXPECT_EQ(sc->nbytes, 4u);
    EXPECT_EQ(st_rows(sc), 1);
    double s = 0;
    ASSERT_EQ(st_read(rd.r, sc, &s, FSDP_DT_F64, &rd.err), 0);
    EXPECT_EQ(s, 42.5);

    float na[2], nc[4];
    ASSERT_EQ(st_read_named(rd.r, "nested.a", na, FSDP_DT_F32, &rd.err), 0);
    ASSERT_EQ(st_read_named(rd.r, "nested.b.c", nc, FSDP_DT_F32, &rd.err), 0);
    EXPECT_EQ(na[0], 1.0f);
    EXPECT_EQ(na[1], 1.0f);
    for (float x : nc) EXPECT_EQ(x, 7.0f);

    // transposed = base.t() [5,6]; sliced = base[1:4, 2:] [3,3] -> sliced[i][j] == transposed[j+2][i+1]
    float tr[30], sl[9];
    ASSERT_EQ(st_read_named(rd.r, "transposed", tr, FSDP_DT_F32, &rd.err), 0);
    ASSERT_EQ(st_read_named(rd.r, "sliced", sl, FSDP_DT_F32, &rd.err), 0);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) EXPECT_EQ(sl[i * 3 + j], tr[(j + 2) * 6 + (i + 1)]);

    // bf16 / f16 widen exactly; narrowing f64 -> bf16 rounds like fsdp_f32_to_bf16
    const st_tensor_info *bt = rd.find("bf16");
    uint16_t raw[16];
    float wide[16];
    ASSERT_EQ(st_read(rd.r, bt, raw, FSDP_DT_INVALID, &rd.err), 0);
    ASSERT_EQ(st_read(rd.r, bt, wide, FSDP_DT_F32, &rd.err), 0);
    for (int i = 0; i < 16; i++) EXPECT_EQ(wide[i], fsdp_bf16_to_f32(raw[i]));
    uint16_t h[5];
    double hd[5];
    ASSERT_EQ(st_read_named(rd.r, "f16", h, FSDP_DT_F16, &rd.err), 0);
    ASSERT_EQ(st_read_named(rd.r, "f16", hd, FSDP_DT_F64, &rd.err), 0);
    for (int i = 0; i < 5; i++) EXPECT_EQ(hd[i], (double)fsdp_f16_to_f32(h[i]));
    double f64[6];
    uint16_t f64b[6];
    ASSERT_EQ(st_read_named(rd.r, "f64", f64, FSDP_DT_F64, &rd.err), 0);
    ASSERT_EQ(st_read_named(rd.r, "f64", f64b, FSDP_DT_BF16, &rd.err), 0);
    for (int i = 0; i < 6; i++) EXPECT_EQ(f64b[i], fsdp_f32_to_bf16((float)f64[i]));
}

TEST(StReader, RowsMatchWholeTensorAndConvert) {
    Reader rd(tiny("model_step5.safetensors"));
    ASSERT_EQ(rd.rc, 0) << rd.err.msg;
    const st_tensor_info *t = rd.find("tok_embeddings.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(st_rows(t), 256);
    EXPECT_EQ(st_row_numel(t), 64);
    std::vector<float> all(256 * 64), part(4 * 64);
    ASSERT_EQ(st_read(rd.r, t, all.data(), FSDP_DT_F32, &rd.err), 0);
    EXPECT_EQ(std::memcmp(all.data(), st_data(rd.r, t), t->nbytes), 0);
    ASSERT_EQ(st_read_rows(rd.r, t, 100, 104, part.data(), FSDP_DT_F32, &rd.err), 0);
    EXPECT_EQ(std::memcmp(part.data(), all.data() + 100 * 64, part.size() * 4), 0);
    std::vector<uint16_t> pb(4 * 64);
    std::vector<double> pd(4 * 64);
    ASSERT_EQ(st_read_rows(rd.r, t, 100, 104, pb.data(), FSDP_DT_BF16, &rd.err), 0);
    ASSERT_EQ(st_read_rows(rd.r, t, 100, 104, pd.data(), FSDP_DT_F64, &rd.err), 0);
    for (size_t i = 0; i < part.size(); i++) {
        EXPECT_EQ(pb[i], fsdp_f32_to_bf16(part[i]));
        EXPECT_EQ(pd[i], (double)part[i]);
    }
    // empty range is fine, out-of-range rows are an error naming the tensor
    EXPECT_EQ(st_read_rows(rd.r, t, 256, 256, nullptr, FSDP_DT_F32, &rd.err), 0);
    EXPECT_NE(st_read_rows(rd.r, t, 250, 257, all.data(), FSDP_DT_F32, &rd.err), 0);
    EXPECT_NE(std::string(rd.err.msg).find("tok_embeddings.weight"), std::string::npos);
    EXPECT_NE(st_read_rows(rd.r, t, 5, 4, all.data(), FSDP_DT_F32, &rd.err), 0);
    EXPECT_NE(st_read_rows(rd.r, t, -1, 4, all.data(), FSDP_DT_F32, &rd.err), 0);
}

TEST(StReader, ShardedCheckpointEqualsSingleFile) {
    Reader one(tiny("model_step5.safetensors"));
    ASSERT_EQ(one.rc, 0) << one.err.msg;
    for (std::string path : {tiny("model.safetensors.index.json"), tiny("")}) {
        Reader sh(path);  // the index itself, and the directory holding it
        ASSERT_EQ(sh.rc, 0) << path << ": " << sh.err.msg;
        ASSERT_EQ(st_count(sh.r), st_count(one.r));
        EXPECT_EQ(st_file_count(sh.r), 2u);
        ASSERT_NE(st_index_path(sh.r), nullptr);
        EXPECT_NE(std::string(st_index_path(sh.r)).find("model.safetensors.index.json"), std::string::npos);
        EXPECT_EQ(st_index_total_size(sh.r), 525568);
        EXPECT_NE(std::string(st_file_path(sh.r, 0)).find("model-00001-of-00002"), std::string::npos);
        EXPECT_NE(std::string(st_file_path(sh.r, 1)).find("model-00002-of-00002"), std::string::npos);
        for (size_t f = 0; f < 2; f++) EXPECT_STREQ(st_metadata_get(sh.r, f, "format"), "pt");
        for (size_t i = 0; i < st_count(one.r); i++) {
            const st_tensor_info *a = st_tensor(one.r, i), *b = sh.find(a->name);
            ASSERT_NE(b, nullptr) << a->name;
            EXPECT_EQ(b->dtype, a->dtype);
            EXPECT_EQ(b->ndim, a->ndim);
            for (int d = 0; d < a->ndim; d++) EXPECT_EQ(b->shape[d], a->shape[d]);
            EXPECT_EQ(bytes_of(sh.r, b), bytes_of(one.r, a)) << a->name;
        }
        EXPECT_EQ(sh.find("layers.1.attention.wq.weight")->file, 1u);
        EXPECT_EQ(sh.find("tok_embeddings.weight")->file, 0u);
    }
}

TEST(StReader, MisalignedDataIsReadThroughABounceBuffer) {
    // An old-style file sorted by name: a 3-byte u8 tensor first puts the f32/f64 data off alignment.
    std::string hdr =
        "{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[3,27]},"
        "\"c\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[27,43]}}";
    float fv[6] = {1.5f, -2.25f, 3.0f, 1e-3f, 65504.0f, -0.0f};
    double dv[2] = {0.1, -7.0};
    std::string data("\x01\x02\x03", 3);
    data.append(reinterpret_cast<const char *>(fv), sizeof fv);
    data.append(reinterpret_cast<const char *>(dv), sizeof dv);
    TmpDir d;
    std::string p = d.file("old.safetensors");
    fsdp_test::write_file(p, make_st(hdr, data));
    Reader rd(p);
    ASSERT_EQ(rd.rc, 0) << rd.err.msg;
    const st_tensor_info *b = rd.find("b"), *c = rd.find("c");
    ASSERT_TRUE(b && c);
    // the map is page aligned, so alignment is decided by the file offset
    EXPECT_EQ(st_is_aligned(rd.r, b), b->offset % 4 == 0);
    EXPECT_FALSE(st_is_aligned(rd.r, b) && st_is_aligned(rd.r, c));
    double bd[6];
    uint16_t bb[6];
    float bf[6];
    ASSERT_EQ(st_read(rd.r, b, bd, FSDP_DT_F64, &rd.err), 0);
    ASSERT_EQ(st_read(rd.r, b, bb, FSDP_DT_BF16, &rd.err), 0);
    ASSERT_EQ(st_read(rd.r, b, bf, FSDP_DT_F32, &rd.err), 0);
    for (int i = 0; i < 6; i++) {
        EXPECT_EQ(bd[i], (double)fv[i]);
        EXPECT_EQ(bb[i], fsdp_f32_to_bf16(fv[i]));
        EXPECT_EQ(std::memcmp(&bf[i], &fv[i], 4), 0);
    }
    float rows[3];
    ASSERT_EQ(st_read_rows(rd.r, b, 1, 2, rows, FSDP_DT_F32, &rd.err), 0);
    EXPECT_EQ(rows[1], 65504.0f);
    float cf[2];
    ASSERT_EQ(st_read(rd.r, c, cf, FSDP_DT_F32, &rd.err), 0);
    EXPECT_EQ(cf[0], 0.1f);
    EXPECT_EQ(cf[1], -7.0f);
    // the conversion error names the tensor
    EXPECT_NE(st_read(rd.r, c, cf, FSDP_DT_C64, &rd.err), 0);
    EXPECT_NE(std::string(rd.err.msg).find("'c'"), std::string::npos);
}

TEST(StReader, LargeTensorParallelConversion) {
    // > 16 chunks triggers the OpenMP path; compare against a serial reference.
    const int64_t rows = 1 << 11, cols = 1 << 10;
    std::vector<uint16_t> v((size_t)(rows * cols));
    for (size_t i = 0; i < v.size(); i++) v[i] = fsdp_f32_to_bf16((float)((int64_t)(i * 2654435761u % 100003) - 50000) / 977.0f);
    TmpDir d;
    std::string p = d.file("big.safetensors");
    int64_t shape[2] = {rows, cols};
    st_entry e = {"w", FSDP_DT_BF16, 2, shape, v.data()};
    fsdp_err err{};
    ASSERT_EQ(st_save(p.c_str(), &e, 1, nullptr, 0, nullptr, nullptr, &err), 0) << err.msg;
    Reader rd(p);
    ASSERT_EQ(rd.rc, 0) << rd.err.msg;
    std::vector<float> f(v.size());
    ASSERT_EQ(st_read(rd.r, rd.find("w"), f.data(), FSDP_DT_F32, &rd.err), 0);
    for (size_t i = 0; i < v.size(); i++) ASSERT_EQ(f[i], fsdp_bf16_to_f32(v[i])) << i;
}

TEST(StReader, DirectoryResolution) {
    TmpDir d;
    std::string src = fsdp_test::read_file(tiny("batch.safetensors"));
    fsdp_test::write_file(d.file("something.safetensors"), src);
    {
        Reader rd(d.path);  // the only .safetensors file
        ASSERT_EQ(rd.rc, 0) << rd.err.msg;
        EXPECT_NE(std::string(st_file_path(rd.r, 0)).find("something.safetensors"), std::string::npos);
    }
    fsdp_test::write_file(d.file("other.safetensors"), src);
    {
        Reader rd(d.path);  // ambiguous
        EXPECT_NE(rd.rc, 0);
        EXPECT_NE(std::string(rd.err.msg).find(d.path), std::string::npos);
    }
    fsdp_test::write_file(d.file("model.safetensors"), src);
    {
        Reader rd(d.path + "/");  // model.safetensors wins
        ASSERT_EQ(rd.rc, 0) << rd.err.msg;
        EXPECT_NE(std::string(st_file_path(rd.r, 0)).find("/model.safetensors"), std::string::npos);
    }
    TmpDir empty;
    Reader rd(empty.path);
    EXPECT_EQ(rd.rc, FSDP_E_IO);
    Reader missing(empty.file("nope.safetensors"));
    EXPECT_EQ(missing.rc, FSDP_E_IO);
    EXPECT_NE(std::string(missing.err.msg).find("nope.safetensors"), std::string::npos);
}

// ------------------------------------------------------------------ header validation errors

TEST(StErrors, TruncatedFiles) {
    std::string good = fsdp_test::read_file(tiny("model_init.safetensors"));
    std::string msg;
    EXPECT_EQ(open_bad(good.substr(0, good.size() - 100), &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
    EXPECT_EQ(open_bad(good.substr(0, 5), &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("too short"), std::string::npos) << msg;
    EXPECT_EQ(open_bad(good.substr(0, 500), &msg), FSDP_E_FORMAT);  // inside the header
    EXPECT_NE(msg.find("runs past the end"), std::string::npos) << msg;
    EXPECT_EQ(open_bad("", &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_bad(good + "xyz", &msg), FSDP_E_FORMAT);  // trailing bytes (polyglot)
    EXPECT_NE(msg.find("trailing"), std::string::npos) << msg;
}

TEST(StErrors, HeaderLengthTooBig) {
    std::string f = make_st("{}", "");
    uint64_t n = 200000000ULL;
    for (int i = 0; i < 8; i++) f[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    std::string msg;
    EXPECT_EQ(open_bad(f, &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("exceeds"), std::string::npos) << msg;
    for (int i = 0; i < 8; i++) f[i] = static_cast<char>(0xff);
    EXPECT_EQ(open_bad(f, &msg), FSDP_E_FORMAT);
}

TEST(StErrors, BadJson) {
    std::string msg;
    EXPECT_EQ(open_bad(make_st("{\"a\": {\"dtype\": ", ""), &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("invalid JSON"), std::string::npos) << msg;
    EXPECT_EQ(open_bad(make_st("[1, 2]", ""), &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_bad(make_st("{}", "") + std::string("\xff", 1), &msg), FSDP_E_FORMAT);
    std::string bad_utf8 = "{\"\xc3\x28\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    EXPECT_EQ(open_bad(make_st(bad_utf8, "a"), &msg), FSDP_E_FORMAT);
    // leading/trailing JSON whitespace is accepted, as serde_json does
    EXPECT_EQ(open_bad(make_st("  \n{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "z"), &msg), 0)
        << msg;
}

TEST(StErrors, OverlapHoleAndStart) {
    std::string msg;
    const char *overlap =
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}";
    EXPECT_EQ(open_bad(make_st(overlap, std::string(12, '\0')), &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'b'"), std::string::npos) << msg;
    const char *hole =
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}";
    EXPECT_EQ(open_bad(make_st(hole, std::string(20, '\0')), &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("hole"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'b'"), std::string::npos) << msg;
    const char *late = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}";
    EXPECT_EQ(open_bad(make_st(late, std::string(12, '\0')), &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("start"), std::string::npos) << msg;
    const char *backwards = "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}";
    EXPECT_EQ(open_bad(make_st(backwards, std::string(8, '\0')), &msg), FSDP_E_FORMAT);
    // empty tensors and scalars are fine, even sharing an offset
    const char *empties =
        "{\"e1\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
        "\"e2\":{\"dtype\":\"I64\",\"shape\":[3,0],\"data_offsets\":[0,0]},"
        "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}";
    EXPECT_EQ(open_bad(make_st(empties, std::string(4, '\0')), &msg), 0) << msg;
}

TEST(StErrors, ShapeSizeDtypeAndTypes) {
    std::string msg;
    auto one = [](const std::string &entry, size_t n) {
        return make_st("{\"t\":" + entry + "}", std::string(n, '\0'));
    };
    EXPECT_EQ(open_bad(one("{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}", 20), &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("needs 24 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'t'"), std::string::npos) << msg;
    EXPECT_EQ(open_bad(one("{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,2]}", 2), &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("unknown dtype 'Q7'"), std::string::npos) << msg;
    EXPECT_EQ(open_bad(one("{\"dtype\":\"F8_E8M0\",\"shape\":[2],\"data_offsets\":[0,2]}", 2), &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("not supported"), std::string::npos) << msg;
    EXPECT_EQ(open_bad(one("{\"dtype\":\"float32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4), &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_bad(one("{\"shape\":[1],\"data_offsets\":[0,4]}", 4), &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("missing \"dtype\""), std::string::npos) << msg;
    EXPECT_EQ(open_bad(one("{\"dtype\":\"F32\",\"data_offsets\":[0,4]}", 4), &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_bad(one("{\"dtype\":\"F32\",\"shape\":[1]}", 4), &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_bad(one("{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}", 4), &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_bad(one("{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}", 4), &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_bad(one("{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}", 4), &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_bad(one("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}", 4), &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_bad(one("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}", 4), &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_bad(one("{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]}", 4), &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_bad(one("[1]", 4), &msg), FSDP_E_FORMAT);
    // shape product overflow
    EXPECT_EQ(open_bad(one("{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}", 8), &msg),
              FSDP_E_FORMAT);
    EXPECT_NE(msg.find("overflow"), std::string::npos) << msg;
    EXPECT_EQ(open_bad(one("{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,8]}", 8), &msg),
              FSDP_E_FORMAT);
    // more dimensions than FSDP_MAX_DIMS
    EXPECT_EQ(open_bad(one("{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}", 1), &msg),
              FSDP_E_FORMAT);
    // unknown extra fields are ignored like serde does
    EXPECT_EQ(open_bad(one("{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"extra\":1}", 1), &msg), 0) << msg;
}

TEST(StErrors, MetadataAndDuplicates) {
    std::string msg;
    const char *t = "\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}";
    EXPECT_EQ(open_bad(make_st(std::string("{\"__metadata__\":{\"a\":1},") + t + "}", "x"), &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("__metadata__"), std::string::npos) << msg;
    EXPECT_EQ(open_bad(make_st(std::string("{\"__metadata__\":{\"a\":{\"b\":\"c\"}},") + t + "}", "x"), &msg),
              FSDP_E_FORMAT);
    EXPECT_EQ(open_bad(make_st(std::string("{\"__metadata__\":[\"a\"],") + t + "}", "x"), &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_bad(make_st(std::string("{\"__metadata__\":{\"a\":\"b\",\"c\":\"d\"},") + t + "}", "x"), &msg), 0);
    const char *dup =
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
        "\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}";
    EXPECT_EQ(open_bad(make_st(dup, "xy"), &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("duplicate"), std::string::npos) << msg;
}

// ------------------------------------------------------------------ index errors

namespace {
// A copy of the sharded fixture in a temp dir, with the index text replaced.
int open_index(const std::string &index, std::string *msg, bool copy_shard2 = true) {
    TmpDir d;
    fsdp_test::write_file(d.file("model-00001-of-00002.safetensors"),
                          fsdp_test::read_file(tiny("model-00001-of-00002.safetensors")));
    if (copy_shard2)
        fsdp_test::write_file(d.file("model-00002-of-00002.safetensors"),
                              fsdp_test::read_file(tiny("model-00002-of-00002.safetensors")));
    fsdp_test::write_file(d.file("model.safetensors.index.json"), index);
    st_reader *r = nullptr;
    fsdp_err err{};
    int rc = st_open(&r, d.path.c_str(), &err);
    st_close(r);
    *msg = err.msg;
    return rc;
}
}  // namespace

TEST(StErrors, IndexMissingShardAndMismatches) {
    std::string index = fsdp_test::read_file(tiny("model.safetensors.index.json")), msg;
    EXPECT_EQ(open_index(index, &msg), 0) << msg;
    EXPECT_EQ(open_index(index, &msg, false), FSDP_E_IO);
    EXPECT_NE(msg.find("model-00002-of-00002.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing"), std::string::npos) << msg;

    // a tensor mapped to the wrong shard
    std::string wrong = index;
    size_t p = wrong.find("\"norm.weight\": \"model-00002");
    ASSERT_NE(p, std::string::npos);
    wrong.replace(p + std::strlen("\"norm.weight\": \"model-0000"), 1, "1");
    EXPECT_EQ(open_index(wrong, &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("norm.weight"), std::string::npos) << msg;

    // a tensor the shards do not hold, and a shard tensor the index does not list
    std::string extra = index;
    extra.replace(extra.find("\"weight_map\": {") + 15, 0, "\"ghost\": \"model-00001-of-00002.safetensors\",");
    EXPECT_EQ(open_index(extra, &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("ghost"), std::string::npos) << msg;
    std::string fewer = index;
    size_t q = fewer.find("    \"norm.weight\"");
    fewer.erase(q, fewer.find('\n', q) + 1 - q);
    EXPECT_EQ(open_index(fewer, &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("norm.weight"), std::string::npos) << msg;

    EXPECT_EQ(open_index("{\"weight_map\": 3}", &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_index("{\"metadata\": {}}", &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("weight_map"), std::string::npos) << msg;
    EXPECT_EQ(open_index("{\"weight_map\": {\"a\": 1}}", &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_index("{\"weight_map\": {\"a\": \"../x.safetensors\"}}", &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_index("{\"weight_map\": {\"a\": \"/etc/passwd\"}}", &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_index("{\"metadata\": {\"total_size\": \"big\"}, \"weight_map\": {}}", &msg), FSDP_E_FORMAT);
    EXPECT_EQ(open_index("{\"weight_map\": {", &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("invalid JSON"), std::string::npos) << msg;
    EXPECT_EQ(open_index("{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}", &msg), FSDP_E_FORMAT);
    EXPECT_NE(msg.find("duplicate"), std::string::npos) << msg;
}

TEST(StErrors, DuplicateAcrossShards) {
    // two shards that both hold "t"; the index names each once (the second under another key)
    TmpDir d;
    const char *h = "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    fsdp_test::write_file(d.file("a.safetensors"), make_st(h, "x"));
    fsdp_test::write_file(d.file("b.safetensors"), make_st(h, "y"));
    fsdp_test::write_file(d.file("model.safetensors.index.json"),
                          "{\"weight_map\": {\"t\": \"a.safetensors\", \"u\": \"b.safetensors\"}}");
    Reader rd(d.path);
    EXPECT_EQ(rd.rc, FSDP_E_FORMAT);
    EXPECT_NE(std::string(rd.err.msg).find("duplicate tensor 't'"), std::string::npos) << rd.err.msg;
    EXPECT_NE(std::string(rd.err.msg).find("b.safetensors"), std::string::npos) << rd.err.msg;
}

// ------------------------------------------------------------------ writer

namespace {
// Copies every tensor of a reader into a new file (with the given metadata), via st_save.
int rewrite(const st_reader *src, const std::string &out, std::vector<const char *> meta, fsdp_err *err) {
    std::vector<st_entry> es;
    for (size_t i = 0; i < st_count(src); i++) {
        const st_tensor_info *t = st_tensor(src, i);
        es.push_back({t->name, t->dtype, t->ndim, t->shape, st_data(src, t)});
    }
    return st_save(out.c_str(), es.data(), es.size(), meta.data(), meta.size() / 2, nullptr, nullptr, err);
}
}  // namespace

TEST(StWriter, ByteIdenticalToReferenceWriter) {
    TmpDir d;
    struct {
        const char *fixture;
        std::vector<const char *> meta;
    } cases[] = {{"model_init.safetensors", {"format", "pt"}},
                 {"model_step5.safetensors", {}},
                 {"dcp_dtypes_expected.safetensors", {}},  // dtype ordering: I64 F64 F32 I32 BF16 F16 I8 U8
                 {"batch.safetensors", {}},
                 {"model-00002-of-00002.safetensors", {"format", "pt"}}};
    for (auto &c : cases) {
        Reader src(tiny(c.fixture));
        ASSERT_EQ(src.rc, 0) << src.err.msg;
        std::string out = d.file(c.fixture);
        fsdp_err err{};
        ASSERT_EQ(rewrite(src.r, out, c.meta, &err), 0) << err.msg;
        std::string a = fsdp_test::read_file(out), b = fsdp_test::read_file(tiny(c.fixture));
        EXPECT_EQ(a.size(), b.size()) << c.fixture;
        EXPECT_TRUE(a == b) << c.fixture;
        EXPECT_FALSE(fsdp_test::exists(out + ".tmp"));
    }
}

TEST(StWriter, RoundTripStreamingAnyOrderInPieces) {
    TmpDir d;
    std::string p = d.file("rt.safetensors");
    st_writer *w = nullptr;
    fsdp_err err{};
    ASSERT_EQ(st_writer_new(&w, p.c_str(), &err), 0);
    ASSERT_EQ(st_writer_set_metadata(w, "format", "pt", &err), 0);
    ASSERT_EQ(st_writer_set_metadata(w, "note", "a \"quoted\"\tvalue \xc3\xa9", &err), 0);
    EXPECT_NE(st_writer_set_metadata(w, "format", "again", &err), 0);
    int64_t s_a[2] = {3, 5}, s_b[1] = {7}, s_e[2] = {0, 4};
    size_t ia, ib, ic, ie;
    ASSERT_EQ(st_writer_declare(w, "b.bytes", FSDP_DT_U8, 1, s_b, &ib, &err), 0);
    ASSERT_EQ(st_writer_declare(w, "a.f64", FSDP_DT_F64, 2, s_a, &ia, &err), 0);
    ASSERT_EQ(st_writer_declare(w, "c.scalar", FSDP_DT_BF16, 0, nullptr, &ic, &err), 0);
    ASSERT_EQ(st_writer_declare(w, "e.empty", FSDP_DT_F32, 2, s_e, &ie, &err), 0);
    EXPECT_NE(st_writer_declare(w, "__metadata__", FSDP_DT_F32, 1, s_b, nullptr, &err), 0);
    EXPECT_NE(st_writer_declare(w, "cplx", FSDP_DT_C128, 1, s_b, nullptr, &err), 0);
    EXPECT_EQ(ia, 1u);
    ASSERT_EQ(st_writer_begin(w, &err), 0) << err.msg;
    EXPECT_TRUE(fsdp_test::exists(p + ".tmp"));
    EXPECT_FALSE(fsdp_test::exists(p));
    EXPECT_EQ(st_writer_count(w), 4u);
    EXPECT_EQ(st_writer_file_order(w, 0), ia);  // F64 first
    EXPECT_EQ(st_writer_data_size(w), 15 * 8 + 7 + 2u);
    EXPECT_NE(st_writer_declare(w, "late", FSDP_DT_F32, 1, s_b, nullptr, &err), 0);
    double a[15];
    for (int i = 0; i < 15; i++) a[i] = i * 0.5 - 3;
    uint8_t b[7] = {9, 8, 7, 6, 5, 4, 3};
    uint16_t c = fsdp_f32_to_bf16(2.5f);
    // scalar first, then b in 3 pieces, then a in 2 pieces: not the file order
    ASSERT_EQ(st_writer_write(w, ic, &c, 2, &err), 0);
    ASSERT_EQ(st_writer_write(w, ib, b, 2, &err), 0);
    ASSERT_EQ(st_writer_write(w, ib, b + 2, 0, &err), 0);
    ASSERT_EQ(st_writer_write(w, ib, b + 2, 5, &err), 0);
    EXPECT_NE(st_writer_write(w, ib, b, 1, &err), 0);  // too many bytes
    EXPECT_NE(std::string(err.msg).find("b.bytes"), std::string::npos);
    ASSERT_EQ(st_writer_write(w, ia, a, 40, &err), 0);
    EXPECT_FALSE(st_writer_complete(w, ia));
    EXPECT_NE(st_writer_finish(w, &err), 0);  // a incomplete
    EXPECT_NE(std::string(err.msg).find("a.f64"), std::string::npos) << err.msg;
    ASSERT_EQ(st_writer_write(w, ia, reinterpret_cast<char *>(a) + 40, 80, &err), 0);
    EXPECT_NE(st_writer_write(w, 99, a, 1, &err), 0);
    ASSERT_EQ(st_writer_finish(w, &err), 0) << err.msg;
    st_writer_free(w);
    EXPECT_FALSE(fsdp_test::exists(p + ".tmp"));
    std::string bytes = fsdp_test::read_file(p);
    EXPECT_EQ((bytes.size() - 15 * 8 - 9) % 8, 0u);  // data buffer starts 8-aligned

    Reader rd(p);
    ASSERT_EQ(rd.rc, 0) << rd.err.msg;
    EXPECT_STREQ(st_metadata_get(rd.r, 0, "note"), "a \"quoted\"\tvalue \xc3\xa9");
    const char *k, *v;
    ASSERT_EQ(st_metadata_at(rd.r, 0, 0, &k, &v), 0);
    EXPECT_STREQ(k, "format");  // call order kept
    EXPECT_EQ(std::memcmp(st_data(rd.r, rd.find("a.f64")), a, sizeof a), 0);
    EXPECT_EQ(std::memcmp(st_data(rd.r, rd.find("b.bytes")), b, sizeof b), 0);
    EXPECT_EQ(std::memcmp(st_data(rd.r, rd.find("c.scalar")), &c, 2), 0);
    EXPECT_EQ(rd.find("c.scalar")->ndim, 0);
    EXPECT_EQ(rd.find("e.empty")->nbytes, 0u);
    EXPECT_EQ(rd.find("e.empty")->shape[1], 4);
    EXPECT_EQ(st_tensor(rd.r, 0), rd.find("a.f64"));
}

TEST(StWriter, AbandonedWriterLeavesNoFiles) {
    TmpDir d;
    std::string p = d.file("x.safetensors");
    st_writer *w = nullptr;
    fsdp_err err{};
    int64_t s[1] = {4};
    ASSERT_EQ(st_writer_new(&w, p.c_str(), &err), 0);
    ASSERT_EQ(st_writer_declare(w, "t", FSDP_DT_F32, 1, s, nullptr, &err), 0);
    ASSERT_EQ(st_writer_begin(w, &err), 0);
    EXPECT_TRUE(fsdp_test::exists(p + ".tmp"));
    st_writer_free(w);
    EXPECT_FALSE(fsdp_test::exists(p + ".tmp"));
    EXPECT_FALSE(fsdp_test::exists(p));
    // duplicates are reported at begin
    ASSERT_EQ(st_writer_new(&w, p.c_str(), &err), 0);
    ASSERT_EQ(st_writer_declare(w, "t", FSDP_DT_F32, 1, s, nullptr, &err), 0);
    ASSERT_EQ(st_writer_declare(w, "t", FSDP_DT_I8, 1, s, nullptr, &err), 0);
    EXPECT_NE(st_writer_begin(w, &err), 0);
    EXPECT_NE(std::string(err.msg).find("declared twice"), std::string::npos);
    st_writer_free(w);
    EXPECT_FALSE(fsdp_test::exists(p + ".tmp"));
    // an unwritable destination is an I/O error naming the file
    ASSERT_EQ(st_writer_new(&w, (d.path + "/no/such/dir/x.safetensors").c_str(), &err), 0);
    EXPECT_EQ(st_writer_begin(w, &err), FSDP_E_IO);
    EXPECT_NE(std::string(err.msg).find("no/such/dir"), std::string::npos);
    st_writer_free(w);
}

TEST(StWriter, NameEscapingLikeSerdeJson) {
    TmpDir d;
    std::string p = d.file("esc.safetensors");
    int64_t s[1] = {1};
    uint8_t one = 7;
    // control characters are escaped as \u00xx with lowercase hex (serde_json), quotes and
    // backslashes as \" and \\, non-ASCII UTF-8 and '/' are written as they are
    std::string name = std::string("ctl\x1f\x0b/\"q\"\\uABCD ") + "\xc3\xa9";
    st_entry e = {name.c_str(), FSDP_DT_U8, 1, s, &one};
    fsdp_err err{};
    ASSERT_EQ(st_save(p.c_str(), &e, 1, nullptr, 0, nullptr, nullptr, &err), 0) << err.msg;
    std::string bytes = fsdp_test::read_file(p);
    EXPECT_NE(bytes.find("\"ctl\\u001f\\u000b/\\\"q\\\"\\\\uABCD \xc3\xa9\""), std::string::npos) << bytes;
    Reader rd(p);
    ASSERT_EQ(rd.rc, 0) << rd.err.msg;
    ASSERT_NE(rd.find(name.c_str()), nullptr);
    // names that are not UTF-8 cannot be written
    std::string bad = "bad\xff";
    st_entry b = {bad.c_str(), FSDP_DT_U8, 1, s, &one};
    EXPECT_EQ(st_save(p.c_str(), &b, 1, nullptr, 0, nullptr, nullptr, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("UTF-8"), std::string::npos);
}

TEST(StWriter, FillCallbackWritesInFileOrder) {
    Reader src(tiny("model_init.safetensors"));
    ASSERT_EQ(src.rc, 0);
    std::vector<st_entry> es;
    for (size_t i = 0; i < st_count(src.r); i++) {
        const st_tensor_info *t = st_tensor(src.r, i);
        es.push_back({t->name, t->dtype, t->ndim, t->shape, nullptr});
    }
    struct Ctx {
        const st_reader *r;
        std::vector<st_entry> *es;
        std::vector<size_t> seen;
    } ctx{src.r, &es, {}};
    auto fill = [](void *user, st_writer *w, size_t idx, fsdp_err *err) -> int {
        Ctx *c = static_cast<Ctx *>(user);
        c->seen.push_back(idx);
        const st_tensor_info *t = st_find(c->r, (*c->es)[idx].name);
        const char *p = static_cast<const char *>(st_data(c->r, t));
        for (uint64_t off = 0; off < t->nbytes; off += 1000) {  // in pieces of 1000 bytes
            size_t n = (size_t)std::min<uint64_t>(1000, t->nbytes - off);
            if (int rc = st_writer_write(w, idx, p + off, n, err)) return rc;
        }
        return 0;
    };
    TmpDir d;
    std::string out = d.file("model_init.safetensors");
    const char *meta[] = {"format", "pt"};
    fsdp_err err{};
    ASSERT_EQ(st_save(out.c_str(), es.data(), es.size(), meta, 1, fill, &ctx, &err), 0) << err.msg;
    EXPECT_EQ(ctx.seen.size(), es.size());
    EXPECT_TRUE(fsdp_test::read_file(out) == fsdp_test::read_file(tiny("model_init.safetensors")));
    // a callback that writes nothing is caught
    auto lazy = [](void *, st_writer *, size_t, fsdp_err *) -> int { return 0; };
    EXPECT_NE(st_save(out.c_str(), es.data(), es.size(), meta, 1, lazy, nullptr, &err), 0);
    EXPECT_NE(std::string(err.msg).find("incomplete"), std::string::npos);
}

// ------------------------------------------------------------------ sharded writer

TEST(StShards, ReproducesTheReferenceShards) {
    // Declaring in the index's order with a 262912-byte limit gives the fixture's split exactly.
    Reader src(tiny("model.safetensors.index.json"));
    ASSERT_EQ(src.rc, 0) << src.err.msg;
    json_error_t je;
    json_t *idx = json_load_file(tiny("model.safetensors.index.json").c_str(), 0, &je);
    ASSERT_NE(idx, nullptr);
    TmpDir d;
    std::string out = d.file("hf/out");  // created on demand
    st_shards *s = nullptr;
    fsdp_err err{};
    ASSERT_EQ(st_shards_new(&s, out.c_str(), nullptr, 262912, &err), 0);
    ASSERT_EQ(st_shards_set_metadata(s, "format", "pt", &err), 0);
    std::vector<const st_tensor_info *> order;
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(idx, "weight_map"), k, v) {
        const st_tensor_info *t = src.find(k);
        ASSERT_NE(t, nullptr);
        ASSERT_EQ(st_shards_declare(s, t->name, t->dtype, t->ndim, t->shape, nullptr, &err), 0);
        order.push_back(t);
    }
    json_decref(idx);
    ASSERT_EQ(st_shards_begin(s, &err), 0) << err.msg;
    ASSERT_EQ(st_shards_count(s), 2u);
    EXPECT_STREQ(st_shards_file(s, 0), "model-00001-of-00002.safetensors");
    EXPECT_STREQ(st_shards_file(s, 1), "model-00002-of-00002.safetensors");
    // write in reverse order: shard 2 completes (and is renamed) first
    for (size_t i = order.size(); i-- > 0;)
        ASSERT_EQ(st_shards_write(s, i, st_data(src.r, order[i]), order[i]->nbytes, &err), 0) << err.msg;
    EXPECT_TRUE(fsdp_test::exists(out + "/model-00002-of-00002.safetensors"));
    EXPECT_FALSE(fsdp_test::exists(out + "/model.safetensors.index.json"));  // index last
    ASSERT_EQ(st_shards_finish(s, &err), 0) << err.msg;
    st_shards_free(s);
    for (const char *f : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"})
        EXPECT_TRUE(fsdp_test::read_file(out + "/" + f) == fsdp_test::read_file(tiny(f))) << f;
    // the index has the same content (we sort keys like transformers does)
    json_t *a = json_load_file((out + "/model.safetensors.index.json").c_str(), 0, &je);
    json_t *b = json_load_file(tiny("model.safetensors.index.json").c_str(), 0, &je);
    ASSERT_TRUE(a && b);
    EXPECT_TRUE(json_equal(a, b));
    json_decref(a);
    json_decref(b);
    Reader back(out);
    ASSERT_EQ(back.rc, 0) << back.err.msg;
    EXPECT_EQ(st_count(back.r), 21u);
}

TEST(StShards, RoundTripSmallShards) {
    Reader src(tiny("adam_step5.safetensors"));
    ASSERT_EQ(src.rc, 0);
    TmpDir d;
    st_shards *s = nullptr;
    fsdp_err err{};
    const uint64_t max = 100000;
    ASSERT_EQ(st_shards_new(&s, d.path.c_str(), "opt", max, &err), 0);
    uint64_t total = 0;
    for (size_t i = 0; i < st_count(src.r); i++) {
        const st_tensor_info *t = st_tensor(src.r, i);
        ASSERT_EQ(st_shards_declare(s, t->name, t->dtype, t->ndim, t->shape, nullptr, &err), 0);
        total += t->nbytes;
    }
    int64_t s1[1] = {1};
    ASSERT_EQ(st_shards_declare(s, "layers.0.ffn_norm.weight.exp_avg", FSDP_DT_F32, 1, s1, nullptr, &err), 0);
    EXPECT_NE(st_shards_begin(s, &err), 0);  // duplicate name
    st_shards_free(s);

    ASSERT_EQ(st_shards_new(&s, d.path.c_str(), "opt", max, &err), 0);
    for (size_t i = 0; i < st_count(src.r); i++) {
        const st_tensor_info *t = st_tensor(src.r, i);
        ASSERT_EQ(st_shards_declare(s, t->name, t->dtype, t->ndim, t->shape, nullptr, &err), 0);
    }
    ASSERT_EQ(st_shards_begin(s, &err), 0) << err.msg;
    size_t ns = st_shards_count(s);
    EXPECT_GT(ns, 5u);
    // every shard respects the limit unless it holds a single larger tensor
    std::vector<uint64_t> size(ns, 0);
    std::vector<int> count(ns, 0);
    for (size_t i = 0; i < st_count(src.r); i++) {
        size[st_shards_of(s, i)] += st_tensor(src.r, i)->nbytes;
        count[st_shards_of(s, i)]++;
        if (i) { EXPECT_GE(st_shards_of(s, i), st_shards_of(s, i - 1)); }
    }
    for (size_t k = 0; k < ns; k++) EXPECT_TRUE(size[k] <= max || count[k] == 1) << k;
    EXPECT_NE(st_shards_finish(s, &err), 0);  // nothing written yet
    st_shards_free(s);

    ASSERT_EQ(st_shards_new(&s, d.path.c_str(), "opt", max, &err), 0);
    for (size_t i = 0; i < st_count(src.r); i++) {
        const st_tensor_info *t = st_tensor(src.r, i);
        ASSERT_EQ(st_shards_declare(s, t->name, t->dtype, t->ndim, t->shape, nullptr, &err), 0);
    }
    ASSERT_EQ(st_shards_begin(s, &err), 0);
    for (size_t i = 0; i < st_count(src.r); i++) {
        const st_tensor_info *t = st_tensor(src.r, i);
        const char *p = static_cast<const char *>(st_data(src.r, t));
        size_t half = (size_t)t->nbytes / 2;
        ASSERT_EQ(st_shards_write(s, i, p, half, &err), 0);
        ASSERT_EQ(st_shards_write(s, i, p + half, (size_t)t->nbytes - half, &err), 0);
    }
    ASSERT_EQ(st_shards_finish(s, &err), 0) << err.msg;
    std::string name5 = st_shards_file(s, 0);
    st_shards_free(s);
    EXPECT_NE(name5.find("opt-00001-of-"), std::string::npos);

    Reader back(d.file("opt.safetensors.index.json"));
    ASSERT_EQ(back.rc, 0) << back.err.msg;
    EXPECT_EQ(st_file_count(back.r), ns);
    EXPECT_EQ(st_index_total_size(back.r), (int64_t)total);
    ASSERT_EQ(st_count(back.r), st_count(src.r));
    for (size_t i = 0; i < st_count(src.r); i++) {
        const st_tensor_info *a = st_tensor(src.r, i), *b = back.find(a->name);
        ASSERT_NE(b, nullptr);
        EXPECT_EQ(bytes_of(back.r, b), bytes_of(src.r, a)) << a->name;
    }
}

TEST(StShards, UnlimitedSizeAndEmptyTensorsGiveOneShard) {
    TmpDir d;
    st_shards *s = nullptr;
    fsdp_err err{};
    ASSERT_EQ(st_shards_new(&s, d.path.c_str(), nullptr, 0, &err), 0);
    int64_t z[2] = {0, 3}, one[1] = {2};
    ASSERT_EQ(st_shards_declare(s, "empty", FSDP_DT_F32, 2, z, nullptr, &err), 0);
    ASSERT_EQ(st_shards_declare(s, "two", FSDP_DT_I16, 1, one, nullptr, &err), 0);
    ASSERT_EQ(st_shards_begin(s, &err), 0);
    EXPECT_EQ(st_shards_count(s), 1u);
    int16_t v[2] = {-5, 5};
    ASSERT_EQ(st_shards_write(s, 1, v, 4, &err), 0);  // completes (and finishes) the shard
    EXPECT_TRUE(fsdp_test::exists(d.file("model-00001-of-00001.safetensors")));
    ASSERT_EQ(st_shards_write(s, 0, nullptr, 0, &err), 0) << err.msg;  // the empty tensor, afterwards
    EXPECT_NE(st_shards_write(s, 1, v, 1, &err), 0);
    EXPECT_NE(st_shards_write(s, 2, v, 1, &err), 0);
    ASSERT_EQ(st_shards_finish(s, &err), 0) << err.msg;
    st_shards_free(s);
    Reader back(d.path);
    ASSERT_EQ(back.rc, 0) << back.err.msg;
    EXPECT_EQ(st_count(back.r), 2u);
    int16_t r[2];
    ASSERT_EQ(st_read_named(back.r, "two", r, FSDP_DT_I16, &back.err), 0);
    EXPECT_EQ(r[0], -5);
    EXPECT_EQ(r[1], 5);
}

TEST(StErrors, CorruptedBytesGiveErrorsNotCrashes) {
    // Deterministic byte flips over the length field and header of a real file: every open either
    // succeeds (a harmless flip, e.g. inside padding) or fails with a message naming the file.
    std::string good = fsdp_test::read_file(tiny("batch.safetensors"));
    ASSERT_FALSE(good.empty());
    TmpDir d;
    std::string p = d.file("fuzz.safetensors");
    uint32_t x = 12345;
    int failures = 0;
    for (int it = 0; it < 400; it++) {
        std::string f = good;
        for (int k = 0; k < 1 + it % 3; k++) {
            x = x * 1664525u + 1013904223u;
            size_t pos = (x >> 8) % 144;  // 8-byte length + 136-byte header
            f[pos] = static_cast<char>(f[pos] ^ (1u << ((x >> 4) % 8)));
        }
        fsdp_test::write_file(p, f);
        st_reader *r = nullptr;
        fsdp_err err{};
        int rc = st_open(&r, p.c_str(), &err);
        if (rc) {
            failures++;
            EXPECT_EQ(r, nullptr);
            EXPECT_NE(std::string(err.msg).find("fuzz.safetensors"), std::string::npos) << err.msg;
        } else {
            for (size_t i = 0; i < st_count(r); i++) {  // whatever it holds must be readable
                const st_tensor_info *t = st_tensor(r, i);
                std::vector<double> buf((size_t)(t->nbytes / fsdp_dtype_size(t->dtype)) + 1);
                fsdp_err e2{};
                int rc2 = st_read(r, t, buf.data(), FSDP_DT_F64, &e2);
                EXPECT_TRUE(rc2 == 0 || std::string(e2.msg).find(t->name) != std::string::npos);
            }
        }
        st_close(r);
    }
    EXPECT_GT(failures, 300);
}
