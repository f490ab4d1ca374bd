// Issue 26 item 21: torch.save files in the legacy format of PyTorch < 1.6
// (_use_new_zipfile_serialization=False) are read: five pickles (magic number, protocol version,
// system info, the state dict with its storages as persistent ids, the list of storage keys), then
// each storage as an 8-byte element count and its bytes. Files built here byte by byte (the
// project's pickle writer); every truncation of the PyTorch fixture and every corrupt count fails
// cleanly, naming the file (and the storage). Before: every legacy file was refused.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

extern "C" {
#include "ckpt/pickle.h"
#include "ckpt/reader.h"
}

using namespace fsdp_test;

namespace {

bool has(const std::string &s, const std::string &sub) { return s.find(sub) != std::string::npos; }

std::string bytes_of(pkl_w &w) {
    std::string b((const char *)w.buf, w.len);
    pkl_w_free(&w);
    return b;
}

// The four header pickles: magic number (LONG1 of 10 bytes), protocol 1001, system info.
std::string legacy_head() {
    std::string b("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 15);
    pkl_w w;
    pkl_w_init(&w);
    pkl_w_proto(&w, 2);
    pkl_w_int(&w, 1001);
    pkl_w_stop(&w);
    pkl_w_proto(&w, 2);
    pkl_w_empty_dict(&w);
    pkl_w_mark(&w);
    pkl_w_str(&w, "protocol_version");
    pkl_w_int(&w, 1001);
    pkl_w_str(&w, "little_endian");
    pkl_w_bool(&w, 1);
    pkl_w_setitems(&w);
    pkl_w_stop(&w);
    return b + bytes_of(w);
}

struct Tensor {
    const char *name, *cls, *key;
    int64_t storage_numel, offset;
    std::vector<int64_t> shape, stride;
};

// _rebuild_tensor_v2(persid(('storage', torch.<cls>, key, 'cpu', numel, None)), offset, shape, stride,
// False, OrderedDict())
void tensor(pkl_w *w, const Tensor &t) {
    pkl_w_global(w, "torch._utils", "_rebuild_tensor_v2");
    pkl_w_mark(w);
    pkl_w_mark(w);
    pkl_w_str(w, "storage");
    pkl_w_global(w, "torch", t.cls);
    pkl_w_str(w, t.key);
    pkl_w_str(w, "cpu");
    pkl_w_int(w, t.storage_numel);
    pkl_w_none(w);
    pkl_w_tuple(w);
    pkl_w_binpersid(w);
    pkl_w_int(w, t.offset);
    pkl_w_int_tuple(w, t.shape.data(), (int)t.shape.size());
    pkl_w_int_tuple(w, t.stride.data(), (int)t.stride.size());
    pkl_w_bool(w, 0);
    pkl_w_global(w, "collections", "OrderedDict");
    pkl_w_empty_tuple(w);
    pkl_w_reduce(w);
    pkl_w_tuple(w);
    pkl_w_reduce(w);
}

// {name: tensor...}, the key list, then the storages (key, element count, bytes) in that order
std::string legacy_file(const std::vector<Tensor> &ts, const std::vector<std::pair<std::string, std::string>> &data,
                        const std::vector<int64_t> &counts) {
    pkl_w w;
    pkl_w_init(&w);
    pkl_w_proto(&w, 2);
    pkl_w_empty_dict(&w);
    pkl_w_mark(&w);
    for (auto &t : ts) {
        pkl_w_str(&w, t.name);
        tensor(&w, t);
    }
    pkl_w_setitems(&w);
    pkl_w_stop(&w);
    pkl_w_proto(&w, 2);
    pkl_w_empty_list(&w);
    pkl_w_mark(&w);
    for (auto &d : data) pkl_w_str(&w, d.first.c_str());
    pkl_w_appends(&w);
    pkl_w_stop(&w);
    std::string b = legacy_head() + bytes_of(w);
    for (size_t i = 0; i < data.size(); i++) {
        for (int k = 0; k < 8; k++) b += (char)((uint64_t)counts[i] >> (8 * k));
        b += data[i].second;
    }
    return b;
}

std::string f32s(const std::vector<float> &v) { return std::string((const char *)v.data(), v.size() * 4); }
std::string i16s(const std::vector<int16_t> &v) { return std::string((const char *)v.data(), v.size() * 2); }

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

std::vector<double> read(ckpt_reader *r, const char *name) {
    long i = ckpt_find(r, name);
    EXPECT_GE(i, 0) << name;
    if (i < 0) return {};
    const ckpt_entry *e = ckpt_entry_at(r, (size_t)i);
    std::vector<double> v((size_t)fsdp_numel(e->ndim, e->shape));
    fsdp_err err;
    EXPECT_EQ(ckpt_read_rows(r, (size_t)i, 0, e->ndim ? e->shape[0] : 1, v.data(), FSDP_DT_F64, &err), 0) << err.msg;
    return v;
}

// as torch.save({"a": torch.tensor([1., 2., 3.]), "b": torch.arange(4, dtype=torch.int16).reshape(2, 2)[:, 1]},
// _use_new_zipfile_serialization=False) lays it out: the storages in the key list's order
std::string views_file() {
    return legacy_file({{"a", "FloatStorage", "94729216760800", 3, 0, {3}, {1}},
                        {"b", "ShortStorage", "94729215968288", 4, 1, {2}, {2}}},
                       {{"94729215968288", i16s({0, 1, 2, 3})}, {"94729216760800", f32s({1, 2, 3})}}, {4, 3});
}

}  // namespace

TEST(LegacyPt, BuiltFileReadsWithViewsAndDtypes) {
    std::string t = make_tmpdir("legacy-pt");
    write_file(t + "/v.pt", views_file());
    ckpt_reader *r = nullptr;
    fsdp_err err;
    ASSERT_EQ(ckpt_open((t + "/v.pt").c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    EXPECT_EQ(ckpt_entry_at(r, (size_t)ckpt_find(r, "b"))->dtype, FSDP_DT_I16);
    EXPECT_EQ(read(r, "a"), (std::vector<double>{1, 2, 3}));
    EXPECT_EQ(read(r, "b"), (std::vector<double>{1, 3}));
    size_t records = 0;
    EXPECT_EQ(ckpt_verify(r, &records, &err), 0) << err.msg;
    ckpt_close(r);
    rm_rf(t);
}

TEST(LegacyPt, CorruptCountsAndSizesAreClearErrors) {
    std::string t = make_tmpdir("legacy-pt"), p = t + "/c.pt";
    // a count that disagrees with the persistent id; one whose bytes pass the end of the file
    write_file(p, legacy_file({{"w", "FloatStorage", "0", 2, 0, {2}, {1}}}, {{"0", f32s({1, 2})}}, {3}));
    EXPECT_TRUE(has(open_error(p), p + ": corrupt: storage 0 holds 3 elements")) << open_error(p);
    write_file(p, legacy_file({{"w", "FloatStorage", "0", (int64_t)1 << 61, 0, {2}, {1}}}, {{"0", f32s({1, 2})}},
                              {(int64_t)1 << 61}));
    EXPECT_TRUE(has(open_error(p), p + ": truncated: storage 0 needs")) << open_error(p);
    // a tensor past its storage; a storage missing from the key list; a view of a storage
    write_file(p, legacy_file({{"w", "FloatStorage", "0", 2, 1, {2}, {1}}}, {{"0", f32s({1, 2})}}, {2}));
    EXPECT_TRUE(has(open_error(p), "reach element 2 of a 2-element storage")) << open_error(p);
    write_file(p, legacy_file({{"w", "FloatStorage", "0", 2, 0, {2}, {1}}, {"v", "FloatStorage", "1", 2, 0, {2}, {1}}},
                              {{"0", f32s({1, 2})}}, {2}));
    EXPECT_TRUE(has(open_error(p), "the list of storage keys does not name the 2 storages")) << open_error(p);
    // every truncation of the file fails, naming it
    std::string whole = views_file();
    for (size_t n = 0; n < whole.size(); n++) {
        write_file(p, whole.substr(0, n));
        std::string e = open_error(p);
        EXPECT_TRUE(has(e, p)) << n << ": " << e;
        if (n >= whole.size() - 36) { // in the storages (8 + 8 bytes of b, 8 + 12 of a)
            EXPECT_TRUE(has(e, "storage")) << n << ": " << e;
        }
    }
    rm_rf(t);
}

TEST(LegacyPt, FixtureTruncationsAndForbiddenGlobalsFailCleanly) {
    std::string fixture = read_file(fixtures_dir() + "/torch-2.11/everyday/legacy_format.pt");
    ASSERT_GT(fixture.size(), 1000u);
    std::string t = make_tmpdir("legacy-pt"), p = t + "/f.pt";
    for (size_t n = 16; n < fixture.size(); n += 7) {
        write_file(p, fixture.substr(0, n));
        EXPECT_TRUE(has(open_error(p), p)) << n << ": " << open_error(p);
    }
    // the allow-list holds in the state dict's pickle
    pkl_w w;
    pkl_w_init(&w);
    pkl_w_proto(&w, 2);
    pkl_w_global(&w, "os", "system");
    pkl_w_str(&w, "true");
    pkl_w_tuple_n(&w, 1);
    pkl_w_reduce(&w);
    pkl_w_stop(&w);
    pkl_w_proto(&w, 2);
    pkl_w_empty_list(&w);
    pkl_w_stop(&w);
    write_file(p, legacy_head() + bytes_of(w));
    EXPECT_TRUE(has(open_error(p), "global os.system is not allowed")) << open_error(p);
    rm_rf(t);
}
