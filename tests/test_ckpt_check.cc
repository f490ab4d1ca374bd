// `ckpt inspect` checks the data files' headers and sizes (ckpt_check) without reading the tensors'
// bytes: a broken record exits 1 naming the file, the record and the tensor; `--verify` adds the CRC.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "test_util.h"

extern "C" {
#include "ckpt/dcp.h"
#include "ckpt/reader.h"
}

using namespace fsdp_test;

namespace {

std::string everyday(const std::string &name) { return fixtures_dir() + "/torch-2.11/everyday/" + name; }

bool has(const std::string &s, const std::string &what) { return s.find(what) != std::string::npos; }

uint32_t le32(const std::string &z, size_t at) {
    uint32_t x = 0;
    for (int i = 3; i >= 0; i--) x = x << 8 | (unsigned char)z[at + i];
    return x;
}

void put16(std::string &z, size_t at, unsigned v) {
    z[at] = (char)(v & 0xff);
    z[at + 1] = (char)(v >> 8 & 0xff);
}

void put32(std::string &z, size_t at, uint32_t v) {
    for (int i = 0; i < 4; i++) z[at + i] = (char)(v >> (8 * i) & 0xff);
}

// Offset of the zip header with signature sig ("PK\3\4" local: name length at 26, name at 30;
// "PK\1\2" central: at 28 and 46) whose record name ends with suffix, in [from, to).
size_t find_header(const std::string &z, const char *sig, size_t from, size_t to, const std::string &suffix) {
    bool local = sig[2] == 3;
    size_t nl_at = local ? 26 : 28, name_at = local ? 30 : 46;
    for (size_t at = z.find(sig, from, 4); at < to; at = z.find(sig, at + 4, 4)) {
        size_t nl = (unsigned char)z[at + nl_at] | (size_t)(unsigned char)z[at + nl_at + 1] << 8;
        std::string name = z.substr(at + name_at, nl);
        if (name.size() >= suffix.size() && !name.compare(name.size() - suffix.size(), suffix.size(), suffix))
            return at;
    }
    ADD_FAILURE() << "no record " << suffix << " in [" << from << ", " << to << ")";
    return from;
}

// A tensor record of a DCP data file: the key and its archive's bytes.
struct Piece {
    std::string fqn;
    size_t off, len;
};

// The single-chunk tensors stored in rel of the DCP at dir, in file order.
std::vector<Piece> pieces_of(const std::string &dir, const std::string &rel) {
    std::vector<Piece> v;
    dcp_ckpt *c;
    fsdp_err err;
    if (dcp_open(dir.c_str(), &c, &err)) {
        ADD_FAILURE() << err.msg;
        return v;
    }
    for (size_t i = 0; i < c->n; i++) {
        const dcp_item *x = &c->items[i];
        if (x->is_tensor && x->n_chunks == 1 && rel == x->chunks[0].where.relative_path)
            v.push_back({x->fqn, (size_t)x->chunks[0].where.offset, (size_t)x->chunks[0].where.length});
    }
    dcp_close(c);
    std::sort(v.begin(), v.end(), [](const Piece &a, const Piece &b) { return a.off < b.off; });
    return v;
}

struct Copy {
    std::string t = make_tmpdir("ckpt-check"), dir = t + "/d";
    explicit Copy(const std::string &src) {
        EXPECT_EQ(system(("cp -r '" + src + "' '" + dir + "' && chmod -R u+w '" + dir + "'").c_str()), 0);
    }
    ~Copy() { rm_rf(t); }
};

int ckpt(const std::string &args, std::string *out) { return run_cmd(fsdp_run_bin() + " ckpt " + args, out); }

}  // namespace

TEST(CkptCheck, FixturesPassAndSayWhatWasChecked) {
    std::vector<std::string> paths;
    for (const char *d : {"dcp_seed_ws1", "dcp_model_ws2", "dcp_full_ws3", "dcp_dtypes", "model_step5.pt",
                          "model_step5.safetensors"})
        paths.push_back(tiny(d));
    for (const char *d : {"dcp_tutorial_layout", "dcp_safetensors_serialization", "dcp_tensor_step_and_bytes",
                          "train_ckpt.pt", "containers.pt"})
        paths.push_back(everyday(d));
    std::string out;
    for (const std::string &p : paths) {
        ASSERT_TRUE(exists(p)) << "missing fixture " << p;
        EXPECT_EQ(ckpt("inspect " + p, &out), 0) << p << ": " << out;
        EXPECT_TRUE(has(out, "checked: 1 ") || has(out, "checked: 2 ") || has(out, "checked: 3 ")) << p << ": " << out;
        EXPECT_FALSE(has(out, "error")) << p << ": " << out;
    }
    EXPECT_EQ(ckpt("inspect " + tiny("dcp_full_ws3"), &out), 0);
    EXPECT_TRUE(has(out, "checked: 3 data files, 1980 records (headers and sizes; not the bytes: `--verify` also "
                         "checks the CRC-32 of every byte)"))
        << out;
    EXPECT_EQ(ckpt("inspect --verify " + tiny("dcp_full_ws3"), &out), 0);
    EXPECT_TRUE(has(out, "checked: 3 data files, 1980 records (headers and sizes)\nverified: the CRC-32")) << out;
    EXPECT_EQ(ckpt("inspect --json " + everyday("dcp_safetensors_serialization"), &out), 0) << out;
    EXPECT_TRUE(has(out, "\"checked\": {\n    \"files\": 1,\n    \"records\": 6,\n    \"crc\": false\n  }")) << out;
    EXPECT_EQ(ckpt("inspect " + tiny("model_step5.safetensors"), &out), 0);
    EXPECT_TRUE(has(out, "checked: 1 file, 21 tensors")) << out;
}

TEST(CkptCheck, BrokenLocalHeaderNamesFileRecordAndTensor) {
    ASSERT_TRUE(exists(tiny("dcp_seed_ws1"))) << "missing fixture " << tiny("dcp_seed_ws1");
    Copy c(tiny("dcp_seed_ws1"));
    std::string f = c.dir + "/__0_0.distcp", z = read_file(f), out;
    std::vector<Piece> v = pieces_of(c.dir, "__0_0.distcp");
    ASSERT_GE(v.size(), 3u);
    const Piece &p = v[2];
    size_t h = find_header(z, "PK\3\4", p.off, p.off + p.len, "/data/0");
    z[h + 30 + 2] ^= 0x20; // the record's name in its local header
    write_file(f, z);
    EXPECT_EQ(ckpt("inspect " + c.dir, &out), 1) << out; // before: 0, the listing of every key
    EXPECT_TRUE(has(out, "tensor " + p.fqn + ": " + f + "@" + std::to_string(p.off) + ": zip record ")) << out;
    EXPECT_TRUE(has(out, "/data/0: the local header names another record")) << out;
    EXPECT_TRUE(has(out, c.dir + ": 1 problem in its data files (1 file, 147 records checked)")) << out;
    EXPECT_FALSE(has(out, "total tensor bytes")) << out;
    EXPECT_EQ(ckpt("inspect --verify " + c.dir, &out), 1) << out;
    EXPECT_EQ(ckpt("inspect --json " + c.dir, &out), 1) << out;
}

TEST(CkptCheck, CompressedAndShortRecords) {
    ASSERT_TRUE(exists(tiny("dcp_seed_ws1"))) << "missing fixture " << tiny("dcp_seed_ws1");
    Copy c(tiny("dcp_seed_ws1"));
    std::string f = c.dir + "/__0_0.distcp", z = read_file(f), out;
    std::vector<Piece> v = pieces_of(c.dir, "__0_0.distcp");
    ASSERT_GE(v.size(), 2u);
    // deflate (8) in both headers: they agree, and the open accepts it; a read does not
    size_t lh = find_header(z, "PK\3\4", v[0].off, v[0].off + v[0].len, "/data/0");
    size_t ch = find_header(z, "PK\1\2", v[0].off, v[0].off + v[0].len, "/data/0");
    put16(z, lh + 8, 8);
    put16(z, ch + 10, 8);
    // the central directory gives the data record 4 bytes less than it holds
    size_t ch1 = find_header(z, "PK\1\2", v[1].off, v[1].off + v[1].len, "/data/0");
    put32(z, ch1 + 20, le32(z, ch1 + 20) - 4);
    put32(z, ch1 + 24, le32(z, ch1 + 24) - 4);
    write_file(f, z);
    EXPECT_EQ(ckpt("inspect " + c.dir, &out), 1) << out;
    EXPECT_TRUE(has(out, "tensor " + v[0].fqn + ": " + f + "@" + std::to_string(v[0].off) + ": zip record ")) << out;
    EXPECT_TRUE(has(out, "/data/0 is compressed (method 8)")) << out;
    EXPECT_TRUE(has(out, "tensor " + v[1].fqn + ": " + f + "@" + std::to_string(v[1].off) + ": zip record ")) << out;
    EXPECT_TRUE(has(out, "2 problems in its data files")) << out;
    // what convert would have tripped on
    EXPECT_EQ(ckpt("convert " + c.dir + " " + c.t + "/o.safetensors", &out), 1) << out;
}

TEST(CkptCheck, EveryProblemUpToTwentyThenACount) {
    ASSERT_TRUE(exists(tiny("dcp_seed_ws1"))) << "missing fixture " << tiny("dcp_seed_ws1");
    Copy c(tiny("dcp_seed_ws1"));
    std::string f = c.dir + "/__0_0.distcp", z = read_file(f), out;
    std::vector<Piece> v = pieces_of(c.dir, "__0_0.distcp");
    ASSERT_GT(v.size(), 20u);
    for (const Piece &p : v) z[find_header(z, "PK\3\4", p.off, p.off + p.len, "/data/0") + 32] ^= 0x20; // its name
    write_file(f, z);
    EXPECT_EQ(ckpt("inspect " + c.dir, &out), 1) << out;
    for (size_t i = 0; i < 20; i++) EXPECT_TRUE(has(out, "tensor " + v[i].fqn + ": ")) << v[i].fqn << ": " << out;
    EXPECT_FALSE(has(out, "tensor " + v[20].fqn + ": ")) << out;
    EXPECT_TRUE(has(out, "error: ... and " + std::to_string(v.size() - 20) + " more\n")) << out;
    EXPECT_TRUE(has(out, std::to_string(v.size()) + " problems in its data files")) << out;
}

TEST(CkptCheck, ChunkDtypeAndShapeAgainstMetadata) {
    std::string t = make_tmpdir("ckpt-check"), out;
    dcp_file_writer w;
    fsdp_err err;
    ASSERT_EQ(dcp_file_open(&w, t.c_str(), 0, &err), 0) << err.msg;
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t shape[2] = {4, 2}, off[2] = {0, 0};
    dcp_record rec[2];
    ASSERT_EQ(dcp_file_add_tensor(&w, "w", FSDP_DT_F32, 2, shape, off, shape, a, &rec[0], &err), 0) << err.msg;
    ASSERT_EQ(dcp_file_add_tensor(&w, "v", FSDP_DT_F32, 2, shape, off, shape, a, &rec[1], &err), 0) << err.msg;
    ASSERT_EQ(dcp_file_close(&w, &err), 0) << err.msg;
    ASSERT_EQ(dcp_write_metadata(t.c_str(), rec, 2, &err), 0) << err.msg;
    EXPECT_EQ(ckpt("inspect " + t, &out), 0) << out;
    rec[0].dtype = FSDP_DT_BF16;                 // .metadata says bf16
    rec[1].shape[1] = rec[1].sizes[1] = 1;       // and [4, 1]
    ASSERT_EQ(dcp_write_metadata(t.c_str(), rec, 2, &err), 0) << err.msg;
    EXPECT_EQ(ckpt("inspect " + t, &out), 1) << out;
    EXPECT_TRUE(has(out, "tensor w: " + t + "/__0_0.distcp@0: the stored piece is f32 [4, 2], its chunk in "
                         ".metadata is bf16 [4, 2]"))
        << out;
    EXPECT_TRUE(has(out, "tensor v: " + t + "/__0_0.distcp@")) << out;
    EXPECT_TRUE(has(out, "the stored piece is f32 [4, 2], its chunk in .metadata is f32 [4, 1]")) << out;
    rm_rf(t);
}

TEST(CkptCheck, SafetensorsPieceMustListTheChunk) {
    std::string src = everyday("dcp_safetensors_serialization");
    ASSERT_TRUE(exists(src)) << "missing fixture " << src;
    Copy c(src);
    std::string f = c.dir + "/__0_0.distcp", z = read_file(f), out;
    size_t at = z.find("\"lin.bias\"");
    ASSERT_NE(at, std::string::npos);
    z[at + 8] = 'z'; // the header lists "lin.biaz"
    write_file(f, z);
    EXPECT_EQ(ckpt("inspect " + c.dir, &out), 1) << out; // before: 0
    EXPECT_TRUE(has(out, f + ": the safetensors piece at byte 0 has no tensor lin.bias")) << out;
    EXPECT_TRUE(has(out, "1 problem in its data files")) << out;
}

TEST(CkptCheck, PtTensorRecordCompressed) {
    std::string src = tiny("model_step5.pt");
    ASSERT_TRUE(exists(src)) << "missing fixture " << src;
    std::string t = make_tmpdir("ckpt-check"), p = t + "/m.pt", z = read_file(src), out;
    put16(z, find_header(z, "PK\3\4", 0, z.size(), "/data/1") + 8, 8);
    put16(z, find_header(z, "PK\1\2", 0, z.size(), "/data/1") + 10, 8);
    write_file(p, z);
    EXPECT_EQ(ckpt("inspect " + p, &out), 1) << out; // before: 0
    EXPECT_TRUE(has(out, "tensor layers.0.attention.wq.weight: " + p + ": zip record model_step5/data/1 is compressed"))
        << out;
    rm_rf(t);
}

TEST(CkptCheck, PayloadBytesAreLeftToVerify) {
    ASSERT_TRUE(exists(tiny("dcp_seed_ws1"))) << "missing fixture " << tiny("dcp_seed_ws1");
    Copy c(tiny("dcp_seed_ws1"));
    std::string f = c.dir + "/__0_0.distcp", z = read_file(f), out;
    std::vector<Piece> v = pieces_of(c.dir, "__0_0.distcp");
    ASSERT_FALSE(v.empty());
    size_t h = find_header(z, "PK\3\4", v[0].off, v[0].off + v[0].len, "/data/0");
    size_t nl = (unsigned char)z[h + 26] | (size_t)(unsigned char)z[h + 27] << 8;
    size_t xl = (unsigned char)z[h + 28] | (size_t)(unsigned char)z[h + 29] << 8;
    z[h + 30 + nl + xl + 3] ^= 0x40; // a byte of the tensor's values
    write_file(f, z);
    EXPECT_EQ(ckpt("inspect " + c.dir, &out), 0) << out;
    EXPECT_TRUE(has(out, "not the bytes: `--verify` also checks the CRC-32 of every byte")) << out;
    EXPECT_EQ(ckpt("inspect --verify " + c.dir, &out), 1) << out;
    EXPECT_TRUE(has(out, "CRC-32 mismatch")) << out;
}
