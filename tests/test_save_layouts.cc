// save-dcp's layouts of other trainers (Bagel PR #240's step-0 checkpoint: model.<key> and
// ema_model.<key>, a fresh AdamW's param group, metadata.pt beside .metadata): aliases that share
// the parameters' storage records, train_state: false, fresh_optimizer, files; the refusal of
// existing outputs before anything runs; save-safetensors' copies.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "mot_inputs.h"
#include "test_util.h"

extern "C" {
#include "ckpt/dcp.h"
#include "ckpt/pickle.h"
#include "ckpt/reader.h"
#include "ckpt/torchsave.h"
#include "ckpt/zip.h"
}

using namespace fsdp_test;

namespace {

const char *MODEL =
    "runtime: {device: cpu, seed: 3}\n"
    "model:\n  params:\n"
    "    - {name: \"layers.{0..1}.w\", shape: [5, 3], init: \"normal(0, 1)\"}\n"
    "    - {name: norm.weight, shape: [2], init: \"normal(1, 0.1)\"}\n"  // an empty shard on 3 ranks
    "    - {name: emb, shape: [7, 2], init: \"normal(0, 0.02)\", dtype: bf16}\n"
    "    - {name: scale, shape: [], init: ones}\n";                      // 0-d: rank 0's
const char *PARAMS[] = {"layers.0.w", "layers.1.w", "norm.weight", "emb", "scale"};

// Bagel PR #240's save_checkpoint at step 0, as save-dcp parameters
const char *PR240 =
    "prefix: \"model.\", aliases: [\"ema_model.\"], train_state: false, "
    "fresh_optimizer: {lr: 0.0, initial_lr: 1e-4, betas: [0.9, 0.95], eps: 1e-15, weight_decay: 0}, "
    "files: {metadata.pt: {train_step: 0}, scheduler.pt: {base_lrs: [1e-4], last_epoch: 0, _step_count: 1, "
    "_is_initial: false, _get_lr_called_within_step: false, _last_lr: [0.0], lr_lambdas: [{}]}}";

std::string fixture(const std::string &f) { return fixtures_dir() + "/bagel-056b5fd/expected/" + f; }

// `fsdp-run ARGS` on np ranks (mpirun when np > 1); the output and *rc.
std::string run(int np, const std::string &args, int *rc) {
    std::string out;
    *rc = run_cmd("timeout -k 10 300 " + (np > 1 ? mpirun_prefix(np) + " " : std::string()) + fsdp_run_bin() + " " + args,
                  &out);
    return out;
}

// A recipe of MODEL: init-meta, then a save-dcp to path with `with` added.
std::string save_recipe(const std::string &dir, const std::string &name, const std::string &path,
                        const std::string &with) {
    std::string p = dir + "/" + name;
    write_file(p, std::string(MODEL) + "stages:\n  - {id: i, uses: init-meta}\n"
                  "  - {id: s, uses: save-dcp, with: {path: " + path + (with.empty() ? "" : ", " + with) + "}}\n");
    return p;
}

void save(int np, const std::string &dir, const std::string &path, const std::string &with) {
    int rc;
    std::string out = run(np, save_recipe(dir, "save.yaml", path, with), &rc);
    ASSERT_EQ(rc, 0) << out;
}

struct Dcp {
    dcp_ckpt *c = nullptr;
    explicit Dcp(const std::string &dir) {
        fsdp_err err;
        EXPECT_EQ(dcp_open(dir.c_str(), &c, &err), 0) << dir << ": " << err.msg;
    }
    ~Dcp() { dcp_close(c); }
    const dcp_item *item(const std::string &k) const {
        long i = c ? dcp_find(c, k.c_str()) : -1;
        EXPECT_GE(i, 0) << k;
        return i >= 0 ? &c->items[i] : nullptr;
    }
    std::vector<std::string> keys() const {
        std::vector<std::string> v;
        for (size_t i = 0; c && i < c->n; i++) v.push_back(c->items[i].fqn);
        return v;
    }
};

long long file_size(const std::string &p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 ? (long long)st.st_size : -1;
}

// Two decoded pickle values are the same Python value of the same type ("" when they are, else where
// they differ).
std::string pkl_diff(const pkl_obj *a, const pkl_obj *b, const std::string &at = "value") {
    if (!a || !b) return at + ": missing";
    if (a->kind != b->kind) return at + ": kind " + std::to_string(a->kind) + " vs " + std::to_string(b->kind);
    switch (a->kind) {
    case PKL_NONE: return "";
    case PKL_BOOL:
    case PKL_INT: return a->i == b->i ? "" : at + ": " + std::to_string(a->i) + " vs " + std::to_string(b->i);
    case PKL_FLOAT: return memcmp(&a->f, &b->f, sizeof a->f) ? at + ": " + std::to_string(a->f) + " vs " +
                                                                   std::to_string(b->f)
                                                             : "";
    case PKL_STR:
    case PKL_BYTES: return a->len == b->len && !memcmp(a->s, b->s, a->len) ? "" : at + ": '" + a->s + "' vs '" + b->s + "'";
    case PKL_TUPLE:
    case PKL_LIST:
    case PKL_DICT: {
        if (a->n != b->n) return at + ": " + std::to_string(a->n) + " vs " + std::to_string(b->n) + " items";
        size_t m = a->kind == PKL_DICT ? 2 * a->n : a->n;
        for (size_t i = 0; i < m; i++) {
            std::string d = pkl_diff(a->items[i], b->items[i], at + "[" + std::to_string(i) + "]");
            if (!d.empty()) return d;
        }
        return "";
    }
    default: return at + ": unexpected kind " + std::to_string(a->kind);
    }
}

// data.pkl of a torch.save file, parsed (and the archive's record prefix).
struct SavedValue {
    std::string bytes, prefix;
    pkl_doc *doc = nullptr;
    const pkl_obj *root = nullptr;
    explicit SavedValue(const std::string &path) {
        bytes = read_file(path);
        zip_reader z;
        fsdp_err err;
        EXPECT_EQ(zip_open_mem(&z, bytes.data(), bytes.size(), path.c_str(), &err), 0) << path << ": " << err.msg;
        prefix = z.prefix;
        EXPECT_EQ(ts_load_pickle(&z, &doc, &root, &err), 0) << path << ": " << err.msg;
        zip_close(&z);
    }
    ~SavedValue() { pkl_free(doc); }
};

// A DCP byte item's value, decoded.
struct Item {
    pkl_doc *doc = nullptr;
    const pkl_obj *root = nullptr;
    Item(const Dcp &d, const std::string &k) {
        long i = d.c ? dcp_find(d.c, k.c_str()) : -1;
        EXPECT_GE(i, 0) << k;
        fsdp_err err;
        if (i >= 0) {
            EXPECT_EQ(dcp_read_value(d.c, (size_t)i, &doc, &root, &err), 0) << k << ": " << err.msg;
        }
    }
    ~Item() { pkl_free(doc); }
};

// planner_data of a .metadata: key -> its path, as text ("('model', 'a.b')").
std::map<std::string, std::string> planner_data(const std::string &dir) {
    std::map<std::string, std::string> m;
    std::string b = read_file(dir + "/.metadata");
    pkl_doc *doc;
    const pkl_obj *root;
    fsdp_err err;
    EXPECT_EQ(pkl_parse(b.data(), b.size(), dir.c_str(), &doc, &root, &err), 0) << err.msg;
    const pkl_obj *pd = pkl_dict_get(pkl_state(root), "planner_data");
    EXPECT_TRUE(pd && pd->kind == PKL_DICT) << dir;
    for (size_t i = 0; pd && i < pd->n; i++) {
        char *r = pkl_repr(pd->items[2 * i + 1]);
        m[pd->items[2 * i]->s] = r ? r : "?";
        free(r);
    }
    pkl_free(doc);
    return m;
}

TEST(SaveLayouts, AliasesShareTheParametersRecordsAndWriteNoByteTwice) {
    std::string t = make_tmpdir("save-layouts");
    save(1, t, t + "/plain", "prefix: \"model.\"");
    save(1, t, t + "/alias", "prefix: \"model.\", aliases: [\"ema_model.\", \"\"]");
    {
        Dcp d(t + "/alias");
        for (const char *p : PARAMS) {
            const dcp_item *m = d.item(std::string("model.") + p), *e = d.item(std::string("ema_model.") + p),
                           *top = d.item(p);
            ASSERT_TRUE(m && e && top) << p;
            ASSERT_EQ(m->n_chunks, e->n_chunks) << p;
            ASSERT_EQ(m->n_chunks, top->n_chunks) << p;
            for (size_t k = 0; k < m->n_chunks; k++)
                for (const dcp_item *a : {e, top}) {
                    EXPECT_STREQ(a->chunks[k].where.relative_path, m->chunks[k].where.relative_path) << a->fqn;
                    EXPECT_EQ(a->chunks[k].where.offset, m->chunks[k].where.offset) << a->fqn;
                    EXPECT_EQ(a->chunks[k].where.length, m->chunks[k].where.length) << a->fqn;
                }
        }
    }
    // the aliases add entries to .metadata, not a byte to the data file
    EXPECT_EQ(file_size(t + "/alias/__0_0.distcp"), file_size(t + "/plain/__0_0.distcp"));
    EXPECT_EQ(dcp_data_blanked(t + "/alias/__0_0.distcp"), dcp_data_blanked(t + "/plain/__0_0.distcp"));
    // dcp.save({"model": sd, "ema_model": sd2}) nests them so: ("model", "<key>") / ("ema_model", "<key>")
    std::map<std::string, std::string> pd = planner_data(t + "/alias");
    EXPECT_EQ(pd["model.layers.0.w"], "('model', 'layers.0.w')");
    EXPECT_EQ(pd["ema_model.layers.0.w"], "('ema_model', 'layers.0.w')");
    EXPECT_EQ(pd["layers.0.w"], "('layers.0.w',)");
    rm_rf(t);
}

TEST(SaveLayouts, EveryReaderReadsBothNamesWithEqualValues) {
    std::string t = make_tmpdir("save-layouts"), out;
    save(1, t, t + "/plain", "prefix: \"model.\"");
    save(1, t, t + "/ck", "prefix: \"model.\", aliases: [\"ema_model.\"]");
    int rc;
    // the ckpt reader, ckpt_entry.is_alias
    {
        Reader r(t + "/ck");
        for (const char *p : PARAMS) {
            const ckpt_entry *em = nullptr, *ee = nullptr;
            std::vector<float> m = read_tensor(r.r, std::string("model.") + p, &em),
                               e = read_tensor(r.r, std::string("ema_model.") + p, &ee);
            EXPECT_EQ(m, e) << p;
            ASSERT_TRUE(em && ee);
            EXPECT_FALSE(em->is_alias) << p;
            EXPECT_TRUE(ee->is_alias) << p;
            EXPECT_STREQ(ckpt_entry_at(r.r, ee->alias_of)->name, (std::string("model.") + p).c_str());
        }
    }
    // inspect --verify checks each stored record once: as many as the checkpoint without aliases
    std::string a = run(1, "ckpt inspect " + t + "/ck --verify", &rc), b = run(1, "ckpt inspect " + t + "/plain --verify", &rc);
    ASSERT_EQ(rc, 0) << b;
    size_t pa = a.find("verified: the CRC-32 of all "), pb = b.find("verified: the CRC-32 of all ");
    ASSERT_NE(pa, std::string::npos) << a;
    ASSERT_NE(pb, std::string::npos) << b;
    EXPECT_EQ(atoi(a.c_str() + pa + 28), atoi(b.c_str() + pb + 28)) << a << b;
    EXPECT_NE(a.find("(stored with model.layers.0.w)"), std::string::npos) << a;
    EXPECT_NE(a.find("stored tensor bytes: "), std::string::npos) << a;
    // load-ckpt under either prefix (explicit or detected), strict: the other names are the same tensors
    write_file(t + "/ref.yaml", std::string(MODEL) + "stages:\n  - {id: i, uses: init-meta}\n"
                                "  - {id: s, uses: save-safetensors, with: {path: " + t + "/ref.safetensors}}\n");
    out = run(1, t + "/ref.yaml", &rc);
    ASSERT_EQ(rc, 0) << out;
    for (std::string strip : {"model.", "ema_model.", ""}) {
        std::string o = t + "/l" + strip + "safetensors";
        write_file(t + "/l.yaml", std::string(MODEL) + "stages:\n  - {id: l, uses: load-ckpt, with: {path: " + t +
                                  "/ck" + (strip.empty() ? "" : ", strip_prefix: \"" + strip + "\"") +
                                  "}}\n  - {id: s, uses: save-safetensors, with: {path: " + o + "}}\n");
        out = run(strip == "ema_model." ? 2 : 1, t + "/l.yaml", &rc);
        ASSERT_EQ(rc, 0) << strip << ": " << out;
        out = run(1, "ckpt diff " + t + "/ref.safetensors " + o, &rc);
        EXPECT_EQ(rc, 0) << strip << ": " << out;
    }
    // convert to safetensors: both names, each with its values
    out = run(1, "ckpt convert " + t + "/ck " + t + "/c.safetensors --to safetensors", &rc);
    ASSERT_EQ(rc, 0) << out;
    {
        Reader c(t + "/c.safetensors"), r(t + "/ck");
        for (const char *p : PARAMS)
            for (const char *pre : {"model.", "ema_model."})
                EXPECT_EQ(read_tensor(c.r, std::string(pre) + p), read_tensor(r.r, std::string("model.") + p)) << pre << p;
    }
    // convert / reshard to 2 ranks: the aliases stay aliases, the bytes those 2 ranks' save-dcp writes
    save(2, t, t + "/ck2", "prefix: \"model.\", aliases: [\"ema_model.\"]");
    out = run(1, "ckpt convert " + t + "/ck " + t + "/cv2 --to dcp --world 2", &rc);
    ASSERT_EQ(rc, 0) << out;
    for (const char *f : {"__0_0.distcp", "__1_0.distcp"})
        EXPECT_EQ(dcp_data_blanked(t + "/cv2/" + f), dcp_data_blanked(t + "/ck2/" + f)) << f;
    {
        Reader r(t + "/cv2");
        const ckpt_entry *e = nullptr;
        read_tensor(r.r, "ema_model.layers.1.w", &e);
        ASSERT_TRUE(e);
        EXPECT_TRUE(e->is_alias);
    }
    out = run(1, "ckpt diff " + t + "/ck " + t + "/cv2", &rc);
    EXPECT_EQ(rc, 0) << out;
    write_file(t + "/rs.yaml", "stages:\n  - {id: r, uses: reshard-dcp, with: {src: " + t + "/ck, dst: " + t +
                               "/rs2, world: 2}}\n");
    out = run(2, t + "/rs.yaml", &rc);
    ASSERT_EQ(rc, 0) << out;
    for (const char *f : {"__0_0.distcp", "__1_0.distcp"})
        EXPECT_EQ(dcp_data_blanked(t + "/rs2/" + f), dcp_data_blanked(t + "/ck2/" + f)) << f;
    rm_rf(t);
}

TEST(SaveLayouts, OneAndThreeRanksGiveEqualCheckpoints) {
    std::string t = make_tmpdir("save-layouts"), out;
    save(1, t, t + "/one", PR240);
    save(3, t, t + "/three", PR240);
    int rc;
    out = run(1, "ckpt diff " + t + "/one " + t + "/three", &rc);
    EXPECT_EQ(rc, 0) << out;
    Dcp one(t + "/one"), three(t + "/three");
    EXPECT_EQ(one.keys(), three.keys());
    // on 3 ranks too each alias points at the records of its parameter's chunks (an empty shard's too)
    for (const char *p : PARAMS) {
        const dcp_item *m = three.item(std::string("model.") + p), *e = three.item(std::string("ema_model.") + p);
        ASSERT_TRUE(m && e);
        EXPECT_EQ(m->n_chunks, std::string(p) == "scale" ? 1u : 3u) << p;
        ASSERT_EQ(m->n_chunks, e->n_chunks);
        for (size_t k = 0; k < m->n_chunks; k++) {
            EXPECT_STREQ(e->chunks[k].where.relative_path, m->chunks[k].where.relative_path) << p;
            EXPECT_EQ(e->chunks[k].where.offset, m->chunks[k].where.offset) << p;
        }
    }
    EXPECT_EQ(read_file(t + "/one/metadata.pt"), read_file(t + "/three/metadata.pt"));
    // an async save writes the same files
    save(3, t, t + "/async", std::string(PR240) + ", async: true");
    for (const char *f : {"__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "metadata.pt", "scheduler.pt"})
        EXPECT_EQ(dcp_data_blanked(t + "/async/" + f), dcp_data_blanked(t + "/three/" + f)) << f;
    rm_rf(t);
}

TEST(SaveLayouts, KeyCollisionsAndBadAliasesAreRefusedBeforeAnythingIsWritten) {
    std::string t = make_tmpdir("save-layouts"), out;
    int rc;
    // an alias that gives a parameter's key to another: "a." + "w" is the parameter a.w
    write_file(t + "/c.yaml", "runtime: {device: cpu}\nmodel:\n  params:\n"
                              "    - {name: w, shape: [4], init: ones}\n    - {name: a.w, shape: [4], init: ones}\n"
                              "stages:\n  - {id: i, uses: init-meta}\n"
                              "  - {id: s, uses: save-dcp, with: {path: " + t + "/c, aliases: [\"a.\"]}}\n");
    out = run(1, t + "/c.yaml", &rc);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("two entries would be written under the key a.w: parameter a.w and parameter w under alias 'a.'"),
              std::string::npos)
        << out;
    EXPECT_FALSE(exists(t + "/c/.metadata"));
    EXPECT_FALSE(exists(t + "/c/__0_0.distcp"));
    // the fresh optimizer's namespace: no other key under its prefix
    out = run(1, save_recipe(t, "f.yaml", t + "/f", "aliases: [\"optimizer.\"], fresh_optimizer: {}"), &rc);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("fresh_optimizer: the key optimizer.layers.0.w (parameter layers.0.w under alias 'optimizer.') "
                       "lies under its prefix 'optimizer.'"),
              std::string::npos)
        << out;
    EXPECT_FALSE(exists(t + "/f/.metadata"));
    // what the schema cannot see, at validation, with the place of the value (the text `at` in `with`)
    struct {
        std::string with, at, want;
    } cases[] = {
        {"aliases: [ema_model]", "ema_model]", "save-dcp: aliases: 'ema_model' is not a key prefix"},
        {"prefix: \"model.\", aliases: [\"model.\"]", "\"model.\"]", "save-dcp: aliases: 'model.' is the parameters' prefix"},
        {"aliases: [\"e.\", \"e.\"]", "\"e.\"]", "save-dcp: aliases: 'e.' is listed twice"},
        {"fresh_optimizer: {betas: [0.9, 1.5]}", "1.5", "save-dcp: fresh_optimizer.betas: 1.5 is out of range"},
        {"fresh_optimizer: {lr: \"0.1\"}", "\"0.1\"", "save-dcp: fresh_optimizer.lr: expected a number"},
        {"fresh_optimizer: {momentum: 0.9}", "0.9", "save-dcp: fresh_optimizer: unknown key 'momentum'"},
        {"fresh_optimizer: {prefix: optim}", "optim}", "save-dcp: fresh_optimizer.prefix: expected"},
        {"files: {a/b.pt: 1}", "1}", "save-dcp: files: 'a/b.pt' is not a plain file name"},
        {"files: {.metadata: 1}", "1}", "save-dcp: files: '.metadata' starts with '.'"},
        {"files: {__0_0.distcp: 1}", "1}", "save-dcp: files: '__0_0.distcp' is a DCP data file name"},
        {"files: {__1.metadata: 1}", "1}", "save-dcp: files: '__1.metadata' is a DCP metadata file name"},
    };
    const std::string v = t + "/v", line = "  - {id: s, uses: save-dcp, with: {path: " + v + ", ";
    for (auto &c : cases) {
        out = run(1, "validate " + save_recipe(t, "save.yaml", v, c.with), &rc);
        EXPECT_EQ(rc, 2) << c.with << ": " << out;
        std::string where = "save.yaml:10:" + std::to_string(line.size() + c.with.rfind(c.at) + 1) + ": ";
        EXPECT_NE(out.find(where + c.want), std::string::npos) << c.with << ": " << out;
    }
    EXPECT_FALSE(exists(t + "/v"));
    rm_rf(t);
}

TEST(SaveLayouts, TrainStateFalseWritesNoTrainStateEntries) {
    std::string t = make_tmpdir("save-layouts");
    save(1, t, t + "/with", "");
    save(1, t, t + "/without", "train_state: false");
    Dcp w(t + "/with"), wo(t + "/without");
    for (const char *k : {"train_state.step", "train_state.ntokens_seen", "train_state.data_pos"}) {
        EXPECT_GE(dcp_find(w.c, k), 0) << k;
        EXPECT_LT(dcp_find(wo.c, k), 0) << k;
    }
    EXPECT_EQ(wo.keys().size(), std::size(PARAMS));
    rm_rf(t);
}

// PR #240's checkpoint of the fixture's model, made by save-dcp from bagel_model.safetensors.
std::string pr240_recipe(const std::string &t, const std::string &with = PR240) {
    write_file(t + "/pr240.yaml", "runtime: {device: cpu}\nmodel: {from: " + fixture("bagel_model.safetensors") +
                                      "}\nvars: {out: " + t + "/pr240}\nstages:\n"
                                      "  - {id: l, uses: load-ckpt, with: {path: " + fixture("bagel_model.safetensors") +
                                      "}}\n  - {id: s, uses: save-dcp, with: {path: \"${out}\", " + with + "}}\n");
    return t + "/pr240.yaml";
}

TEST(SaveLayouts, Pr240LayoutEqualsTheFixtureEntryByEntry) {
    std::string t = make_tmpdir("save-layouts"), out;
    int rc;
    out = run(3, pr240_recipe(t), &rc);
    ASSERT_EQ(rc, 0) << out;
    out = run(1, "ckpt diff " + t + "/pr240 " + fixture("pr240_step0_dcp"), &rc);
    EXPECT_EQ(rc, 0) << out;
    Dcp ours(t + "/pr240"), theirs(fixture("pr240_step0_dcp"));
    ASSERT_TRUE(ours.c && theirs.c);
    EXPECT_EQ(ours.c->n, 291u);
    // the 13 param group entries: the same Python type and value (weight_decay the int 0, lr the float 0.0,
    // betas a tuple, params [0..138])
    size_t fresh = 0;
    for (const std::string &k : theirs.keys()) {
        if (k.rfind("optimizer.", 0)) continue;
        fresh++;
        Item a(ours, k), b(theirs, k);
        EXPECT_EQ(pkl_diff(a.root, b.root, k), "");
    }
    EXPECT_EQ(fresh, 13u);
    Item params(ours, "optimizer.param_groups.0.params"), wd(ours, "optimizer.param_groups.0.weight_decay");
    ASSERT_TRUE(params.root && wd.root);
    EXPECT_EQ(params.root->kind, PKL_LIST);
    EXPECT_EQ(params.root->n, 139u);
    EXPECT_EQ(wd.root->kind, PKL_INT);
    // the .metadata nests every key as dcp.save({"model": .., "ema_model": .., "optimizer": ..}) does
    EXPECT_EQ(planner_data(t + "/pr240"), planner_data(fixture("pr240_step0_dcp")));
    // a float given as a float stays one; without the key, AdamW's default (the float 0.01)
    out = run(1, pr240_recipe(t, "overwrite: true, fresh_optimizer: {weight_decay: 0.0, lr: 1}"), &rc);
    ASSERT_EQ(rc, 0) << out;
    Dcp f(t + "/pr240");
    Item wd2(f, "optimizer.param_groups.0.weight_decay"), lr(f, "optimizer.param_groups.0.lr"),
        eps(f, "optimizer.param_groups.0.eps");
    ASSERT_TRUE(wd2.root && lr.root && eps.root);
    EXPECT_EQ(wd2.root->kind, PKL_FLOAT);
    EXPECT_EQ(lr.root->kind, PKL_INT);
    EXPECT_EQ(eps.root->kind, PKL_FLOAT);
    EXPECT_EQ(eps.root->f, 1e-8);
    EXPECT_LT(dcp_find(f.c, "optimizer.param_groups.0.initial_lr"), 0);
    EXPECT_GE(dcp_find(f.c, "train_state.step"), 0);
    rm_rf(t);
}

TEST(SaveLayouts, FreshOptimizerNeedsAStateWithoutOptimizerStateAtStepZero) {
    std::string t = make_tmpdir("save-layouts"), out;
    write_file(t + "/r.yaml", "model: {preset: tiny}\nruntime: {device: cpu}\n"
                              "data: {kind: synthetic, batch_size: 2, seq_len: 8}\nstages:\n"
                              "  - {id: i, uses: init-meta}\n  - {id: train, uses: train-steps, with: {steps: 1}}\n"
                              "  - {id: save, uses: save-dcp, with: {path: " + t + "/ck, optimizer: false, "
                              "fresh_optimizer: {}}}\n");
    int rc;
    out = run(1, t + "/r.yaml", &rc);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("stage save (save-dcp) failed: save-dcp: fresh_optimizer writes the param group of an AdamW "
                       "that has not stepped, but this state holds optimizer state"),
              std::string::npos)
        << out;
    EXPECT_FALSE(exists(t + "/ck/.metadata"));
    rm_rf(t);
}

TEST(SaveLayouts, FilesAreTorchSaveArchivesEqualToTheFixtures) {
    std::string t = make_tmpdir("save-layouts"), out;
    int rc;
    out = run(1, pr240_recipe(t), &rc);
    ASSERT_EQ(rc, 0) << out;
    for (const char *f : {"metadata.pt", "scheduler.pt"}) {
        SavedValue ours(t + "/pr240/" + f), theirs(fixture(std::string("pr240_step0_dcp/") + f));
        ASSERT_TRUE(ours.root && theirs.root) << f;
        EXPECT_EQ(pkl_diff(ours.root, theirs.root, f), "");
        // records named as torch.save names them for the file
        EXPECT_EQ(ours.prefix, theirs.prefix) << f;
    }
    EXPECT_FALSE(exists(t + "/pr240/metadata.pt.tmp"));
    // overwrite: the files are replaced with the checkpoint
    out = run(1, pr240_recipe(t, "overwrite: true, files: {metadata.pt: {train_step: 7, note: [null, x, '1']}}"), &rc);
    ASSERT_EQ(rc, 0) << out;
    SavedValue m(t + "/pr240/metadata.pt");
    ASSERT_TRUE(m.root);
    const pkl_obj *step = pkl_dict_get(m.root, "train_step"), *note = pkl_dict_get(m.root, "note");
    ASSERT_TRUE(step && note);
    EXPECT_EQ(step->kind, PKL_INT);
    EXPECT_EQ(step->i, 7);
    ASSERT_EQ(note->kind, PKL_LIST);
    ASSERT_EQ(note->n, 3u);
    EXPECT_EQ(note->items[0]->kind, PKL_NONE);
    EXPECT_EQ(note->items[1]->kind, PKL_STR);
    EXPECT_EQ(note->items[2]->kind, PKL_STR);  // quoted: a string
    rm_rf(t);
}

TEST(SaveLayouts, ExistingOutputsAreRefusedAtValidationNamingStageAndPath) {
    std::string t = make_tmpdir("save-layouts"), out;
    int rc;
    save(1, t, t + "/ck", "");
    // before the first stage runs: the safetensors stage before it writes nothing
    write_file(t + "/again.yaml", std::string(MODEL) + "stages:\n  - {id: i, uses: init-meta}\n"
                                  "  - {id: st, uses: save-safetensors, with: {path: " + t + "/first.safetensors}}\n"
                                  "  - {id: s, uses: save-dcp, after: [st], with: {path: " + t + "/ck}}\n");
    std::string col = std::to_string(std::string("  - {id: s, uses: save-dcp, after: [st], with: {path: ").size() + 1);
    std::string want = "again.yaml:11:" + col + ": stage 's' (save-dcp): path " + t + "/ck already holds a checkpoint";
    out = run(1, "validate " + t + "/again.yaml", &rc);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find(want), std::string::npos) << out;
    EXPECT_NE(out.find("set overwrite: true"), std::string::npos) << out;
    out = run(1, t + "/again.yaml", &rc);
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find(want), std::string::npos) << out;
    EXPECT_FALSE(exists(t + "/first.safetensors"));
    out = run(1, t + "/again.yaml --set stages.s.with.overwrite=true", &rc);
    EXPECT_EQ(rc, 0) << out;
    // save-safetensors: overwrite: false refuses the file (or a copy) that exists; the default replaces it
    write_file(t + "/st.yaml", std::string(MODEL) + "stages:\n  - {id: i, uses: init-meta}\n"
                               "  - {id: w, uses: save-safetensors, with: {path: " + t + "/first.safetensors, "
                               "overwrite: false, copies: [" + t + "/c.safetensors]}}\n");
    out = run(1, "validate " + t + "/st.yaml", &rc);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("stage 'w' (save-safetensors): path " + t + "/first.safetensors already exists and overwrite is "
                       "false"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("c.safetensors already exists"), std::string::npos) << out;
    write_file(t + "/c.safetensors", "x");
    out = run(1, "validate " + t + "/st.yaml --set stages.w.with.path=" + t + "/new.safetensors", &rc);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("stage 'w' (save-safetensors): copy " + t + "/c.safetensors already exists"), std::string::npos)
        << out;
    out = run(1, t + "/st.yaml --set stages.w.with.overwrite=true", &rc);
    EXPECT_EQ(rc, 0) << out;
    rm_rf(t);
}

TEST(SaveLayouts, SafetensorsCopiesAreTheSameBytes) {
    std::string t = make_tmpdir("save-layouts"), out;
    int rc;
    write_file(t + "/ema.safetensors", "an older file");
    write_file(t + "/st.yaml", std::string(MODEL) + "stages:\n  - {id: i, uses: init-meta}\n"
                               "  - {id: w, uses: save-safetensors, with: {path: " + t + "/model.safetensors, "
                               "copies: [" + t + "/ema.safetensors, " + t + "/sub/copy.safetensors]}}\n");
    ASSERT_EQ(run_cmd("mkdir -p " + t + "/sub", nullptr), 0);
    out = run(3, t + "/st.yaml", &rc);
    ASSERT_EQ(rc, 0) << out;
    std::string m = read_file(t + "/model.safetensors");
    ASSERT_GT(m.size(), 100u);
    EXPECT_EQ(read_file(t + "/ema.safetensors"), m);
    EXPECT_EQ(read_file(t + "/sub/copy.safetensors"), m);
    EXPECT_FALSE(exists(t + "/ema.safetensors.tmp"));
    // one file only: not with shards; not the path itself
    out = run(1, "validate " + t + "/st.yaml --set stages.w.with.shard_mb=1", &rc);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("save-safetensors: copies: a sharded output (shard_mb > 0) is a directory"), std::string::npos)
        << out;
    out = run(1, "validate " + t + "/st.yaml --set 'stages.w.with.copies=[" + t + "/model.safetensors]'", &rc);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("copies: " + t + "/model.safetensors is the path itself"), std::string::npos) << out;
    rm_rf(t);
}

}  // namespace
