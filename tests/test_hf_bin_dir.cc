// Issue 26 item 20: Hugging Face directories holding torch.save files instead of safetensors
// (pytorch_model.bin, or pytorch_model-0000N-of-0000M.bin with pytorch_model.bin.index.json) read
// as directories, as transformers reads them: `ckpt diff`, `load-ckpt names: hf` into a model
// `from_hf` the directory, the index's weight_map checked against the shards, every file opened
// beneath the directory. The .bin files are written here from the hf-5.24 fixture's tensors with
// the project's pickle and zip writers. Before: "not a DCP checkpoint ... nor a safetensors directory".
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "test_util.h"

extern "C" {
#include "ckpt/pickle.h"
#include "ckpt/reader.h"
#include "ckpt/torchsave.h"
#include "ckpt/zip.h"
}

using namespace fsdp_test;

namespace {

bool has(const std::string &s, const std::string &sub) { return s.find(sub) != std::string::npos; }

struct T {
    std::string name;
    fsdp_dtype dt;
    std::vector<int64_t> shape;
    std::string bytes;
};

// torch.save({name: tensor...}) (zip format, _rebuild_tensor_v2, contiguous)
void write_pt(const std::string &path, const std::vector<T> &ts) {
    pkl_w w;
    pkl_w_init(&w);
    pkl_w_proto(&w, 2);
    pkl_w_empty_dict(&w);
    pkl_w_mark(&w);
    for (size_t i = 0; i < ts.size(); i++) {
        const T &t = ts[i];
        int nd = (int)t.shape.size();
        std::vector<int64_t> stride(nd ? nd : 1, 1);
        for (int d = nd - 2; d >= 0; d--) stride[d] = stride[d + 1] * t.shape[d + 1];
        pkl_w_str(&w, t.name.c_str());
        pkl_w_global(&w, "torch._utils", "_rebuild_tensor_v2");
        pkl_w_mark(&w);
        pkl_w_mark(&w);
        pkl_w_str(&w, "storage");
        pkl_w_global(&w, "torch", ts_storage_class(t.dt));
        pkl_w_str(&w, std::to_string(i).c_str());
        pkl_w_str(&w, "cpu");
        pkl_w_int(&w, fsdp_numel(nd, t.shape.data()));
        pkl_w_tuple(&w);
        pkl_w_binpersid(&w);
        pkl_w_int(&w, 0);
        pkl_w_int_tuple(&w, t.shape.data(), nd);
        pkl_w_int_tuple(&w, stride.data(), nd);
        pkl_w_bool(&w, 0);
        pkl_w_global(&w, "collections", "OrderedDict");
        pkl_w_empty_tuple(&w);
        pkl_w_reduce(&w);
        pkl_w_tuple(&w);
        pkl_w_reduce(&w);
    }
    pkl_w_setitems(&w);
    pkl_w_stop(&w);
    FILE *f = fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    zip_writer z;
    fsdp_err err;
    uint64_t len;
    int rc = zip_writer_begin(&z, f, &err);
    if (!rc) rc = zip_writer_add(&z, "archive/data.pkl", w.buf, w.len, &err);
    for (size_t i = 0; !rc && i < ts.size(); i++)
        rc = zip_writer_add(&z, ("archive/data/" + std::to_string(i)).c_str(), ts[i].bytes.data(), ts[i].bytes.size(),
                            &err);
    if (!rc) rc = zip_writer_add(&z, "archive/version", "3\n", 2, &err);
    if (!rc) rc = zip_writer_finish(&z, &len, &err);
    zip_writer_free(&z);
    fclose(f);
    pkl_w_free(&w);
    ASSERT_EQ(rc, 0) << err.msg;
}

// Every tensor of the fixture's model.safetensors, as stored.
std::vector<T> fixture_tensors(const std::string &model) {
    ckpt_reader *r = nullptr;
    fsdp_err err;
    std::vector<T> out;
    EXPECT_EQ(ckpt_open(hf_fixture(model, "model.safetensors").c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    if (!r) return out;
    for (size_t i = 0; i < ckpt_count(r); i++) {
        const ckpt_entry *e = ckpt_entry_at(r, i);
        T t{e->name, e->dtype, std::vector<int64_t>(e->shape, e->shape + e->ndim), std::string(e->nbytes, '\0')};
        EXPECT_EQ(ckpt_read_rows(r, i, 0, e->ndim ? e->shape[0] : 1, &t.bytes[0], e->dtype, &err), 0) << err.msg;
        out.push_back(t);
    }
    ckpt_close(r);
    return out;
}

// DIR with config.json and the tensors in `shards` torch.save files (1: pytorch_model.bin)
void bin_dir(const std::string &dir, const std::string &model, int shards) {
    write_file(dir + "/config.json", read_file(hf_fixture(model, "config.json")));
    std::vector<T> ts = fixture_tensors(model);
    if (shards == 1) return write_pt(dir + "/pytorch_model.bin", ts);
    std::string wm;
    for (int s = 0; s < shards; s++) {
        char f[64];
        snprintf(f, sizeof f, "pytorch_model-%05d-of-%05d.bin", s + 1, shards);
        std::vector<T> part;
        for (size_t i = s; i < ts.size(); i += shards) {
            part.push_back(ts[i]);
            wm += std::string(wm.empty() ? "" : ", ") + "\"" + ts[i].name + "\": \"" + f + "\"";
        }
        write_pt(dir + "/" + f, part);
    }
    write_file(dir + "/pytorch_model.bin.index.json", "{\"metadata\": {}, \"weight_map\": {" + wm + "}}");
}

std::string open_error(const std::string &path) {
    ckpt_reader *r = nullptr;
    fsdp_err err;
    if (ckpt_open(path.c_str(), CKPT_AUTO, &r, &err)) return err.msg;
    ckpt_close(r);
    return "";
}

}  // namespace

TEST(HfBinDir, SingleAndShardedBinDirectoriesReadLikeTheSafetensorsOne) {
    std::string t = make_tmpdir("hf-bin"), out, bin = fsdp_run_bin() + " ckpt ";
    mkdir((t + "/one").c_str(), 0755);
    mkdir((t + "/three").c_str(), 0755);
    bin_dir(t + "/one", "llama32_tiny", 1);
    bin_dir(t + "/three", "llama32_tiny", 3);
    for (const std::string &p : {t + "/one", t + "/three", t + "/three/pytorch_model.bin.index.json"}) {
        EXPECT_EQ(run_cmd(bin + "diff " + p + " " + hf_fixture("llama32_tiny"), &out), 0) << p << ": " << out;
        EXPECT_EQ(run_cmd(bin + "inspect --verify " + p, &out), 0) << p << ": " << out;
    }
    // a model from_hf the directory, loaded with names: hf, equals one loaded from the fixture
    for (const std::string &src : {t + "/three", hf_fixture("llama32_tiny")}) {
        std::string o = t + (src == t + "/three" ? "/a.safetensors" : "/b.safetensors");
        write_file(t + "/r.yaml", "runtime: {device: cpu}\nmodel: {from_hf: " + src + "}\nstages:\n"
                                  "  - {id: l, uses: load-ckpt, with: {path: " + src + ", names: hf}}\n"
                                  "  - {id: s, uses: save-safetensors, with: {path: " + o + "}}\n");
        ASSERT_EQ(run_cmd(fsdp_run_bin() + " " + t + "/r.yaml", &out), 0) << out;
    }
    EXPECT_EQ(run_cmd(bin + "diff " + t + "/a.safetensors " + t + "/b.safetensors", &out), 0) << out;
    // if_missing: init sees a checkpoint there (and loads it)
    write_file(t + "/r.yaml", "runtime: {device: cpu}\nmodel: {from_hf: " + t + "/one}\nstages:\n"
                              "  - {id: l, uses: load-ckpt, with: {path: " + t + "/one, names: hf, if_missing: init}}\n");
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " " + t + "/r.yaml", &out), 0) << out;
    EXPECT_FALSE(has(out, "no checkpoint at")) << out;
    EXPECT_TRUE(has(out, "loaded ")) << out;
    rm_rf(t);
}

TEST(HfBinDir, WeightMapAndSymlinksAreChecked) {
    std::string t = make_tmpdir("hf-bin"), d = t + "/d";
    mkdir(d.c_str(), 0755);
    std::vector<T> a = {{"a", FSDP_DT_F32, {2}, std::string(8, '\1')}}, b = {{"b", FSDP_DT_F32, {1}, std::string(4, '\2')}};
    write_pt(d + "/s1.bin", a);
    write_pt(d + "/s2.bin", b);
    std::string idx = d + "/pytorch_model.bin.index.json";
    write_file(idx, "{\"weight_map\": {\"a\": \"s1.bin\", \"b\": \"s2.bin\"}}");
    EXPECT_EQ(open_error(d), "");
    // only the files the weight_map names are read (as transformers does); in those, every tensor listed
    write_file(idx, "{\"weight_map\": {\"b\": \"s2.bin\"}}");
    EXPECT_EQ(open_error(d), "");
    write_file(idx, "{\"weight_map\": {\"a\": \"s1.bin\", \"b\": \"s2.bin\", \"c\": \"s1.bin\"}}");
    EXPECT_TRUE(has(open_error(d), "weight_map lists tensor 'c' in s1.bin, which has no such tensor")) << open_error(d);
    write_file(idx, "{\"weight_map\": {\"a\": \"s2.bin\", \"b\": \"s1.bin\"}}");
    EXPECT_TRUE(has(open_error(d), idx + ": weight_map puts tensor 'a' in s2.bin but it is in s1.bin")) << open_error(d);
    write_pt(d + "/s3.bin", {a[0], {"z", FSDP_DT_F32, {1}, std::string(4, '\3')}});
    write_file(idx, "{\"weight_map\": {\"a\": \"s3.bin\"}}");
    EXPECT_TRUE(has(open_error(d), "shard s3.bin holds tensor 'z' that the weight_map does not list")) << open_error(d);
    write_file(idx, "{\"weight_map\": {\"a\": \"s1.bin\", \"b\": \"s3.bin\", \"z\": \"s3.bin\"}}");
    EXPECT_TRUE(has(open_error(d), "weight_map puts tensor 'a' in s1.bin but it is in s3.bin") ||
                has(open_error(d), "tensor 'a' is in two shards (s1.bin and s3.bin)")) << open_error(d);
    write_file(idx, "{\"weight_map\": {\"a\": \"../s1.bin\"}}");
    EXPECT_TRUE(has(open_error(d), "must be a file name inside the index's directory")) << open_error(d);
    // a shard that is a symlink out of the directory is refused
    write_pt(t + "/outside.bin", b);
    unlink((d + "/s2.bin").c_str());
    ASSERT_EQ(symlink((t + "/outside.bin").c_str(), (d + "/s2.bin").c_str()), 0);
    write_file(idx, "{\"weight_map\": {\"a\": \"s1.bin\", \"b\": \"s2.bin\"}}");
    EXPECT_TRUE(has(open_error(d), "s2.bin")) << open_error(d);
    EXPECT_TRUE(has(open_error(d), "outside.bin")) << open_error(d);
    // pytorch_model.bin alone, and as a symlink out of the directory
    std::string e = t + "/e";
    mkdir(e.c_str(), 0755);
    write_pt(e + "/pytorch_model.bin", a);
    EXPECT_EQ(open_error(e), "");
    unlink((e + "/pytorch_model.bin").c_str());
    ASSERT_EQ(symlink((t + "/outside.bin").c_str(), (e + "/pytorch_model.bin").c_str()), 0);
    EXPECT_NE(open_error(e), "");
    rm_rf(t);
}
