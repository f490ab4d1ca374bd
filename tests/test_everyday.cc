// Issue 17, items 1, 2 and 5: the everyday PyTorch files of ../shared/fixtures/torch-2.11/everyday/
// read through the reader API, into a state (sio_load) and by `fsdp-run ckpt inspect/convert/diff`,
// each tensor compared bit for bit with expected_*.safetensors; globals outside the allow-list
// refused by every entry point; the ckpt tools' selections, name layouts and non-tensor entries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "fuzz/fuzz.h"
#include "test_util.h"

extern "C" {
#include "ckpt/dcp.h"
#include "ckpt/pickle.h"
#include "ckpt/reader.h"
#include "ckpt/state_io.h"
#include "ckpt/torchsave.h"
#include "runtime/state.h"
}

using namespace fsdp_test;

namespace {

std::string everyday(const std::string &name) { return fixtures_dir() + "/torch-2.11/everyday/" + name; }
bool has(const std::string &s, const std::string &sub) { return s.find(sub) != std::string::npos; }

struct Reader {
    ckpt_reader *r = nullptr;
    std::string err;
    explicit Reader(const std::string &p) {
        fsdp_err e;
        if (ckpt_open(p.c_str(), CKPT_AUTO, &r, &e)) err = e.msg, r = nullptr;
    }
    ~Reader() {
        if (r) ckpt_close(r);
    }
    // the whole tensor as raw f32 bits (the fixtures are f32): exact comparison
    std::vector<float> f32(const std::string &name) const {
        long i = ckpt_find(r, name.c_str());
        EXPECT_GE(i, 0) << name;
        if (i < 0) return {};
        const ckpt_entry *e = ckpt_entry_at(r, (size_t)i);
        EXPECT_TRUE(e->is_tensor) << name;
        std::vector<float> v((size_t)fsdp_numel(e->ndim, e->shape) + 1);
        fsdp_err err;
        EXPECT_EQ(ckpt_read_rows(r, (size_t)i, 0, e->ndim ? e->shape[0] : 1, v.data(), FSDP_DT_F32, &err), 0) << err.msg;
        v.pop_back();
        return v;
    }
    std::string value(const std::string &name) const {
        long i = ckpt_find(r, name.c_str());
        if (i < 0) return "(absent)";
        const char *t = nullptr;
        fsdp_err err;
        if (ckpt_value(r, (size_t)i, &t, &err)) return std::string("(error) ") + err.msg;
        return t;
    }
};

void expect_bits(const std::vector<float> &a, const std::vector<float> &b, const std::string &what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    EXPECT_EQ(memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

const char *const PARAMS[] = {"emb.weight", "lin.weight", "lin.bias", "norm.weight", "norm.bias"};

// every tensor of expected_state_dict.safetensors in r under prefix (scale only where the file has buffers)
void expect_state_dict(const Reader &r, const std::string &prefix, bool buffers, const std::string &what) {
    ASSERT_TRUE(r.r) << what << ": " << r.err;
    Reader want(everyday("expected_state_dict.safetensors"));
    ASSERT_TRUE(want.r) << want.err;
    for (size_t i = 0; i < ckpt_count(want.r); i++) {
        std::string n = ckpt_entry_at(want.r, i)->name;
        if (n == "scale" && !buffers) {
            EXPECT_LT(ckpt_find(r.r, (prefix + n).c_str()), 0) << what;
            continue;
        }
        expect_bits(r.f32(prefix + n), want.f32(n), what + ": " + prefix + n);
    }
}

}  // namespace

// ---- item 1: torch.save files as people save them (reader API) ----------------------------

TEST(EverydayPt, StateDictsOfEveryKindReadExactly) {
    // before: state_dict.pt failed with "pickle: BUILD on a value that is not an object",
    // keep_vars / named_parameters with _rebuild_parameter not allowed
    expect_state_dict(Reader(everyday("state_dict.pt")), "", true, "state_dict.pt");
    expect_state_dict(Reader(everyday("keep_vars.pt")), "", true, "keep_vars.pt");
    expect_state_dict(Reader(everyday("named_parameters.pt")), "", false, "named_parameters.pt");
    expect_state_dict(Reader(everyday("train_ckpt.pt")), "model.", true, "train_ckpt.pt");
}

TEST(EverydayPt, TrainingCheckpointOptimizerStateIsNamedAfterTheParameters) {
    Reader r(everyday("train_ckpt.pt"));
    ASSERT_TRUE(r.r) << r.err;
    for (int i = 0; i < 5; i++) {
        Reader want(everyday("expected_optim_state_" + std::to_string(i) + ".safetensors"));
        ASSERT_TRUE(want.r) << want.err;
        std::string p = std::string("optimizer.state.") + PARAMS[i] + ".";
        expect_bits(r.f32(p + "exp_avg"), want.f32("exp_avg"), p + "exp_avg");
        expect_bits(r.f32(p + "exp_avg_sq"), want.f32("exp_avg_sq"), p + "exp_avg_sq");
        EXPECT_EQ(r.f32(p + "step"), std::vector<float>{1.0f}) << p;
        std::string g = std::string("optimizer.param_groups.") + PARAMS[i] + ".";
        EXPECT_EQ(r.value(g + "lr"), "0.001");
        EXPECT_EQ(r.value(g + "weight_decay"), "0.01");
        EXPECT_EQ(r.value(g + "amsgrad"), "False");
        EXPECT_EQ(r.value(g + "decoupled_weight_decay"), "True");
        EXPECT_EQ(r.value(g + "foreach"), "None");
    }
    // no integer ids left over
    EXPECT_LT(ckpt_find(r.r, "optimizer.state.0.exp_avg"), 0);
    EXPECT_EQ(r.value("epoch"), "3");
    EXPECT_EQ(r.value("note"), "'hi'");
}

TEST(EverydayPt, TensorsInListsAndTuplesAreIndexed) {
    Reader r(everyday("containers.pt"));
    ASSERT_TRUE(r.r) << r.err;
    ASSERT_EQ(ckpt_count(r.r), 3u);
    const char *names[] = {"lst.0", "lst.1", "tup.0"};
    const int64_t numel[] = {3, 4, 2};
    for (int i = 0; i < 3; i++) {
        long k = ckpt_find(r.r, names[i]);
        ASSERT_GE(k, 0) << names[i];
        EXPECT_EQ(fsdp_numel(ckpt_entry_at(r.r, (size_t)k)->ndim, ckpt_entry_at(r.r, (size_t)k)->shape), numel[i]);
        for (float x : r.f32(names[i])) EXPECT_TRUE(std::isfinite(x)) << names[i];
    }
}

// issue 26 item 21: the pre-1.6 format is read (before: refused, naming it and how to convert it)
TEST(EverydayPt, LegacyFormatReadsExactly) {
    expect_state_dict(Reader(everyday("legacy_format.pt")), "", true, "legacy_format.pt");
}

// ---- item 2: DCP variants -----------------------------------------------------------------

TEST(EverydayDcp, VariantsReadExactly) {
    expect_state_dict(Reader(everyday("dcp_tutorial_layout")), "model.", true, "dcp_tutorial_layout");
    expect_state_dict(Reader(everyday("dcp_tensor_step_and_bytes")), "model.", true, "dcp_tensor_step_and_bytes");
    // before: the safetensors-serialized .distcp pieces were read as zip archives and refused
    expect_state_dict(Reader(everyday("dcp_safetensors_serialization")), "", true, "dcp_safetensors_serialization");
}

TEST(EverydayDcp, BytesKeepEveryByteAndATensorStepIsAStep) {
    Reader r(everyday("dcp_tensor_step_and_bytes"));
    ASSERT_TRUE(r.r) << r.err;
    EXPECT_TRUE(has(r.value("dl"), "b'ab\\x00cd\\xff'")) << r.value("dl");
    long s = ckpt_find(r.r, "train_state.step");
    ASSERT_GE(s, 0);
    int64_t step = 0;
    fsdp_err err;
    ASSERT_EQ(ckpt_read_rows(r.r, (size_t)s, 0, 1, &step, FSDP_DT_I64, &err), 0) << err.msg;
    EXPECT_EQ(step, 7);
    // a re-save keeps the item's pickle byte for byte
    std::string t = make_tmpdir("every-bytes"), out;
    ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt convert " + everyday("dcp_tensor_step_and_bytes") + " " + t + "/d --to dcp",
                      &out), 0) << out;
    Reader c(t + "/d");
    ASSERT_TRUE(c.r) << c.err;
    void *a = nullptr, *b = nullptr;
    size_t la = 0, lb = 0;
    ASSERT_EQ(ckpt_value_pickle(r.r, (size_t)ckpt_find(r.r, "dl"), &a, &la, &err), 0) << err.msg;
    ASSERT_EQ(ckpt_value_pickle(c.r, (size_t)ckpt_find(c.r, "dl"), &b, &lb, &err), 0) << err.msg;
    EXPECT_EQ(std::string((char *)a, la), std::string((char *)b, lb));
    EXPECT_EQ(c.value("dl"), r.value("dl"));
    free(a);
    free(b);
    long cs = ckpt_find(c.r, "train_state.step");
    ASSERT_GE(cs, 0);
    step = 0;
    ASSERT_EQ(ckpt_read_rows(c.r, (size_t)cs, 0, 1, &step, FSDP_DT_I64, &err), 0) << err.msg;
    EXPECT_EQ(step, 7);
    rm_rf(t);
}

// ---- load-ckpt's reading: sio_load into a state declared here ------------------------------

namespace {

struct TinyState {
    fsdp_state &s;  // state_free frees the struct too
    TinyState(bool buffers) : s(*(fsdp_state *)calloc(1, sizeof(fsdp_state))) {
        s.layout = STATE_FULL;
        s.world = 1;
        fsdp_err err;
        struct {
            const char *n;
            int nd;
            int64_t sh[2];
        } p[] = {{"emb.weight", 2, {10, 4}}, {"lin.weight", 2, {3, 4}}, {"lin.bias", 1, {3}},
                 {"norm.weight", 1, {3}},    {"norm.bias", 1, {3}},     {"scale", 1, {2}}};
        for (auto &x : p)
            if (buffers || strcmp(x.n, "scale")) {
                EXPECT_EQ(state_add_param(&s, x.n, x.nd, x.sh, -1, &err), 0) << err.msg;
            }
    }
    ~TinyState() { state_free(&s); }
    std::vector<float> data(const char *n) {
        state_param *p = state_find(&s, n);
        EXPECT_NE(p, nullptr) << n;
        return p ? std::vector<float>(p->data, p->data + state_param_local_numel(p)) : std::vector<float>{};
    }
};

}  // namespace

TEST(EverydayLoad, StateDictsLoadIntoAStateStrictly) {
    Reader want(everyday("expected_state_dict.safetensors"));
    ASSERT_TRUE(want.r) << want.err;
    struct {
        const char *file, *strip;
        bool buffers;
    } cases[] = {{"state_dict.pt", nullptr, true},        {"keep_vars.pt", nullptr, true},
                 {"named_parameters.pt", nullptr, false}, {"train_ckpt.pt", "model.", true},
                 {"dcp_tutorial_layout", "model.", true}, {"dcp_tensor_step_and_bytes", "model.", true},
                 {"dcp_safetensors_serialization", nullptr, true}, {"legacy_format.pt", nullptr, true}};
    for (auto &c : cases) {
        TinyState st(c.buffers);
        sio_load_opts o;
        memset(&o, 0, sizeof o);
        o.strip_prefix = c.strip;
        o.strict = 1;
        o.load_optimizer = 0;
        sio_load_result res;
        fsdp_err err;
        ASSERT_EQ(sio_load(&st.s, everyday(c.file).c_str(), &o, &res, &err), 0) << c.file << ": " << err.msg;
        EXPECT_EQ(res.params_loaded, c.buffers ? 6u : 5u) << c.file;
        for (const char *n : PARAMS) expect_bits(st.data(n), want.f32(n), std::string(c.file) + ": " + n);
        if (c.buffers) expect_bits(st.data("scale"), want.f32("scale"), std::string(c.file) + ": scale");
        if (!strcmp(c.file, "dcp_tensor_step_and_bytes")) {
            EXPECT_EQ(st.s.train_step, 7) << "0-d tensor step restored";
        }
    }
}

// ---- the CLI on every file ------------------------------------------------------------------

TEST(EverydayCli, InspectAndConvertEveryFileWithTheExactValues) {
    std::string t = make_tmpdir("every-cli"), out, bin = fsdp_run_bin() + " ckpt ";
    struct {
        const char *file, *convert_args, *diff_args;
    } cases[] = {
        {"state_dict.pt", "", ""},
        {"keep_vars.pt", "", ""},
        {"named_parameters.pt", "", " --ignore scale"},
        {"train_ckpt.pt", " --keys 'model.**' --strip-prefix model.", ""},
        {"dcp_tutorial_layout", " --keys model. --strip-prefix model.", ""},
        {"dcp_tensor_step_and_bytes", " --exclude train_state.step,dl --strip-prefix model.", ""},
        {"dcp_safetensors_serialization", "", ""},
        {"legacy_format.pt", "", ""},
    };
    for (auto &c : cases) {
        std::string src = everyday(c.file);
        ASSERT_EQ(run_cmd(bin + "inspect " + src, &out), 0) << c.file << ": " << out;
        ASSERT_EQ(run_cmd(bin + "inspect --json " + src, &out), 0) << c.file << ": " << out;
        for (const char *to : {"x.safetensors", "x"}) {
            rm_rf(t + "/" + to);
            ASSERT_EQ(run_cmd(bin + "convert " + src + " " + t + "/" + to + c.convert_args, &out), 0) << c.file << out;
            EXPECT_EQ(run_cmd(bin + "diff " + t + "/" + to + " " + everyday("expected_state_dict.safetensors") +
                                  c.diff_args, &out), 0) << c.file << " -> " << to << ": " << out;
        }
    }
    // the optimizer moments of the classic checkpoint, by parameter name
    for (int i = 0; i < 5; i++) {
        std::string p = std::string("optimizer.state.") + PARAMS[i] + ".";
        ASSERT_EQ(run_cmd(bin + "convert " + everyday("train_ckpt.pt") + " " + t + "/o.safetensors --overwrite --keys " +
                              p + "exp_avg," + p + "exp_avg_sq --strip-prefix " + p, &out), 0) << out;
        EXPECT_EQ(run_cmd(bin + "diff " + t + "/o.safetensors " + everyday("expected_optim_state_" + std::to_string(i) +
                                                                           ".safetensors"), &out), 0) << p << out;
    }
    rm_rf(t);
}

// ---- item 5: the ckpt tools ------------------------------------------------------------------

TEST(EverydayTools, NamesHfOnATrainingCheckpointExportsTheModelKeysAndSaysSo) {
    // before: the first optimizer.* key failed the name map ("not a torchtitan parameter name")
    std::string t = make_tmpdir("every-names"), out, bin = fsdp_run_bin() + " ckpt ";
    ASSERT_EQ(run_cmd(bin + "convert " + tiny("dcp_full_ws3") + " " + t + "/hf.safetensors --names hf --n-heads 4 "
                                                                          "--n-kv-heads 2", &out), 0) << out;
    EXPECT_TRUE(has(out, "converted 21 tensors")) << out;
    EXPECT_TRUE(has(out, "--names hf exports the model keys: left out 148 training entries")) << out;
    // the export equals the reference HF-named tensors of the same run
    ASSERT_EQ(run_cmd(bin + "convert " + tiny("dcp_full_ws3") + " " + t + "/tt.safetensors --exclude "
                                                                      "'optimizer.**,train_state.**'", &out), 0) << out;
    EXPECT_EQ(run_cmd(bin + "diff " + t + "/tt.safetensors " + t + "/hf.safetensors --names hf --n-heads 4 "
                                                                   "--n-kv-heads 2", &out), 0) << out;
    // diff across layouts without the head counts is an error naming the tensor, not a difference
    EXPECT_EQ(run_cmd(bin + "diff " + t + "/tt.safetensors " + t + "/hf.safetensors --names hf", &out), 1);
    EXPECT_TRUE(has(out, "layers.0.attention.w") && has(out, ".weight needs the q/k row permutation")) << out;
    // a training checkpoint diffed against its export: the training entries are counted, not "only in"
    EXPECT_EQ(run_cmd(bin + "diff " + tiny("dcp_full_ws3") + " " + t + "/hf.safetensors --names hf --n-heads 4 "
                                                                        "--n-kv-heads 2", &out), 0) << out;
    EXPECT_TRUE(has(out, "148 of " + tiny("dcp_full_ws3"))) << out;
    rm_rf(t);
}

TEST(EverydayTools, KeysAndExcludeTakeSeveralGlobs) {
    // before: --keys took one prefix and --exclude did not exist (exit 2)
    std::string t = make_tmpdir("every-keys"), out, bin = fsdp_run_bin() + " ckpt ";
    ASSERT_EQ(run_cmd(bin + "convert " + everyday("train_ckpt.pt") + " " + t + "/a.safetensors --keys 'model.**' "
                                                                              "--keys 'optimizer.state.*.weight.exp_avg' --exclude model.scale,model.norm",
                      &out), 0) << out;
    Reader r(t + "/a.safetensors");
    ASSERT_TRUE(r.r) << r.err;
    std::vector<std::string> names;
    for (size_t i = 0; i < ckpt_count(r.r); i++) names.push_back(ckpt_entry_at(r.r, i)->name);
    std::sort(names.begin(), names.end());
    // `*` stays within one component: the weights' exp_avg, not their exp_avg_sq or the biases'
    EXPECT_EQ(names, (std::vector<std::string>{"model.emb.weight", "model.lin.bias", "model.lin.weight",
                                               "optimizer.state.emb.weight.exp_avg", "optimizer.state.lin.weight.exp_avg",
                                               "optimizer.state.norm.weight.exp_avg"}));
    ASSERT_EQ(run_cmd(bin + "convert " + everyday("train_ckpt.pt") + " " + t + "/b.safetensors --keys "
                                                                              "'optimizer.state.**.exp_avg'", &out), 0) << out;
    Reader b(t + "/b.safetensors");
    ASSERT_TRUE(b.r) << b.err;
    EXPECT_EQ(ckpt_count(b.r), 5u);
    EXPECT_EQ(run_cmd(bin + "convert " + everyday("train_ckpt.pt") + " " + t + "/c.safetensors --keys a,,b", &out), 2);
    EXPECT_TRUE(has(out, "empty pattern")) << out;
    rm_rf(t);
}

TEST(EverydayTools, ConvertToDcpKeepsEveryNonTensorEntry) {
    // before: convert --to dcp wrote the tensors only (epoch, note, param_groups and bytes dropped)
    std::string t = make_tmpdir("every-keep"), out, bin = fsdp_run_bin() + " ckpt ";
    ASSERT_EQ(run_cmd(bin + "convert " + everyday("train_ckpt.pt") + " " + t + "/d --to dcp", &out), 0) << out;
    EXPECT_TRUE(has(out, "converted 21 tensors (0.0 MB) and 57 non-tensor entries")) << out;
    Reader src(everyday("train_ckpt.pt")), d(t + "/d");
    ASSERT_TRUE(d.r) << d.err;
    ASSERT_EQ(ckpt_count(d.r), ckpt_count(src.r));
    for (size_t i = 0; i < ckpt_count(src.r); i++) {
        const ckpt_entry *e = ckpt_entry_at(src.r, i);
        if (!e->is_tensor) {
            EXPECT_EQ(d.value(e->name), src.value(e->name)) << e->name;
        }
    }
    EXPECT_EQ(d.value("epoch"), "3");
    EXPECT_EQ(d.value("optimizer.param_groups.lin.bias.betas"), src.value("optimizer.param_groups.lin.bias.betas"));
    EXPECT_EQ(run_cmd(bin + "diff " + everyday("train_ckpt.pt") + " " + t + "/d", &out), 0) << out;
    // safetensors cannot hold them: said, not silent
    ASSERT_EQ(run_cmd(bin + "convert " + everyday("train_ckpt.pt") + " " + t + "/s.safetensors", &out), 0) << out;
    EXPECT_TRUE(has(out, "left out 57 non-tensor entries (safetensors holds tensors only)")) << out;
    rm_rf(t);
}

TEST(EverydayTools, DiffAcrossDtypesAndIgnoringKeys) {
    std::string t = make_tmpdir("every-diff"), out, bin = fsdp_run_bin() + " ckpt ";
    std::string sd = everyday("state_dict.pt");
    ASSERT_EQ(run_cmd(bin + "convert " + sd + " " + t + "/b.safetensors --dtype bf16", &out), 0) << out;
    EXPECT_EQ(run_cmd(bin + "diff " + t + "/b.safetensors " + sd, &out), 1);  // as stored: bf16 rounding differs
    EXPECT_TRUE(has(out, "emb.weight: max abs diff")) << out;
    EXPECT_EQ(run_cmd(bin + "diff " + t + "/b.safetensors " + sd + " --round", &out), 0) << out;
    EXPECT_TRUE(has(out, "emb.weight: dtype bf16 vs f32, compared rounded to bf16")) << out;
    EXPECT_EQ(run_cmd(bin + "diff " + t + "/b.safetensors " + sd + " --rtol 1e-2", &out), 0) << out;
    // --round does not hide a real difference
    ASSERT_EQ(run_cmd(bin + "convert " + everyday("train_ckpt.pt") + " " + t + "/m.safetensors --dtype bf16 "
                                                                            "--keys 'model.**' --strip-prefix model.", &out), 0) << out;
    EXPECT_EQ(run_cmd(bin + "diff " + t + "/m.safetensors " + sd + " --round", &out), 0) << out;
    EXPECT_EQ(run_cmd(bin + "diff " + t + "/b.safetensors " + everyday("expected_optim_state_0.safetensors") + " --round",
                      &out), 1);
    // --ignore: keys left out on both sides, several globs
    EXPECT_EQ(run_cmd(bin + "diff " + sd + " " + everyday("named_parameters.pt"), &out), 1);
    EXPECT_TRUE(has(out, "only in " + sd + ": scale")) << out;
    EXPECT_EQ(run_cmd(bin + "diff " + sd + " " + everyday("named_parameters.pt") + " --ignore scale", &out), 0) << out;
    EXPECT_EQ(run_cmd(bin + "diff " + everyday("train_ckpt.pt") + " " + everyday("dcp_tutorial_layout") +
                          " --ignore 'optimizer.**,optim.**' --ignore epoch,note", &out), 0) << out;
    rm_rf(t);
}

// ---- a pickle naming os.system: refused by every entry point --------------------------------

namespace {

std::string X(const std::string &v) {  // BINUNICODE
    std::string o = "X";
    for (int i = 0; i < 4; i++) o += (char)((v.size() >> (8 * i)) & 0xff);
    return o + v;
}

// {"x": os.system("echo pwned")} as a whole pickle (protocol 2); posix.system by STACK_GLOBAL
std::string os_system_pickle(bool stack_global) {
    return std::string("\x80\x02}(", 4) + X("x") +
           (stack_global ? X("posix") + X("system") + "\x93" : std::string("cos\nsystem\n")) + X("echo pwned") +
           "\x85Ru.";
}

// an OrderedDict state dict whose BUILD state (_metadata) calls os.system
std::string build_state_os_system() {
    return std::string("\x80\x02", 2) + "ccollections\nOrderedDict\n)R}(" + X("_metadata") + "cos\nsystem\n" + X("id") +
           "\x85Rub.";
}

std::string pt_of(const std::string &pkl) {
    FILE *f = tmpfile();
    uint64_t len = 0;
    fsdp_err err;
    EXPECT_EQ(ts_write_value(f, pkl.data(), pkl.size(), &len, &err), 0) << err.msg;
    std::string out(len, '\0');
    rewind(f);
    EXPECT_EQ(fread(&out[0], 1, len, f), len);
    fclose(f);
    return out;
}

// a DCP directory: one tensor and a byte item whose pickle names os.system
void dcp_with_value(const std::string &dir, const std::string &pkl) {
    dcp_file_writer w;
    memset(&w, 0, sizeof w);
    dcp_record rec[2];
    fsdp_err err;
    float x[2] = {1, 2};
    int64_t shape[1] = {2}, zero[1] = {0};
    ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
    ASSERT_EQ(dcp_file_open(&w, dir.c_str(), 0, &err), 0) << err.msg;
    ASSERT_EQ(dcp_file_add_tensor(&w, "w", FSDP_DT_F32, 1, shape, zero, shape, x, &rec[0], &err), 0) << err.msg;
    ASSERT_EQ(dcp_file_add_pickle(&w, "train_state.step", pkl.data(), pkl.size(), &rec[1], &err), 0) << err.msg;
    ASSERT_EQ(dcp_file_close(&w, &err), 0) << err.msg;
    ASSERT_EQ(dcp_write_metadata(dir.c_str(), rec, 2, &err), 0) << err.msg;
}

}  // namespace

TEST(EverydayGlobals, OsSystemIsRefusedByEveryEntryPoint) {
    std::string t = make_tmpdir("every-glob"), out, bin = fsdp_run_bin() + " ckpt ";
    const std::string named = "global os.system is not allowed";
    // a .pt: the reader API, sio_load (load-ckpt's reading), and every ckpt command
    for (const std::string &pkl : {os_system_pickle(false), build_state_os_system()}) {
        std::string p = t + "/x.pt";
        write_file(p, pt_of(pkl));
        Reader r(p);
        EXPECT_EQ(r.r, nullptr);
        EXPECT_TRUE(has(r.err, named) && has(r.err, p)) << r.err;
        TinyState st(true);
        sio_load_opts o;
        memset(&o, 0, sizeof o);
        sio_load_result res;
        fsdp_err err;
        EXPECT_NE(sio_load(&st.s, p.c_str(), &o, &res, &err), 0);
        EXPECT_TRUE(has(err.msg, named)) << err.msg;
        for (std::string cmd : {"inspect " + p, "diff " + p + " " + p, "convert " + p + " " + t + "/o --to dcp"}) {
            EXPECT_EQ(run_cmd(bin + cmd, &out), 1) << cmd;
            EXPECT_TRUE(has(out, named)) << cmd << ": " << out;
        }
    }
    {
        std::string p = t + "/y.pt";
        write_file(p, pt_of(os_system_pickle(true)));
        Reader r(p);
        EXPECT_TRUE(has(r.err, "global posix.system is not allowed")) << r.err;
    }
    // a DCP .metadata that is such a pickle
    system(("mkdir -p " + t + "/meta").c_str());
    write_file(t + "/meta/.metadata", os_system_pickle(false));
    {
        Reader r(t + "/meta");
        EXPECT_EQ(r.r, nullptr);
        EXPECT_TRUE(has(r.err, named)) << r.err;
        EXPECT_EQ(run_cmd(bin + "inspect " + t + "/meta", &out), 1);
        EXPECT_TRUE(has(out, named)) << out;
    }
    // a DCP byte item: listed, refused when decoded: inspect, diff, convert, and load-ckpt's step
    dcp_with_value(t + "/item", os_system_pickle(false));
    for (std::string cmd : {"inspect " + t + "/item", "inspect --json " + t + "/item", "diff " + t + "/item " + t + "/item",
                            "convert " + t + "/item " + t + "/o2 --to dcp"}) {
        EXPECT_EQ(run_cmd(bin + cmd, &out), 1) << cmd << ": " << out;
        EXPECT_TRUE(has(out, named)) << cmd << ": " << out;
        EXPECT_TRUE(has(out, "train_state.step")) << cmd << ": " << out;
    }
    {
        fsdp_state *s = (fsdp_state *)calloc(1, sizeof *s);
        s->layout = STATE_FULL;
        s->world = 1;
        fsdp_err err;
        int64_t shape[1] = {2};
        ASSERT_EQ(state_add_param(s, "w", 1, shape, -1, &err), 0) << err.msg;
        sio_load_opts o;
        memset(&o, 0, sizeof o);
        sio_load_result res;
        EXPECT_NE(sio_load(s, (t + "/item").c_str(), &o, &res, &err), 0);
        EXPECT_TRUE(has(err.msg, named)) << err.msg;
        state_free(s);
    }
    rm_rf(t);
}

// The refused globals are kept in the fuzz corpus (tests/fuzz/corpus/pt and pickle; replayed by
// test_fuzz_replay.cc); FSDP_UPDATE_CORPUS=1 writes them.
TEST(EverydayGlobals, FuzzCorpusKeepsTheRefusedGlobals) {
    struct {
        const char *dir, *name;
        std::string bytes;
    } files[] = {
        {"pt", "i17-build-state-os-system.pt", pt_of(build_state_os_system())},
        {"pt", "i17-stack-global-posix-system.pt", pt_of(os_system_pickle(true))},
        {"pickle", "i17-build-state-os-system.pkl", build_state_os_system()},
        {"pickle", "i17-stack-global-posix-system.pkl", os_system_pickle(true)},
    };
    bool update = getenv("FSDP_UPDATE_CORPUS") && !strcmp(getenv("FSDP_UPDATE_CORPUS"), "1");
    for (auto &f : files) {
        std::string p = std::string("tests/fuzz/corpus/") + f.dir + "/" + f.name;
        if (update) write_file(p, f.bytes);
        EXPECT_EQ(read_file(p), f.bytes) << p << " (FSDP_UPDATE_CORPUS=1 rewrites it)";
        const uint8_t *d = (const uint8_t *)f.bytes.data();
        EXPECT_EQ(!strcmp(f.dir, "pt") ? fsdp_fuzz_pt(d, f.bytes.size()) : fsdp_fuzz_pickle(d, f.bytes.size()), 0);
    }
}

// ---- load-ckpt recipes on the everyday files (a model declared `from:` the file itself) ----------

namespace {

// `fsdp-run RECIPE` with recipe text; exit code, output in *out
int run_recipe(const std::string &dir, const std::string &yaml, std::string *out) {
    write_file(dir + "/r.yaml", yaml);
    return run_cmd(fsdp_run_bin() + " " + dir + "/r.yaml", out);
}

// model from the file (under the prefix its parameters have), strict load-ckpt, save-safetensors, save-dcp
std::string load_recipe(const std::string &src, const char *prefix, const std::string &dir, const char *load_opt) {
    return "model: {from: \"" + src + "\"" + (prefix ? std::string(", strip_prefix: ") + prefix : "") +
           "}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: \"" + src + "\", load_optimizer: " + load_opt +
           "}}\n  - {id: s, uses: save-safetensors, with: {path: \"" + dir + "/o.safetensors\"}}\n"
           "  - {id: d, uses: save-dcp, with: {path: \"" + dir + "/dcp\"}}\n";
}

}  // namespace

TEST(EverydayRecipe, ModelFromEachFileLoadsStrictlyWithTheExactValues) {
    std::string t = make_tmpdir("every-recipe"), out;
    struct {
        const char *file, *prefix;
    } cases[] = {{"state_dict.pt", nullptr},       {"keep_vars.pt", nullptr},
                 {"named_parameters.pt", nullptr}, {"dcp_safetensors_serialization", nullptr},
                 {"train_ckpt.pt", "model."},      {"dcp_tutorial_layout", "model."},
                 {"dcp_tensor_step_and_bytes", "model."}, {"legacy_format.pt", nullptr}};
    for (auto &c : cases) {
        rm_rf(t + "/o.safetensors");
        rm_rf(t + "/dcp");
        ASSERT_EQ(run_recipe(t, load_recipe(everyday(c.file), c.prefix, t, "false"), &out), 0) << c.file << ": " << out;
        // named_parameters.pt has no buffer: its model has no `scale`
        EXPECT_EQ(run_cmd(fsdp_run_bin() + " ckpt diff " + t + "/o.safetensors " +
                              everyday("expected_state_dict.safetensors") +
                              (!strcmp(c.file, "named_parameters.pt") ? " --ignore scale" : ""), &out), 0)
            << c.file << ": " << out;
        Reader got(t + "/o.safetensors");
        expect_state_dict(got, "", strcmp(c.file, "named_parameters.pt") != 0, c.file);
    }
    rm_rf(t);
}

TEST(EverydayRecipe, TrainingCheckpointOptimizerStateIsKeptThroughSaveDcp) {
    // the table model cannot train (train-steps refuses a parameter table), but load-ckpt restores the
    // AdamW moments into its state and save-dcp writes them: they must be the checkpoint's own
    std::string t = make_tmpdir("every-optim"), out;
    ASSERT_EQ(run_recipe(t, load_recipe(everyday("train_ckpt.pt"), "model.", t, "true"), &out), 0) << out;
    Reader got(t + "/dcp");
    ASSERT_TRUE(got.r) << got.err;
    for (int i = 0; i < 5; i++) {
        Reader want(everyday("expected_optim_state_" + std::to_string(i) + ".safetensors"));
        for (const char *k : {"exp_avg", "exp_avg_sq"})
            expect_bits(got.f32(std::string("optimizer.state.") + PARAMS[i] + "." + k), want.f32(k),
                        std::string(PARAMS[i]) + "." + k);
        // and the hyper-parameters of its param group (lr 1e-3, weight_decay 0.01, betas (0.9, 0.999))
        EXPECT_EQ(got.value(std::string("optimizer.param_groups.") + PARAMS[i] + ".lr"), "0.001") << PARAMS[i];
        EXPECT_EQ(got.value(std::string("optimizer.param_groups.") + PARAMS[i] + ".weight_decay"), "0.01");
    }
    rm_rf(t);
}

TEST(EverydayRecipe, TensorStepIsRestored) {
    std::string t = make_tmpdir("every-step"), out;
    ASSERT_EQ(run_recipe(t, load_recipe(everyday("dcp_tensor_step_and_bytes"), "model.", t, "auto"), &out), 0) << out;
    EXPECT_TRUE(has(out, "(step 7)")) << out;
    Reader got(t + "/dcp");
    EXPECT_EQ(got.value("train_state.step"), "7");
    rm_rf(t);
}

TEST(EverydayRecipe, ForbiddenGlobalsFailTheRecipeNamingThem) {
    std::string t = make_tmpdir("every-refuse"), out;
    // a table declared inline, the file only loaded: load-ckpt fails with exit 1
    std::string inl = "model:\n  params: [{name: w, shape: [2]}]\nstages:\n  - {id: l, uses: load-ckpt, with: {path: \"";
    std::string p = t + "/x.pt";
    write_file(p, pt_of(os_system_pickle(false)));
    EXPECT_EQ(run_recipe(t, inl + p + "\"}}\n", &out), 1) << out;
    EXPECT_TRUE(has(out, "global os.system is not allowed")) << out;
    int rc = run_recipe(t, load_recipe(p, nullptr, t, "auto"), &out);
    EXPECT_TRUE(rc == 1 || rc == 2) << rc << out;
    EXPECT_TRUE(has(out, "global os.system is not allowed")) << out;
    rm_rf(t);
}
