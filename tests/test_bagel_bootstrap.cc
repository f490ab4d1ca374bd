// recipes/bagel_bootstrap.yaml against ../shared/fixtures/bagel-056b5fd (Bagel's own state_dict() built by
// its own code at 056b5fd, PR #240's save_checkpoint output, and HEAD's): every key, shape and dtype,
// every deterministic value bit for bit, every random value by its rule, on 1 and 3 ranks, for each of
// the three load paths (issue 24). No Python at test time.
#include <gtest/gtest.h>

#include <jansson.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "mot_inputs.h"
#include "test_util.h"

extern "C" {
#include "ckpt/pickle.h"
}

using namespace fsdp_test;

namespace {

std::string fix() { return fixtures_dir() + "/bagel-056b5fd"; }

bool has(const std::string &log, const std::string &s) { return log.find(s) != std::string::npos; }

struct Key {
    std::vector<int64_t> shape;
    std::string source;
};

// manifest.json (or manifest_tied.json): key -> shape and source, in state_dict() order
std::map<std::string, Key> manifest(const std::string &file = "manifest.json") {
    std::map<std::string, Key> out;
    json_error_t je;
    json_t *root = json_load_file((fix() + "/expected/" + file).c_str(), 0, &je);
    EXPECT_NE(root, nullptr) << je.text;
    if (!root) return out;
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(root, "keys"), k, v) {
        Key key;
        size_t i;
        json_t *d;
        json_array_foreach(json_object_get(v, "shape"), i, d) key.shape.push_back(json_integer_value(d));
        key.source = json_string_value(json_object_get(v, "source"));
        out[k] = key;
    }
    json_decref(root);
    return out;
}

std::vector<int64_t> shape_of(const ckpt_entry *e) { return std::vector<int64_t>(e->shape, e->shape + e->ndim); }

// The bound of a `random:` source (nn.Linear's U(-1/sqrt(fan_in), 1/sqrt(fan_in))).
double random_bound(const std::string &source) {
    size_t p = source.find("fan_in=");
    return p == std::string::npos ? 0 : 1 / std::sqrt(std::stod(source.substr(p + 7)));
}

struct Bagel {
    std::string dir;
    Bagel() : dir(make_tmpdir("fsdp-bagel")) {}
    ~Bagel() { rm_rf(dir); }
    std::string out(const std::string &n) const { return dir + "/" + n; }
    // the shipped recipe at the fixture's sizes (max_latent_size 4, vit_max_num_patch_per_side 5)
    int run(int np, const std::string &layout, const std::string &out, std::string *log, const std::string &extra = "",
            const std::string &llm = "", const std::string &vit = "") const {
        std::string cmd = "timeout -k 10 180 " + (np > 0 ? mpirun_prefix(np) + " " : std::string()) + fsdp_run_bin() +
                          " recipes/bagel_bootstrap.yaml --set vars.llm=" + (llm.empty() ? fix() + "/sources/llm" : llm) +
                          " --set vars.vit=" + (vit.empty() ? fix() + "/sources/vit" : vit) + " --set vars.out=" + out +
                          " --set vars.layout=" + layout +
                          " --set vars.max_latent_size=4 --set vars.vit_max_num_patch_per_side=5 " + extra;
        return run_cmd(cmd, log);
    }
};

// Every one of the 139 keys in `prefix`+key of checkpoint r: shape and float32 as the manifest says, the
// deterministic ones bit for bit equal to Bagel's own state_dict(), the random ones by their rule.
void expect_bagel_state(ckpt_reader *r, const std::string &prefix, const std::map<std::string, Key> &man,
                        const std::string &what, bool tied = false) {
    Reader ref(fix() + "/expected/bagel_model.safetensors");
    ASSERT_NE(ref.r, nullptr);
    size_t random = 0, exact = 0;
    for (const auto &kv : man) {
        const std::string &k = kv.first, &src = kv.second.source;
        const ckpt_entry *e = nullptr;
        std::vector<float> got = read_tensor(r, prefix + k, &e);
        ASSERT_NE(e, nullptr) << what << ": " << prefix + k;
        EXPECT_EQ(shape_of(e), kv.second.shape) << what << ": " << k;
        EXPECT_EQ(e->dtype, FSDP_DT_F32) << what << ": " << k;
        if (tied && k == "language_model.lm_head.weight") {
            // transformers draws the head a tied source lacks from normal(0, initializer_range = 0.02)
            double s = 0, s2 = 0, mx = 0;
            for (float x : got) s += x, s2 += (double)x * x, mx = std::max(mx, (double)std::fabs(x));
            double n = (double)got.size(), mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
            EXPECT_NEAR(sd, 0.02, 0.0015) << what;
            EXPECT_LT(std::fabs(mean), 0.002) << what;
            EXPECT_LT(mx, 0.02 * 5.5) << what;
            EXPECT_NE(got, read_tensor(r, prefix + "language_model.model.embed_tokens.weight"))
                << what << ": never a copy of the embedding";
            random++;
            continue;
        }
        if (src.rfind("random:", 0) == 0) {
            double b = random_bound(src);
            ASSERT_GT(b, 0) << src;
            if (got.size() > 100) {
                expect_uniform(got, b, what + ": " + k);
            } else {
                double s2 = 0;
                for (float x : got) EXPECT_LE(std::fabs(x), b) << what << ": " << k;
                for (float x : got) s2 += (double)x * x;
                EXPECT_NEAR(std::sqrt(s2 / (double)got.size()), b / std::sqrt(3.0), 0.35 * b / std::sqrt(3.0))
                    << what << ": " << k;
            }
            random++;
            continue;
        }
        std::vector<float> want = read_tensor(ref.r, k);
        ASSERT_EQ(got.size(), want.size()) << k;
        EXPECT_EQ(0, memcmp(got.data(), want.data(), got.size() * sizeof(float))) << what << ": " << k << " (" << src << ")";
        exact++;
    }
    EXPECT_EQ(exact + random, 139u);
    EXPECT_EQ(random, tied ? 11u : 10u);
}

// The tensor keys of a checkpoint (and, separately, its non-tensor ones).
std::set<std::string> keys_of(ckpt_reader *r, bool tensors) {
    std::set<std::string> s;
    for (size_t i = 0; i < ckpt_count(r); i++)
        if (ckpt_entry_at(r, i)->is_tensor == (int)tensors) s.insert(ckpt_entry_at(r, i)->name);
    return s;
}

// Two parsed pickle values are the same Python value: same kinds (a float is not an int, a tuple not a
// list), same contents.
bool same_value(const pkl_obj *a, const pkl_obj *b, std::string *why) {
    if (a->kind != b->kind) return *why = "kinds " + std::to_string(a->kind) + " vs " + std::to_string(b->kind), false;
    switch (a->kind) {
    case PKL_BOOL:
    case PKL_INT: return a->i == b->i || (*why = "ints differ", false);
    case PKL_FLOAT: return a->f == b->f || (*why = "floats differ", false);
    case PKL_STR:
    case PKL_BYTES: return (a->len == b->len && !memcmp(a->s, b->s, a->len)) || (*why = "strings differ", false);
    case PKL_NONE: return true;
    case PKL_TUPLE:
    case PKL_LIST:
    case PKL_DICT: {
        size_t n = a->kind == PKL_DICT ? 2 * a->n : a->n;
        if (a->n != b->n) return *why = "lengths differ", false;
        for (size_t i = 0; i < n; i++)
            if (!same_value(a->items[i], b->items[i], why)) return false;
        return true;
    }
    default: return *why = "unexpected kind " + std::to_string(a->kind), false;
    }
}

void expect_same_value(ckpt_reader *ra, ckpt_reader *rb, const std::string &key) {
    long ia = ckpt_find(ra, key.c_str()), ib = ckpt_find(rb, key.c_str());
    ASSERT_GE(ia, 0) << key;
    ASSERT_GE(ib, 0) << key;
    void *pa = nullptr, *pb = nullptr;
    size_t la, lb;
    fsdp_err err;
    ASSERT_EQ(ckpt_value_pickle(ra, (size_t)ia, &pa, &la, &err), 0) << err.msg;
    ASSERT_EQ(ckpt_value_pickle(rb, (size_t)ib, &pb, &lb, &err), 0) << err.msg;
    pkl_doc *da = nullptr, *db = nullptr;
    const pkl_obj *oa, *ob;
    ASSERT_EQ(pkl_parse(pa, la, "ours", &da, &oa, &err), 0) << err.msg;
    ASSERT_EQ(pkl_parse(pb, lb, "fixture", &db, &ob, &err), 0) << err.msg;
    std::string why;
    EXPECT_TRUE(same_value(oa, ob, &why)) << key << ": " << why << " (ours " << ckpt_value_text(ra, (size_t)ia)
                                          << ", PyTorch's " << ckpt_value_text(rb, (size_t)ib) << ")";
    pkl_free(da);
    pkl_free(db);
    free(pa);
    free(pb);
}

}  // namespace

TEST(BagelBootstrap, PlainDcpHoldsBagelsStateDictOnOneAndThreeRanks) {
    Bagel b;
    std::string log;
    for (int np : {1, 3}) ASSERT_EQ(b.run(np, "dcp", b.out("d" + std::to_string(np)), &log), 0) << log;
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt diff " + b.out("d1") + " " + b.out("d3"), &log), 0) << log;
    EXPECT_TRUE(has(log, "equal")) << log;
    auto man = manifest();
    ASSERT_EQ(man.size(), 139u);
    Reader r(b.out("d3"));
    ASSERT_NE(r.r, nullptr);
    std::set<std::string> want;
    for (const auto &kv : man) want.insert(kv.first);
    EXPECT_EQ(keys_of(r.r, true), want) << "exactly the keys model.state_dict() names";
    expect_bagel_state(r.r, "", man, "dcp, 3 ranks");
}

TEST(BagelBootstrap, Pr240LayoutIsWhatSaveCheckpointWritesEntryForEntry) {
    Bagel b;
    std::string log;
    for (int np : {1, 3})
        ASSERT_EQ(b.run(np, "pr240", b.out("p" + std::to_string(np)), &log, "--set vars.with_optimizer=true"), 0) << log;
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt diff " + b.out("p1") + " " + b.out("p3"), &log), 0) << log;
    EXPECT_TRUE(has(log, "equal")) << log;
    // the entries of expected/pr240_step0_dcp_layout.json: tensors with their shapes and dtypes, the
    // optimizer's non-tensor entries with PyTorch's values
    json_error_t je;
    json_t *layout = json_load_file((fix() + "/expected/pr240_step0_dcp_layout.json").c_str(), 0, &je);
    ASSERT_NE(layout, nullptr) << je.text;
    Reader ours(b.out("p3")), torch(fix() + "/expected/pr240_step0_dcp");
    ASSERT_NE(ours.r, nullptr);
    ASSERT_NE(torch.r, nullptr);
    std::set<std::string> want_t, want_v;
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(layout, "entries"), k, v) {
        std::string type = json_string_value(json_object_get(v, "type"));
        if (type != "tensor") {
            want_v.insert(k);
            expect_same_value(ours.r, torch.r, k);
            continue;
        }
        want_t.insert(k);
        long i = ckpt_find(ours.r, k);
        ASSERT_GE(i, 0) << k;
        const ckpt_entry *e = ckpt_entry_at(ours.r, (size_t)i);
        std::vector<int64_t> shape;
        size_t j;
        json_t *d;
        json_array_foreach(json_object_get(v, "shape"), j, d) shape.push_back(json_integer_value(d));
        EXPECT_EQ(shape_of(e), shape) << k;
        EXPECT_STREQ(json_string_value(json_object_get(v, "dtype")), "float32") << k;
        EXPECT_EQ(e->dtype, FSDP_DT_F32) << k;
    }
    json_decref(layout);
    EXPECT_EQ(want_t.size() + want_v.size(), 291u);
    EXPECT_EQ(keys_of(ours.r, true), want_t);
    EXPECT_EQ(keys_of(ours.r, false), want_v) << "no other entry (no train_state.*: PR #240 writes none)";
    auto man = manifest();
    expect_bagel_state(ours.r, "model.", man, "pr240 model");
    expect_bagel_state(ours.r, "ema_model.", man, "pr240 ema_model");
    for (const auto &kv : man)
        EXPECT_EQ(read_tensor(ours.r, "model." + kv.first), read_tensor(ours.r, "ema_model." + kv.first)) << kv.first;
    // the EMA shares the model's records: the data files hold each value once
    size_t bytes = 0, state = 0;
    for (int rank = 0; rank < 3; rank++) {
        struct stat st;
        ASSERT_EQ(stat((b.out("p3") + "/__" + std::to_string(rank) + "_0.distcp").c_str(), &st), 0);
        bytes += (size_t)st.st_size;
    }
    for (const auto &kv : man) state += (size_t)numel_of(kv.second.shape) * 4;
    EXPECT_LT(bytes, state + state / 2) << "the EMA's bytes were written again";
    // metadata.pt beside it: {"train_step": 0}, as torch.save wrote it; scheduler.pt: the warmup's state
    for (const char *f : {"metadata.pt", "scheduler.pt"}) {
        Reader a(b.out("p3") + "/" + f), c(fix() + "/expected/pr240_step0_dcp/" + f);
        ASSERT_NE(a.r, nullptr) << f;
        EXPECT_EQ(keys_of(a.r, false), keys_of(c.r, false)) << f;
        for (const std::string &key : keys_of(c.r, false)) expect_same_value(a.r, c.r, key);
    }
    // without the optimizer: the same without its 13 entries (resume_model_only=True loads it)
    ASSERT_EQ(b.run(1, "pr240", b.out("m"), &log), 0) << log;
    Reader m(b.out("m"));
    EXPECT_EQ(keys_of(m.r, true), want_t);
    EXPECT_TRUE(keys_of(m.r, false).empty());
    EXPECT_TRUE(exists(b.out("m") + "/metadata.pt"));
}

TEST(BagelBootstrap, HeadLayoutWritesModelAndEmaSafetensorsOnOneAndThreeRanks) {
    Bagel b;
    std::string log;
    for (int np : {1, 3}) ASSERT_EQ(b.run(np, "head", b.out("h" + std::to_string(np)), &log), 0) << log;
    auto man = manifest();
    std::set<std::string> want;
    for (const auto &kv : man) want.insert(kv.first);
    for (const char *f : {"model.safetensors", "ema.safetensors"}) {
        ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt diff " + b.out("h1/") + f + " " + b.out("h3/") + f, &log), 0) << log;
        Reader r(b.out("h3/") + f);
        ASSERT_NE(r.r, nullptr) << f;
        EXPECT_EQ(keys_of(r.r, true), want) << f << ": every key, the pos_embed tables included (try_load_ckpt pops them)";
        expect_bagel_state(r.r, "", man, std::string("head ") + f);
    }
    EXPECT_EQ(read_file(b.out("h3/model.safetensors")), read_file(b.out("h3/ema.safetensors")));
}

TEST(BagelBootstrap, ATiedSourceGetsAFreshLmHead) {
    Bagel b;
    std::string log;
    ASSERT_EQ(b.run(3, "dcp", b.out("t"), &log, "", fix() + "/sources/llm_tied"), 0) << log;
    Reader r(b.out("t"));
    auto man = manifest("manifest_tied.json");
    ASSERT_EQ(man.size(), 139u);
    expect_bagel_state(r.r, "", man, "tied", true);
}

TEST(BagelBootstrap, AVitFileOrAVitWithoutItsPrefixGivesTheSameCheckpoint) {
    Bagel b;
    std::string log;
    ASSERT_EQ(b.run(1, "dcp", b.out("dir"), &log), 0) << log;
    ASSERT_EQ(b.run(2, "dcp", b.out("file"), &log, "", "", fix() + "/sources/vit/model.safetensors"), 0) << log;
    // transformers 5's save_pretrained / state_dict(): the same tensors without `vision_model.`
    Reader src(fix() + "/sources/vit/model.safetensors");
    std::vector<StTensor> bare;
    for (size_t i = 0; i < ckpt_count(src.r); i++) {
        const ckpt_entry *e = ckpt_entry_at(src.r, i);
        StTensor t{std::string(e->name).substr(strlen("vision_model.")), e->dtype, shape_of(e), read_tensor(src.r, e->name)};
        bare.push_back(t);
    }
    write_st(b.out("bare.safetensors"), bare);
    ASSERT_EQ(b.run(3, "dcp", b.out("bare"), &log, "", "", b.out("bare.safetensors")), 0) << log;
    for (const char *o : {"file", "bare"}) {
        ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt diff " + b.out("dir") + " " + b.out(o), &log), 0) << o << ": " << log;
        EXPECT_TRUE(has(log, "equal")) << log;
    }
}

TEST(BagelBootstrap, VisualGenAndVisualUndEachTurnOffTheirModules) {
    Bagel b;
    std::string log;
    ASSERT_EQ(b.run(1, "dcp", b.out("und"), &log, "--set vars.visual_gen=false"), 0) << log;
    ASSERT_EQ(b.run(1, "dcp", b.out("gen"), &log, "--set vars.visual_und=false --set vars.vit="), 0) << log;
    auto man = manifest();
    std::set<std::string> gen_only = {"time_embedder.mlp.0.weight", "time_embedder.mlp.0.bias", "time_embedder.mlp.2.weight",
                                      "time_embedder.mlp.2.bias",   "vae2llm.weight",           "vae2llm.bias",
                                      "llm2vae.weight",             "llm2vae.bias",             "latent_pos_embed.pos_embed"};
    std::set<std::string> und, gen;
    for (const auto &kv : man) {
        bool is_und = kv.first.rfind("vit_model.", 0) == 0 || kv.first.rfind("connector.", 0) == 0 ||
                      kv.first == "vit_pos_embed.pos_embed";
        if (!gen_only.count(kv.first)) und.insert(kv.first);
        if (!is_und) gen.insert(kv.first);
    }
    EXPECT_EQ(keys_of(Reader(b.out("und")).r, true), und);
    EXPECT_EQ(keys_of(Reader(b.out("gen")).r, true), gen);
}

TEST(BagelBootstrap, ValidationCatchesABagelUsersMistakesBeforeAnythingIsRead) {
    Bagel b;
    std::string log, llm = fix() + "/sources/llm", vit = fix() + "/sources/vit";
    auto check = [&](const std::string &sets) {
        return run_cmd("timeout -k 10 60 " + fsdp_run_bin() + " validate recipes/bagel_bootstrap.yaml --set vars.out=" +
                           b.out("o") + " " + sets, &log);
    };
    std::string good = " --set vars.max_latent_size=4 --set vars.vit_max_num_patch_per_side=5";
    ASSERT_EQ(check("--set vars.llm=" + llm + " --set vars.vit=" + vit + good), 0) << log;
    // no sources given: every missing one named at once
    EXPECT_EQ(check(good), 2) << log;
    EXPECT_TRUE(has(log, "vars.llm must be a Hugging Face Qwen2 directory (config.json and *.safetensors) (the path is "
                         "empty)")) << log;
    EXPECT_TRUE(has(log, "vars.vit must be a SigLIP vision tower: an HF directory or a safetensors file of its "
                         "state_dict() (the path is empty)")) << log;
    // the two sources swapped
    EXPECT_EQ(check("--set vars.llm=" + vit + " --set vars.vit=" + llm + good), 2) << log;
    EXPECT_TRUE(has(log, "vars.llm must be a Qwen2 / Qwen2.5 LLM")) << log;
    EXPECT_TRUE(has(log, "vars.vit holds no SigLIP encoder layer")) << log;
    // a safetensors file where the LLM's directory is expected
    EXPECT_EQ(check("--set vars.llm=" + llm + "/model.safetensors --set vars.vit=" + vit + good), 2) << log;
    EXPECT_TRUE(has(log, "vars.llm must be a Hugging Face Qwen2 directory")) << log;
    // an LLM directory without config.json
    ASSERT_EQ(run_cmd("mkdir -p " + b.out("noconf") + " && cp " + llm + "/model.safetensors " + b.out("noconf"), nullptr), 0);
    EXPECT_EQ(check("--set vars.llm=" + b.out("noconf") + " --set vars.vit=" + vit + good), 2) << log;
    EXPECT_TRUE(has(log, b.out("noconf") + "/config.json: No such file or directory")) << log;
    // an LLM that is not a Qwen2
    ASSERT_EQ(run_cmd("mkdir -p " + b.out("llama") + " && cp " + llm + "/model.safetensors " + b.out("llama") +
                          " && sed 's/\"qwen2\"/\"llama\"/' " + llm + "/config.json > " + b.out("llama/config.json"), nullptr), 0);
    EXPECT_EQ(check("--set vars.llm=" + b.out("llama") + " --set vars.vit=" + vit + good), 2) << log;
    EXPECT_TRUE(has(log, "has model_type = \"llama\"")) << log;
    // Bagel's default vit_max_num_patch_per_side (70) does not fit this ViT's 5x5 position table
    EXPECT_EQ(check("--set vars.llm=" + llm + " --set vars.vit=" + vit + " --set vars.max_latent_size=4"), 2) << log;
    EXPECT_TRUE(has(log, "the ViT's position table is smaller than vit_max_num_patch_per_side^2")) << log;
    EXPECT_TRUE(has(log, "vit_positions >= vit_side * vit_side: 25 >= 4900 is false")) << log;
    // a load path that is none of the three
    EXPECT_EQ(check("--set vars.llm=" + llm + " --set vars.vit=" + vit + good + " --set vars.layout=fsdp1"), 2) << log;
    EXPECT_TRUE(has(log, "vars.layout is 'fsdp1'")) << log;
    // an output that exists, without overwrite; with it, fine
    ASSERT_EQ(b.run(1, "dcp", b.out("o"), &log), 0) << log;
    EXPECT_EQ(check("--set vars.llm=" + llm + " --set vars.vit=" + vit + good + " --set vars.layout=dcp"), 2) << log;
    EXPECT_TRUE(has(log, b.out("o"))) << log;
    EXPECT_TRUE(has(log, "overwrite")) << log;
    EXPECT_EQ(check("--set vars.llm=" + llm + " --set vars.vit=" + vit + good + " --set vars.layout=dcp --set vars.overwrite=true"), 0)
        << log;
    EXPECT_EQ(b.run(1, "dcp", b.out("o"), &log), 2) << "the run refuses it too, before any stage: " << log;
}
