// Issue 13, the torch.save / zip / pickle readers: crafted .pt files (sizes past their records,
// memo DAGs, forbidden globals), zip CRC-32 and local-header mutations, and the growth of the
// pickle parser. Every crafted file is built here byte by byte (pickle opcodes + zip_writer);
// the ones the fuzz corpus keeps are compared with tests/fuzz/corpus/ (FSDP_UPDATE_CORPUS=1
// rewrites them).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fuzz/fuzz.h"
#include "test_util.h"

extern "C" {
#include "ckpt/pickle.h"
#include "ckpt/reader.h"
#include "ckpt/torchsave.h"
#include "ckpt/zip.h"
}

using namespace fsdp_test;

namespace {

// ---- pickle bytes ------------------------------------------------------------------------

struct Pk {
    std::string b;
    Pk &op(unsigned char c) {
        b += (char)c;
        return *this;
    }
    Pk &u32(uint32_t x) {
        for (int i = 0; i < 4; i++) op((unsigned char)(x >> (8 * i)));
        return *this;
    }
    Pk &proto() { return op(0x80).op(2); }
    Pk &global(const std::string &mod, const std::string &name) {
        b += "c" + mod + "\n" + name + "\n";
        return *this;
    }
    Pk &str(const std::string &s) {
        op('X').u32((uint32_t)s.size());
        b += s;
        return *this;
    }
    Pk &integer(int64_t v) {
        if (v >= 0 && v < 256) return op('K').op((unsigned char)v);
        if (v >= INT32_MIN && v <= INT32_MAX) return op('J').u32((uint32_t)(int32_t)v);
        op(0x8a).op(8);  // LONG1, 8 bytes little-endian two's complement
        for (int i = 0; i < 8; i++) op((unsigned char)((uint64_t)v >> (8 * i)));
        return *this;
    }
    Pk &ints(const std::vector<int64_t> &v) {
        mark();
        for (int64_t x : v) integer(x);
        return op('t');
    }
    Pk &mark() { return op('('); }
    Pk &put(uint32_t i) { return op('r').u32(i); }
    Pk &get(uint32_t i) { return op('j').u32(i); }
    Pk &stop() { return op('.'); }
};

// REDUCE(torch._utils._rebuild_tensor_v2, (persid(('storage', torch.<cls>, key, 'cpu', numel)),
//        offset, shape, stride, False, OrderedDict()))
void tensor(Pk &p, const std::string &cls, const std::string &key, int64_t storage_numel, int64_t offset,
            const std::vector<int64_t> &shape, const std::vector<int64_t> &stride) {
    p.global("torch._utils", "_rebuild_tensor_v2").mark();
    p.mark().str("storage").global("torch", cls).str(key).str("cpu").integer(storage_numel).op('t').op('Q');
    p.integer(offset).ints(shape).ints(stride).op(0x89).global("collections", "OrderedDict").op(')').op('R');
    p.op('t').op('R');
}

// the same as _rebuild_tensor_v3 over an UntypedStorage of nbytes bytes
void tensor_v3(Pk &p, const std::string &dtype, const std::string &key, int64_t nbytes, int64_t offset,
               const std::vector<int64_t> &shape, const std::vector<int64_t> &stride) {
    p.global("torch._utils", "_rebuild_tensor_v3").mark();
    p.mark().str("storage").global("torch.storage", "UntypedStorage").str(key).str("cpu").integer(nbytes).op('t').op('Q');
    p.integer(offset).ints(shape).ints(stride).op(0x89).global("collections", "OrderedDict").op(')').op('R');
    p.global("torch", dtype).op('t').op('R');
}

// {name: value...} where each value is written by a callback
std::string state_dict(const std::vector<std::pair<std::string, std::function<void(Pk &)>>> &items) {
    Pk p;
    p.proto().op('}').mark();
    for (auto &it : items) {
        p.str(it.first);
        it.second(p);
    }
    p.op('u').stop();
    return p.b;
}

// ---- zip archives ------------------------------------------------------------------------

// A torch.save archive (our zip_writer: 64-byte aligned payloads, no data descriptors) of
// data.pkl, byteorder, data/<key> records and version.
std::string make_pt(const std::string &pkl, const std::vector<std::pair<std::string, std::string>> &data) {
    FILE *f = tmpfile();
    zip_writer w;
    fsdp_err err;
    uint64_t len = 0;
    int rc = zip_writer_begin(&w, f, &err);
    if (!rc) rc = zip_writer_add(&w, "archive/data.pkl", pkl.data(), pkl.size(), &err);
    if (!rc) rc = zip_writer_add(&w, "archive/byteorder", "little", 6, &err);
    for (size_t i = 0; !rc && i < data.size(); i++)
        rc = zip_writer_add(&w, ("archive/data/" + data[i].first).c_str(), data[i].second.data(), data[i].second.size(),
                            &err);
    if (!rc) rc = zip_writer_add(&w, "archive/version", "3\n", 2, &err);
    if (!rc) rc = zip_writer_finish(&w, &len, &err);
    zip_writer_free(&w);
    EXPECT_EQ(rc, 0) << err.msg;
    std::string out(len, '\0');
    rewind(f);
    EXPECT_EQ(fread(&out[0], 1, len, f), len);
    fclose(f);
    return out;
}

std::string floats(const std::vector<float> &v) { return std::string((const char *)v.data(), v.size() * 4); }

// Offset of the local header of the record whose name ends with `suffix`.
size_t local_header(const std::string &z, const std::string &suffix) {
    for (size_t at = z.find("PK\x03\x04"); at != std::string::npos; at = z.find("PK\x03\x04", at + 4)) {
        size_t nl = (unsigned char)z[at + 26] | (size_t)(unsigned char)z[at + 27] << 8;
        std::string name = z.substr(at + 30, nl);
        if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
            return at;
    }
    ADD_FAILURE() << "no record " << suffix;
    return 0;
}
size_t payload(const std::string &z, size_t hdr) {
    size_t nl = (unsigned char)z[hdr + 26] | (size_t)(unsigned char)z[hdr + 27] << 8;
    size_t xl = (unsigned char)z[hdr + 28] | (size_t)(unsigned char)z[hdr + 29] << 8;
    return hdr + 30 + nl + xl;
}

// ---- the crafted files ---------------------------------------------------------------------

const int64_t P62 = (int64_t)1 << 62;

// item 1: {"w": FloatStorage tensor of shape (2^62,)} over a 24-byte record
std::string item1_numel_2p62() {
    return make_pt(state_dict({{"w", [](Pk &p) { tensor(p, "FloatStorage", "0", P62, 0, {P62}, {1}); }}}),
                   {{"0", std::string(24, '\x01')}});
}
// the same with stride 0 over a 6-element storage (the heap WRITE overflow in ts_read_box)
std::string item1_stride0() {
    return make_pt(state_dict({{"w", [](Pk &p) { tensor(p, "FloatStorage", "0", 6, 0, {P62}, {0}); }}}),
                   {{"0", std::string(24, '\x01')}});
}
// a header claiming 2^40 elements over 24 bytes (must be "corrupt", never malloc(4 TiB))
std::string item1_numel_2p40() {
    int64_t n = (int64_t)1 << 40;
    return make_pt(state_dict({{"w", [n](Pk &p) { tensor(p, "FloatStorage", "0", n, 0, {n}, {1}); }}}),
                   {{"0", std::string(24, '\x01')}});
}
// item 4: {'x': 1}, then 24 levels of {a: prev, b: prev} (memo references)
std::string dag_pickle(int levels) {
    Pk p;
    p.proto().op('}').put(0).str("x").integer(1).op('s');
    for (int k = 1; k <= levels; k++) p.op('}').put((uint32_t)k).mark().str("a").get(k - 1).str("b").get(k - 1).op('u');
    return p.stop().b;
}
std::string item4_dag24() { return make_pt(dag_pickle(24), {}); }
// item 9: {"x": os.system('echo pwned')} (GLOBAL) and {"x": builtins.eval('1')} (STACK_GLOBAL)
std::string os_system_pickle() {
    Pk p;
    p.proto().op('}').mark().str("x").global("os", "system").str("echo pwned").op(0x85).op('R').op('u').stop();
    return p.b;
}
std::string item9_os_system() { return make_pt(os_system_pickle(), {}); }
std::string item9_stack_global_eval() {
    Pk p;
    p.proto().op('}').mark().str("x").str("builtins").str("eval").op(0x93).str("1").op(0x85).op('R').op('u').stop();
    return make_pt(p.b, {});
}
// a valid state dict: two f32 tensors (one a strided view) and a value
std::string valid_pt() {
    std::vector<float> a(12), b(6);
    for (int i = 0; i < 12; i++) a[(size_t)i] = 0.5f * (float)i;
    for (int i = 0; i < 6; i++) b[(size_t)i] = -1.0f - (float)i;
    std::string pkl = state_dict({{"layer.w", [](Pk &p) { tensor(p, "FloatStorage", "0", 12, 0, {3, 4}, {4, 1}); }},
                                  {"layer.t", [](Pk &p) { tensor(p, "FloatStorage", "1", 6, 1, {2, 2}, {1, 2}); }},
                                  {"step", [](Pk &p) { p.integer(7); }}});
    return make_pt(pkl, {{"0", floats(a)}, {"1", floats(b)}});
}
// a fuzzing seed of every kind the reader takes: v3 (bf16), i64, a 0-d bool, an empty f16, a
// nested optimizer-like dict with integer keys, a value
std::string valid_mixed_pt() {
    Pk p;
    p.proto().op('}').mark();
    p.str("bf");
    tensor_v3(p, "bfloat16", "0", 8, 0, {2, 2}, {2, 1});
    p.str("ids");
    tensor(p, "LongStorage", "1", 3, 0, {3}, {1});
    p.str("flag");
    tensor(p, "BoolStorage", "2", 1, 0, {}, {});
    p.str("empty");
    tensor(p, "HalfStorage", "3", 0, 0, {0, 4}, {4, 1});
    p.str("opt").op('}').mark().str("state").op('}').mark().integer(0).op('}').mark().str("step");
    tensor(p, "FloatStorage", "4", 1, 0, {}, {});
    p.str("lr").integer(3).op('u').op('u').op('u');
    p.op('u').stop();
    std::string bf(8, '\0'), ids(24, '\0');
    for (int i = 0; i < 4; i++) bf[(size_t)(2 * i + 1)] = (char)(0x3f + i);  // bf16 0.5.., little-endian
    for (int i = 0; i < 3; i++) ids[(size_t)(8 * i)] = (char)(i + 7);
    return make_pt(p.b, {{"0", bf}, {"1", ids}, {"2", std::string(1, '\1')}, {"3", ""}, {"4", floats({5})}});
}
// item 3: one payload bit flipped / the local header's extra length + 4
std::string item3_flipped_bit() {
    std::string z = valid_pt();
    z[payload(z, local_header(z, "data/0")) + 21] ^= 0x04;
    return z;
}
std::string item3_extra_plus4() {
    std::string z = valid_pt();
    z[local_header(z, "data/0") + 28] += 4;
    return z;
}

struct Crafted {
    const char *harness, *name;
    std::string (*make)();
};
const Crafted CRAFTED[] = {
    {"pt", "item1-numel-2p62.pt", item1_numel_2p62},
    {"pt", "item1-stride0-numel-2p62.pt", item1_stride0},
    {"pt", "item1-numel-2p40-over-24-bytes.pt", item1_numel_2p40},
    {"pt", "item3-flipped-payload-bit.pt", item3_flipped_bit},
    {"pt", "item3-local-extra-length-plus-4.pt", item3_extra_plus4},
    {"pt", "item4-memo-dag-24-levels.pt", item4_dag24},
    {"pt", "item9-os-system.pt", item9_os_system},
    {"pt", "item9-stack-global-builtins-eval.pt", item9_stack_global_eval},
    {"pt", "valid-state-dict.pt", valid_pt},
    {"pt", "valid-mixed-dtypes-nested.pt", valid_mixed_pt},
    {"zip", "item1-numel-2p62.pt", item1_numel_2p62},
    {"zip", "item3-flipped-payload-bit.pt", item3_flipped_bit},
    {"zip", "item3-local-extra-length-plus-4.pt", item3_extra_plus4},
    {"pickle", "item4-memo-dag-24-levels.pkl", [] { return dag_pickle(24); }},
    {"pickle", "item9-os-system.pkl", os_system_pickle},
};

std::string write_tmp(const std::string &dir, const std::string &name, const std::string &bytes) {
    std::string p = dir + "/" + name;
    write_file(p, bytes);
    return p;
}

std::string open_error(const std::string &path) {
    ckpt_reader *r = nullptr;
    fsdp_err err;
    err.msg[0] = 0;
    if (ckpt_open(path.c_str(), CKPT_AUTO, &r, &err) == 0) {
        ckpt_close(r);
        return "";
    }
    return err.msg;
}

// Reads every tensor whole (as f64); the first error, "" when all read.
std::string read_all_error(const std::string &path) {
    ckpt_reader *r = nullptr;
    fsdp_err err;
    if (ckpt_open(path.c_str(), CKPT_AUTO, &r, &err)) return err.msg;
    std::string out;
    for (size_t i = 0; i < ckpt_count(r) && out.empty(); i++) {
        const ckpt_entry *e = ckpt_entry_at(r, i);
        if (!e->is_tensor) continue;
        std::vector<double> b((size_t)std::max<int64_t>(1, fsdp_numel(e->ndim, e->shape)));
        if (ckpt_read_rows(r, i, 0, e->ndim ? e->shape[0] : 1, b.data(), FSDP_DT_F64, &err)) out = err.msg;
    }
    ckpt_close(r);
    return out;
}

bool has(const std::string &s, const std::string &sub) { return s.find(sub) != std::string::npos; }

}  // namespace

// ---- item 1: sizes ---------------------------------------------------------------------------

TEST(HardenPtSizes, TensorBytesPastTheRecordAreCorruptAtOpen) {
    std::string t = make_tmpdir("harden-pt");
    struct {
        std::string (*make)();
        const char *msg;
    } cases[] = {
        {item1_numel_2p62, "corrupt: tensor w needs more than 18446744073709551615 bytes, the record has 24"},
        {item1_stride0, "corrupt: tensor w needs more than 18446744073709551615 bytes, the record has 24"},
        {item1_numel_2p40, "corrupt: tensor w needs 4398046511104 bytes, the record has 24"},
    };
    for (auto &c : cases) {
        std::string p = write_tmp(t, "x.pt", c.make());
        std::string e = open_error(p);
        EXPECT_TRUE(has(e, c.msg)) << e;
        EXPECT_TRUE(has(e, p)) << e;
    }
    rm_rf(t);
}

// issue 26 item 17: torch.save(torch.arange(4.).reshape(1, 4).expand(3, 4)) stores its 4-element
// storage (16 bytes) with strides (0, 1); a record needs its storage's bytes, and every read
// repeats the row (whole, some rows, and a storage offset into a larger storage)
TEST(HardenPtSizes, BroadcastViewReadsItsStorage) {
    std::string t = make_tmpdir("harden-pt");
    std::string p = write_tmp(
        t, "e.pt",
        make_pt(state_dict({{"e", [](Pk &q) { tensor(q, "FloatStorage", "0", 4, 0, {3, 4}, {0, 1}); }},
                            {"f", [](Pk &q) { tensor(q, "FloatStorage", "1", 6, 2, {2, 1000, 2}, {2, 0, 1}); }}}),
                {{"0", floats({0, 1, 2, 3})}, {"1", floats({9, 9, 5, 6, 7, 8})}}));
    ASSERT_EQ(open_error(p), "");
    ckpt_reader *r = nullptr;
    fsdp_err err;
    ASSERT_EQ(ckpt_open(p.c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    long e = ckpt_find(r, "e"), f = ckpt_find(r, "f");
    ASSERT_GE(e, 0);
    ASSERT_GE(f, 0);
    EXPECT_EQ(ckpt_entry_at(r, (size_t)e)->nbytes, 48u);
    std::vector<float> v(12);
    ASSERT_EQ(ckpt_read_rows(r, (size_t)e, 0, 3, v.data(), FSDP_DT_F32, &err), 0) << err.msg;
    for (int i = 0; i < 12; i++) EXPECT_EQ(v[(size_t)i], (float)(i % 4)) << i;
    ASSERT_EQ(ckpt_read_rows(r, (size_t)e, 2, 3, v.data(), FSDP_DT_F32, &err), 0) << err.msg;
    for (int i = 0; i < 4; i++) EXPECT_EQ(v[(size_t)i], (float)i) << i;
    std::vector<double> w(4000);
    ASSERT_EQ(ckpt_read_rows(r, (size_t)f, 0, 2, w.data(), FSDP_DT_F64, &err), 0) << err.msg;
    for (int i = 0; i < 4000; i++) EXPECT_EQ(w[(size_t)i], (i < 2000 ? 5.0 : 7.0) + i % 2) << i;
    ckpt_close(r);
    // the storage itself must be in its record
    p = write_tmp(t, "s.pt",
                  make_pt(state_dict({{"e", [](Pk &q) { tensor(q, "FloatStorage", "0", 4, 0, {3, 4}, {0, 1}); }}}),
                          {{"0", floats({0, 1, 2})}}));
    EXPECT_TRUE(has(open_error(p), "corrupt: tensor e needs 16 bytes, the record has 12")) << open_error(p);
    rm_rf(t);
}

TEST(HardenPtSizes, StorageLargerThanItsRecordIsCorrupt) {
    std::string t = make_tmpdir("harden-pt");
    // 6 floats claimed, 16 bytes stored; and a storage numel whose bytes overflow (2^62 x 4)
    std::string p = write_tmp(
        t, "s.pt",
        make_pt(state_dict({{"a", [](Pk &q) { tensor(q, "FloatStorage", "0", 6, 0, {2}, {1}); }}}),
                {{"0", floats({1, 2, 3, 4})}}));
    EXPECT_TRUE(has(open_error(p), "corrupt: tensor a needs 24 bytes, the record has 16")) << open_error(p);
    p = write_tmp(t, "s.pt",
                  make_pt(state_dict({{"a", [](Pk &q) { tensor(q, "DoubleStorage", "0", P62, 0, {2}, {1}); }}}),
                          {{"0", floats({1, 2, 3, 4})}}));
    EXPECT_TRUE(has(open_error(p), "corrupt: tensor a needs more than")) << open_error(p);
    // strides whose reach overflows int64 (shape 2^62 x stride 4)
    p = write_tmp(t, "s.pt",
                  make_pt(state_dict({{"a", [](Pk &q) { tensor(q, "FloatStorage", "0", 4, 0, {P62, 1}, {4, 1}); }}}),
                          {{"0", floats({1, 2, 3, 4})}}));
    EXPECT_TRUE(has(open_error(p), "overflow")) << open_error(p);
    rm_rf(t);
}

// ts_read_box itself (the DCP reader calls it on pieces it decoded) checks before allocating.
TEST(HardenPtSizes, ReadBoxChecksTheRecordFirst) {
    for (auto make : {item1_numel_2p62, item1_stride0, item1_numel_2p40}) {
        std::string z = make();
        zip_reader zr;
        fsdp_err err;
        ASSERT_EQ(zip_open_mem(&zr, z.data(), z.size(), "crafted.pt", &err), 0) << err.msg;
        pkl_doc *doc;
        const pkl_obj *root;
        ASSERT_EQ(ts_load_pickle(&zr, &doc, &root, &err), 0) << err.msg;
        ts_tensor t;
        ASSERT_EQ(ts_tensor_from_pickle(pkl_dict_get(root, "w"), "crafted.pt: w", &t, &err), 0) << err.msg;
        int64_t off[FSDP_MAX_DIMS] = {0}, len[FSDP_MAX_DIMS] = {1};
        double one;
        EXPECT_NE(ts_read_box(&zr, &t, off, len, &one, FSDP_DT_F64, &err), 0);
        EXPECT_TRUE(has(err.msg, "corrupt: the tensor in record data/0 needs")) << err.msg;
        pkl_free(doc);
        zip_close(&zr);
    }
}

TEST(HardenPtCli, CraftedFilesFailCleanlyInEveryCommand) {
    std::string t = make_tmpdir("harden-pt"), out, bin = fsdp_run_bin() + " ckpt ";
    struct {
        std::string (*make)();
        const char *msg;
    } cases[] = {
        {item1_numel_2p62, "corrupt: tensor w needs"},
        {item1_stride0, "corrupt: tensor w needs"},
        {item1_numel_2p40, "corrupt: tensor w needs 4398046511104 bytes, the record has 24"},
        {item4_dag24, "expands to more than"},
        {item9_os_system, "global os.system is not allowed"},
        {item9_stack_global_eval, "global builtins.eval is not allowed"},
    };
    for (auto &c : cases) {
        std::string p = write_tmp(t, "x.pt", c.make());
        for (std::string cmd : {"inspect " + p, "inspect --verify " + p, "diff " + p + " " + p,
                                "convert " + p + " " + t + "/o --to dcp", "convert " + p + " " + t + "/o.safetensors"}) {
            rm_rf(t + "/o");
            rm_rf(t + "/o.safetensors");
            EXPECT_EQ(run_cmd(bin + cmd, &out), 1) << cmd << ": " << out;
            EXPECT_TRUE(has(out, c.msg)) << cmd << ": " << out;
            EXPECT_TRUE(has(out, p)) << cmd << ": " << out;
        }
    }
    rm_rf(t);
}

// ---- item 3: CRC-32 and local headers ----------------------------------------------------

TEST(HardenPtCrc, FlippedPayloadBitOfOurOwnArchive) {
    std::string t = make_tmpdir("harden-pt");
    std::string good = write_tmp(t, "good.pt", valid_pt()), bad = write_tmp(t, "bad.pt", item3_flipped_bit());
    EXPECT_EQ(read_all_error(good), "");
    // opening reads no payload; reading the tensor whole checks its record
    EXPECT_EQ(open_error(bad), "");
    std::string e = read_all_error(bad);
    EXPECT_TRUE(has(e, "tensor layer.w")) << e;
    EXPECT_TRUE(has(e, bad + ": zip record archive/data/0: CRC-32 mismatch")) << e;
    // a strided view of a storage reads only the bytes it spans, and still checks the whole record
    std::string z = valid_pt();
    z[payload(z, local_header(z, "data/1")) + 23] ^= 0x01;  // the last element, outside the view's span
    std::string v = write_tmp(t, "view.pt", z);
    e = read_all_error(v);
    EXPECT_TRUE(has(e, "tensor layer.t")) << e;
    EXPECT_TRUE(has(e, "zip record archive/data/1: CRC-32 mismatch")) << e;
    // ckpt_verify checks every record
    ckpt_reader *r;
    fsdp_err err;
    size_t n = 0;
    ASSERT_EQ(ckpt_open(good.c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    EXPECT_EQ(ckpt_verify(r, &n, &err), 0) << err.msg;
    EXPECT_EQ(n, 5u);  // data.pkl, byteorder, data/0, data/1, version
    ckpt_close(r);
    ASSERT_EQ(ckpt_open(bad.c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    EXPECT_NE(ckpt_verify(r, &n, &err), 0);
    EXPECT_TRUE(has(err.msg, "tensor layer.w")) << err.msg;
    ckpt_close(r);
    rm_rf(t);
}

TEST(HardenPtCrc, ExtraLengthPlus4IsCaughtAtOpen) {
    std::string t = make_tmpdir("harden-pt");
    std::string p = write_tmp(t, "x.pt", item3_extra_plus4());
    std::string e = open_error(p);
    EXPECT_TRUE(has(e, "tensor layer.w")) << e;
    EXPECT_TRUE(has(e, p + ": zip record archive/data/0")) << e;
    EXPECT_TRUE(has(e, "corrupt")) << e;
    rm_rf(t);
}

// The local header must match the central directory: signature, name, method, size, CRC; a
// payload may not overlap the next record. Each mutation is an error naming the record.
TEST(HardenPtCrc, LocalHeaderMismatches) {
    const std::string z0 = valid_pt();
    const size_t h = local_header(z0, "data/0");
    struct {
        const char *what;
        std::function<void(std::string &)> mutate;
        const char *msg;
    } cases[] = {
        {"signature", [&](std::string &z) { z[h + 2] = 'X'; }, "no local header signature"},
        {"name", [&](std::string &z) { z[h + 30 + 13] = '9'; }, "names another record"},
        {"method", [&](std::string &z) { z[h + 8] = 8; }, "another compression method"},
        {"crc", [&](std::string &z) { z[h + 14] ^= 1; }, "disagrees with the central directory"},
        {"size", [&](std::string &z) { z[h + 22] += 1; }, "disagrees with the central directory"},
        {"extra length -4", [&](std::string &z) { z[h + 28] -= 4; }, "malformed"},
        {"size +64 in both headers",
         [&](std::string &z) {
             z[h + 18] += 64, z[h + 22] += 64;
             size_t cd = z.find("PK\x01\x02" + std::string(), z.find("archive/version"));
             while (z.compare(cd + 46, 14, "archive/data/0") != 0) cd = z.find("PK\x01\x02", cd + 4);
             z[cd + 20] += 64, z[cd + 24] += 64;
         },
         "overlaps record archive/data/1"},
    };
    for (auto &c : cases) {
        std::string z = z0;
        c.mutate(z);
        zip_reader zr;
        fsdp_err err;
        ASSERT_EQ(zip_open_mem(&zr, z.data(), z.size(), "m.pt", &err), 0) << c.what << ": " << err.msg;
        zip_entry *e = zip_find(&zr, "data/0");
        ASSERT_NE(e, nullptr);
        ASSERT_NE(e->bad, nullptr) << c.what;
        EXPECT_TRUE(has(e->bad, "m.pt: zip record archive/data/0")) << c.what << ": " << e->bad;
        EXPECT_TRUE(has(e->bad, c.msg)) << c.what << ": " << e->bad;
        char buf[48];
        EXPECT_NE(zip_read(&zr, e, 0, buf, sizeof buf, &err), 0) << c.what;
        EXPECT_NE(zip_read(&zr, e, 4, buf, 4, &err), 0) << c.what;
        EXPECT_EQ(zip_find(&zr, "data/1")->bad, nullptr) << c.what;
        zip_close(&zr);
    }
    // a directory entry whose offset points at another record's local header
    std::string z = z0;
    size_t cd = z.find("PK\x01\x02");
    while (cd != std::string::npos && z.compare(cd + 46, 14, "archive/data/1") != 0) cd = z.find("PK\x01\x02", cd + 4);
    ASSERT_NE(cd, std::string::npos);
    uint32_t off = (uint32_t)h;
    for (int i = 0; i < 4; i++) z[cd + 42 + i] = (char)(off >> (8 * i));
    zip_reader zr;
    fsdp_err err;
    ASSERT_EQ(zip_open_mem(&zr, z.data(), z.size(), "o.pt", &err), 0) << err.msg;
    ASSERT_NE(zip_find(&zr, "data/1")->bad, nullptr);
    EXPECT_TRUE(has(zip_find(&zr, "data/1")->bad, "o.pt: zip record archive/data/1: the local header names another record"))
        << zip_find(&zr, "data/1")->bad;
    zip_close(&zr);
    // two records of one name
    z = z0;
    z[cd + 46 + 13] = '0';
    EXPECT_NE(zip_open_mem(&zr, z.data(), z.size(), "d.pt", &err), 0);
    EXPECT_TRUE(has(err.msg, "d.pt: zip holds two records named archive/data/0")) << err.msg;
}

TEST(HardenPtCrc, TorchFixtureMutations) {
    std::string fx = tiny("model_step5.pt");
    if (!exists(fx)) GTEST_SKIP() << "no fixture " << fx;
    std::string t = make_tmpdir("harden-pt"), out, bin = fsdp_run_bin() + " ckpt ";
    std::string z0 = read_file(fx);
    // a real torch archive: data descriptors, records verify
    EXPECT_EQ(run_cmd(bin + "inspect --verify " + fx, &out), 0) << out;
    EXPECT_TRUE(has(out, "verified: the CRC-32 of all 27 records matches")) << out;
    size_t h = local_header(z0, "model_step5/data/1");
    std::string flip = z0, extra = z0;
    flip[payload(z0, h) + 1000] ^= 0x10;
    extra[h + 28] = (char)((unsigned char)extra[h + 28] + 4);  // 64 -> 68
    EXPECT_EQ((unsigned char)z0[h + 28], 64);
    std::string pf = write_tmp(t, "flip.pt", flip), px = write_tmp(t, "extra.pt", extra);
    for (const std::string &p : {pf, px}) {
        for (std::string cmd : {"inspect --verify " + p, "diff " + p + " " + fx, "convert " + p + " " + t + "/o.safetensors",
                                "convert " + p + " " + t + "/o --to dcp"}) {
            EXPECT_EQ(run_cmd(bin + cmd, &out), 1) << cmd << ": " << out;
            EXPECT_TRUE(has(out, "tensor layers.0.attention.wq.weight")) << cmd << ": " << out;
            EXPECT_TRUE(has(out, p + ": zip record model_step5/data/1")) << cmd << ": " << out;
            EXPECT_FALSE(has(out, "max abs diff")) << cmd << ": " << out;
        }
    }
    EXPECT_TRUE(has(read_all_error(pf), "CRC-32 mismatch")) << read_all_error(pf);
    rm_rf(t);
}

// A .distcp piece is a torch.save archive: a flipped payload bit is an error naming the tensor.
TEST(HardenPtCrc, DcpPieceBitFlip) {
    std::string src = tiny("dcp_seed_ws1");
    if (!exists(src)) GTEST_SKIP() << "no fixture " << src;
    std::string t = make_tmpdir("harden-pt"), out, bin = fsdp_run_bin() + " ckpt ";
    ASSERT_EQ(system(("cp -r " + src + " " + t + "/d").c_str()), 0);
    EXPECT_EQ(run_cmd(bin + "inspect --verify " + t + "/d", &out), 0) << out;
    std::string f = t + "/d/__0_0.distcp", z = read_file(f);
    size_t h = local_header(z, "/data/0");
    z[payload(z, h) + 5] ^= 0x20;
    write_file(f, z);
    for (std::string cmd : {"inspect --verify " + t + "/d", "diff " + t + "/d " + src, "convert " + t + "/d " + t + "/o.safetensors"}) {
        EXPECT_EQ(run_cmd(bin + cmd, &out), 1) << cmd << ": " << out;
        EXPECT_TRUE(has(out, "CRC-32 mismatch")) << cmd << ": " << out;
        EXPECT_TRUE(has(out, "tensor ")) << cmd << ": " << out;
        EXPECT_TRUE(has(out, f + "@")) << cmd << ": " << out;
    }
    rm_rf(t);
}

// What PyTorch wrote and what we write still loads (and verifies).
TEST(HardenPtCrc, RealAndOwnArchivesVerify) {
    std::string t = make_tmpdir("harden-pt"), out, bin = fsdp_run_bin() + " ckpt ";
    for (const char *d : {"dcp_seed_ws1", "dcp_model_ws2", "dcp_full_ws3", "dcp_dtypes", "model_step5.pt"}) {
        if (!exists(tiny(d))) continue;
        EXPECT_EQ(run_cmd(bin + "inspect --verify " + tiny(d), &out), 0) << d << ": " << out;
        EXPECT_TRUE(has(out, "verified: the CRC-32 of all")) << out;
        EXPECT_EQ(read_all_error(tiny(d)), "") << d;
    }
    if (exists(tiny("model_step5.pt"))) {
        ASSERT_EQ(run_cmd(bin + "convert " + tiny("model_step5.pt") + " " + t + "/d --to dcp", &out), 0) << out;
        EXPECT_EQ(run_cmd(bin + "inspect --verify " + t + "/d", &out), 0) << out;
        EXPECT_EQ(run_cmd(bin + "diff " + t + "/d " + tiny("model_step5.pt"), &out), 0) << out;
    }
    std::string p = write_tmp(t, "v.pt", valid_pt());
    EXPECT_EQ(read_all_error(p), "");
    p = write_tmp(t, "m.pt", valid_mixed_pt());
    EXPECT_EQ(read_all_error(p), "");
    ckpt_reader *r;
    fsdp_err err;
    ASSERT_EQ(ckpt_open(p.c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    EXPECT_EQ(ckpt_count(r), 6u);
    long i = ckpt_find(r, "opt.state.0.step");
    ASSERT_GE(i, 0);
    float step = 0;
    ASSERT_EQ(ckpt_read_rows(r, (size_t)i, 0, 1, &step, FSDP_DT_F32, &err), 0) << err.msg;
    EXPECT_EQ(step, 5.0f);
    EXPECT_STREQ(ckpt_value_text(r, (size_t)ckpt_find(r, "opt.state.0.lr")), "3");
    size_t n = 0;
    EXPECT_EQ(ckpt_verify(r, &n, &err), 0) << err.msg;
    EXPECT_EQ(n, 8u);
    ckpt_close(r);
    rm_rf(t);
}

// ---- item 4: memo DAGs ---------------------------------------------------------------------

TEST(HardenPtDag, DictSharedAtEveryLevelIsBounded) {
    std::string t = make_tmpdir("harden-pt");
    std::string p = write_tmp(t, "dag.pt", item4_dag24());
    EXPECT_LT(read_file(p).size(), 2048u);
    std::string e = open_error(p);
    EXPECT_TRUE(has(e, p + ": the state dict expands to more than")) << e;
    EXPECT_TRUE(has(e, "-byte data.pkl")) << e;
    // a few levels of sharing are fine: 2^6 entries
    p = write_tmp(t, "dag6.pt", make_pt(dag_pickle(6), {}));
    ckpt_reader *r;
    fsdp_err err;
    ASSERT_EQ(ckpt_open(p.c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    EXPECT_EQ(ckpt_count(r), 64u);
    EXPECT_GE(ckpt_find(r, "a.b.a.b.a.b.x"), 0);
    ckpt_close(r);
    rm_rf(t);
}

// A value (list) shared by many keys: each repr is bounded, and so is the text of all of them.
TEST(HardenPtDag, SharedValueTextIsBounded) {
    Pk p;
    p.proto().op(']').put(0).mark();
    for (int i = 0; i < 3000; i++) p.integer(i);
    p.op('e');
    p.op('}').mark();
    for (int i = 0; i < 20000; i++) p.str("k" + std::to_string(i)).get(0);
    p.op('u').stop();
    std::string t = make_tmpdir("harden-pt");
    std::string path = write_tmp(t, "shared.pt", make_pt(p.b, {}));
    std::string e = open_error(path);
    EXPECT_TRUE(has(e, "expands to more than")) << e;
    rm_rf(t);
}

TEST(HardenPtDag, ReprIsBounded) {
    // a flat list of 200k ints, and a dict shared at 40 levels
    Pk p;
    p.proto().op(']').mark();
    for (int i = 0; i < 200000; i++) p.integer(i % 200);
    p.op('e').stop();
    for (const std::string &pk : {p.b, dag_pickle(40)}) {
        pkl_doc *doc;
        const pkl_obj *root;
        fsdp_err err;
        ASSERT_EQ(pkl_parse(pk.data(), pk.size(), "x", &doc, &root, &err), 0) << err.msg;
        char *s = pkl_repr(root);
        ASSERT_NE(s, nullptr);
        EXPECT_LT(strlen(s), 4200u);
        EXPECT_TRUE(has(s, "...")) << s;
        free(s);
        pkl_free(doc);
    }
    // a long string is cut too
    Pk q;
    q.proto().str(std::string(100000, 'y')).stop();
    pkl_doc *doc;
    const pkl_obj *root;
    fsdp_err err;
    ASSERT_EQ(pkl_parse(q.b.data(), q.b.size(), "x", &doc, &root, &err), 0) << err.msg;
    char *s = pkl_repr(root);
    EXPECT_LT(strlen(s), 4200u);
    free(s);
    pkl_free(doc);
}

// ---- item 5: growth ----------------------------------------------------------------------------

// Lists made first and grown later (the old parser searched its allocation list at every
// growth: quadratic). 300k of them parse in well under a second (no timing asserted).
TEST(HardenPtScale, ListsGrownLateParse) {
    const uint32_t n = 300000;
    Pk p;
    p.proto().op(']').put(0).mark();
    for (uint32_t i = 0; i < n; i++) {
        p.op(']').put(i + 1).mark();
        for (int k = 1; k <= 4; k++) p.integer(k);
        p.op('e');
    }
    p.op('e');
    for (uint32_t i = 0; i < n; i++) p.get(i + 1).integer(5).op('a').op('0');
    p.stop();
    pkl_doc *doc;
    const pkl_obj *root;
    fsdp_err err;
    ASSERT_EQ(pkl_parse(p.b.data(), p.b.size(), "x", &doc, &root, &err), 0) << err.msg;
    ASSERT_EQ(root->n, n);
    EXPECT_EQ(root->items[n - 1]->n, 5u);
    EXPECT_EQ(root->items[n - 1]->items[4]->i, 5);
    pkl_free(doc);
}

// A .pt of 100k tensors: open, and ckpt_find of every name (a linear search each before).
TEST(HardenPtScale, HundredThousandKeyPt) {
    const int n = 100000;
    std::vector<std::pair<std::string, std::function<void(Pk &)>>> items;
    std::vector<std::pair<std::string, std::string>> data;
    for (int i = 0; i < n; i++) {
        std::string k = std::to_string(i);
        items.push_back({"layers." + k + ".w", [k](Pk &q) { tensor(q, "FloatStorage", k, 1, 0, {1}, {1}); }});
        float v = (float)i;
        data.push_back({k, std::string((const char *)&v, 4)});
    }
    std::string t = make_tmpdir("harden-pt");
    std::string p = write_tmp(t, "big.pt", make_pt(state_dict(items), data));
    ckpt_reader *r;
    fsdp_err err;
    ASSERT_EQ(ckpt_open(p.c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    ASSERT_EQ(ckpt_count(r), (size_t)n);
    for (int i = 0; i < n; i++) ASSERT_EQ(ckpt_find(r, ("layers." + std::to_string(i) + ".w").c_str()), i);
    EXPECT_EQ(ckpt_find(r, "layers.100000.w"), -1);
    EXPECT_EQ(ckpt_find(r, ""), -1);
    double v = 0;
    ASSERT_EQ(ckpt_read_rows(r, (size_t)ckpt_find(r, "layers.77777.w"), 0, 1, &v, FSDP_DT_F64, &err), 0) << err.msg;
    EXPECT_EQ(v, 77777.0);
    ckpt_close(r);
    rm_rf(t);
}

// ---- item 9: globals -----------------------------------------------------------------------

TEST(HardenPtGlobals, ForbiddenGlobalsAreRefusedWhereTheyAreNamed) {
    std::string pk = os_system_pickle();
    pkl_doc *doc;
    const pkl_obj *root;
    fsdp_err err;
    ASSERT_NE(pkl_parse(pk.data(), pk.size(), "X data.pkl", &doc, &root, &err), 0);
    size_t at = pk.find("cos\n");
    EXPECT_EQ(std::string(err.msg), "X data.pkl: pickle: global os.system is not allowed (not a tensor, storage or "
                                    "container PyTorch's weights_only loader accepts) (at byte " +
                                        std::to_string(at) + ")");
    // whatever the opcode and whether or not anything calls it
    for (auto g : std::vector<std::pair<std::string, std::string>>{
             {"builtins", "eval"}, {"__builtin__", "getattr"}, {"posix", "system"}, {"subprocess", "Popen"},
             {"torch", "load"}, {"collections", "defaultdict"}, {"torch._utils", "_rebuild_tensor_v9"}}) {
        Pk a, b;
        a.proto().global(g.first, g.second).stop();
        b.proto().str(g.first).str(g.second).op(0x93).stop();
        for (const std::string &x : {a.b, b.b}) {
            ASSERT_NE(pkl_parse(x.data(), x.size(), "g", &doc, &root, &err), 0) << g.first << "." << g.second;
            EXPECT_TRUE(has(err.msg, "global " + g.first + "." + g.second + " is not allowed")) << err.msg;
        }
    }
    // the allowed ones PyTorch and DCP write
    for (auto g : std::vector<std::pair<std::string, std::string>>{
             {"torch._utils", "_rebuild_tensor_v2"}, {"torch._utils", "_rebuild_parameter"}, {"torch", "FloatStorage"},
             {"torch", "bfloat16"}, {"torch", "Size"}, {"collections", "OrderedDict"},
             {"torch.distributed.checkpoint.metadata", "Metadata"}, {"torch.serialization", "_get_layout"},
             {"pathlib", "PosixPath"}, {"_codecs", "encode"}, {"argparse", "Namespace"}}) {
        Pk a;
        a.proto().global(g.first, g.second).stop();
        EXPECT_EQ(pkl_parse(a.b.data(), a.b.size(), "g", &doc, &root, &err), 0) << err.msg;
        pkl_free(doc);
    }
}

// Every pickle of the PyTorch fixtures (DCP .metadata, .pt and .distcp data.pkl) names only allowed globals.
TEST(HardenPtGlobals, FixturePicklesParse) {
    std::string out;
    std::string root = fixtures_dir() + "/torch-2.11";
    if (!exists(root)) GTEST_SKIP() << "no fixtures";
    ASSERT_EQ(run_cmd("find " + root + " -name .metadata -o -name '*.pt' -o -name '*.distcp' | sort", &out), 0);
    size_t n = 0;
    for (size_t a = 0, b; a < out.size(); a = b + 1) {
        b = out.find('\n', a);
        if (b == std::string::npos) b = out.size();
        std::string f = out.substr(a, b - a), bytes = read_file(f);
        if (f.empty()) continue;
        pkl_doc *doc;
        const pkl_obj *rt;
        fsdp_err err;
        if (f.size() > 9 && f.compare(f.size() - 9, 9, ".metadata") == 0) {
            ASSERT_EQ(pkl_parse(bytes.data(), bytes.size(), f.c_str(), &doc, &rt, &err), 0) << err.msg;
            pkl_free(doc);
            n++;
            continue;
        }
        // every torch.save archive in the file (a .distcp holds one per item)
        for (size_t at = bytes.find("PK\x03\x04"); at != std::string::npos; at = bytes.find("PK\x03\x04", at + 4)) {
            size_t nl = (unsigned char)bytes[at + 26] | (size_t)(unsigned char)bytes[at + 27] << 8;
            std::string name = bytes.substr(at + 30, nl);
            if (name.size() < 8 || name.compare(name.size() - 8, 8, "data.pkl") != 0) continue;
            size_t start = payload(bytes, at);
            // the pickle ends at its STOP: parse up to the end of the file, the parser stops there
            int rc = pkl_parse(bytes.data() + start, bytes.size() - start, f.c_str(), &doc, &rt, &err);
            EXPECT_FALSE(rc && has(err.msg, "is not allowed")) << f << ": " << err.msg;
            // (some everyday .pt pickles use BUILD on an OrderedDict, which the reader does not take)
            if (f.find(".distcp") != std::string::npos) {
                EXPECT_EQ(rc, 0) << f << ": " << err.msg;
            }
            if (!rc) pkl_free(doc);
            n++;
        }
    }
    EXPECT_GT(n, 20u);
}

// ---- the corpus ------------------------------------------------------------------------------

// The crafted files are in the fuzz corpus, byte for byte (FSDP_UPDATE_CORPUS=1 writes them).
TEST(HardenPtCorpus, CraftedFilesAreInTheCorpus) {
    bool update = getenv("FSDP_UPDATE_CORPUS") && *getenv("FSDP_UPDATE_CORPUS") == '1';
    for (const Crafted &c : CRAFTED) {
        std::string path = std::string("tests/fuzz/corpus/") + c.harness + "/" + c.name, bytes = c.make();
        if (update) write_file(path, bytes);
        EXPECT_TRUE(read_file(path) == bytes) << path << " differs from what the test builds (FSDP_UPDATE_CORPUS=1)";
    }
}

// The pt harness runs every crafted file through the whole reader without a crash.
TEST(HardenPtCorpus, HarnessTakesTheCraftedFiles) {
    for (const Crafted &c : CRAFTED) {
        std::string bytes = c.make();
        EXPECT_EQ(fsdp_fuzz_pt((const uint8_t *)bytes.data(), bytes.size()), 0) << c.name;
    }
}

// The legacy format (PyTorch < 1.6) carries no checksums: --verify says so instead of claiming a CRC
// match it could not check.
TEST(HardenPtCrc, LegacyFormatHasNothingToVerify) {
    std::string fx = fixtures_dir() + "/torch-2.11/everyday/legacy_format.pt", out;
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt inspect --verify " + fx, &out), 0) << out;
    EXPECT_TRUE(has(out, "verified: nothing to check (this torch.save file is of the legacy format")) << out;
    EXPECT_FALSE(has(out, "CRC-32 of all")) << out;
}
