// A DCP written by fsdp-run has a .metadata whose decoded object tree has the structure, class
// names, field names and values of PyTorch's for the same content (dcp_full_ws3: 3 ranks, model,
// optimizer and train_state); only storage locations and ids legitimately differ.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "test_util.h"

extern "C" {
#include "ckpt/pickle.h"
}

using namespace fsdp_test;

namespace {
struct Tree {
    pkl_doc *doc = nullptr;
    const pkl_obj *root = nullptr;
    std::string bytes;
    explicit Tree(const std::string &path) : bytes(read_file(path)) {
        fsdp_err err;
        EXPECT_EQ(pkl_parse(bytes.data(), bytes.size(), path.c_str(), &doc, &root, &err), 0) << err.msg;
    }
    ~Tree() { pkl_free(doc); }
};
std::string repr(const pkl_obj *o) {
    char *r = pkl_repr(o);
    std::string s = r ? r : "";
    free(r);
    return s;
}
std::map<std::string, const pkl_obj *> dict(const pkl_obj *d) {
    std::map<std::string, const pkl_obj *> m;
    for (size_t i = 0; d && i < d->n; i++) m[repr(d->items[2 * i])] = d->items[2 * i + 1];
    return m;
}
std::set<std::string> field_names(const pkl_obj *o) {
    std::set<std::string> s;
    for (auto &kv : dict(pkl_state(o))) s.insert(kv.first);
    return s;
}
}  // namespace

TEST(DcpMetadataStructure, SameTreeAsPyTorchForTheSameContent) {
    std::string t = make_tmpdir("fsdp-meta"), out;
    write_file(t + "/r.yaml", "model: {preset: tiny}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                                  tiny("dcp_full_ws3") + "}}\n  - {id: s, uses: save-dcp, with: {path: " + t + "/c}}\n");
    ASSERT_EQ(run_cmd(mpirun_prefix(3) + " " + fsdp_run_bin() + " -q " + t + "/r.yaml", &out), 0) << out;
    Tree theirs(tiny("dcp_full_ws3/.metadata")), ours(t + "/c/.metadata");
    ASSERT_TRUE(theirs.root && ours.root);
    EXPECT_EQ(repr(pkl_callable(ours.root)), repr(pkl_callable(theirs.root)));
    EXPECT_EQ(field_names(ours.root), field_names(theirs.root));
    auto ts = dict(pkl_state(theirs.root)), os = dict(pkl_state(ours.root));
    // every tensor / value PyTorch recorded, with identical metadata (properties, size, chunks)
    auto tsdm = dict(ts["'state_dict_metadata'"]), osdm = dict(os["'state_dict_metadata'"]);
    ASSERT_GT(tsdm.size(), 100u);
    for (auto &kv : tsdm) {
        ASSERT_TRUE(osdm.count(kv.first)) << "missing " << kv.first;
        EXPECT_EQ(repr(osdm[kv.first]), repr(kv.second)) << kv.first;
    }
    // beyond PyTorch's fixture: fsdp-run's own train_state entries and the resume entries a strict
    // load into AdamW + LambdaLR + torchtitan's dataloader needs (issue 17, tests/test_resume_entries.cc)
    std::set<std::string> extra;
    auto resume_entry = [](const std::string &k) {
        if (!k.compare(0, 14, "'lr_scheduler.") || !k.compare(0, 12, "'dataloader.")) return true;
        if (k.compare(0, 24, "'optimizer.param_groups.")) return false;
        for (const char *o : {"amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused",
                              "decoupled_weight_decay", "initial_lr"}) {
            std::string suffix = std::string(".") + o + "'";
            if (k.size() > suffix.size() && !k.compare(k.size() - suffix.size(), suffix.size(), suffix)) return true;
        }
        return false;
    };
    size_t resume = 0;
    for (auto &kv : osdm)
        if (!tsdm.count(kv.first)) {
            if (resume_entry(kv.first)) resume++;
            else extra.insert(kv.first);
        }
    EXPECT_EQ(extra, (std::set<std::string>{"'train_state.data_pos'", "'train_state.ntokens_seen'"}));
    EXPECT_GT(resume, 8u);
    // the original nesting of each key
    auto tpd = dict(ts["'planner_data'"]), opd = dict(os["'planner_data'"]);
    for (auto &kv : tpd) EXPECT_EQ(repr(opd[kv.first]), repr(kv.second)) << kv.first;
    // storage: the same MetadataIndex objects (fqn, index, offset) -> _StorageInfo objects
    // whose files and byte ranges are ours
    auto tst = dict(ts["'storage_data'"]), ost = dict(os["'storage_data'"]);
    size_t matched = 0;
    for (auto &kv : tst) {
        ASSERT_TRUE(ost.count(kv.first)) << "no storage entry " << kv.first;
        EXPECT_EQ(repr(pkl_callable(ost[kv.first])), repr(pkl_callable(kv.second)));
        EXPECT_EQ(field_names(ost[kv.first]), field_names(kv.second)) << kv.first;
        matched++;
    }
    EXPECT_EQ(matched, tst.size());
    EXPECT_EQ(repr(pkl_callable(os["'storage_meta'"])), repr(pkl_callable(ts["'storage_meta'"])));
    EXPECT_EQ(field_names(os["'storage_meta'"]), field_names(ts["'storage_meta'"]));
    EXPECT_EQ(repr(os["'version'"]), repr(ts["'version'"]));
    rm_rf(t);
}

// What fsdp-run writes in a trainer's layout nests every key in .metadata's planner_data as that trainer's own
// save does (torch's optimizer state_dict under its prefix for fms-fsdp and OLMo-core; FSDP1's
// load_sharded_optimizer_state_dict rebuilds the optimizer's dict from it).
TEST(DcpMetadataStructure, PlannerDataOfATrainersLayoutIsTheTrainersOwn) {
    struct Case {
        const char *ckpt, *layout;
    } cases[] = {{"tests/data/trainers/fms-1.13/ws2/checkpoints/step_3_ckp", "fms-1.13"},
                 {"tests/data/trainers/olmo-core-3.0/ws2", "olmo-core-3"},
                 {"tests/data/trainers/torchtitan-0.3/ws2/step-3", "torchtitan-0.3"}};
    std::string t = make_tmpdir("fsdp-meta-lay"), out;
    for (const Case &c : cases) {
        std::string canon = t + "/" + c.layout, back = canon + "_back";
        ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt convert " + c.ckpt + " " + canon + " --from auto --n-heads 4 --n-kv-heads 2",
                          &out), 0) << out;
        ASSERT_EQ(run_cmd(fsdp_run_bin() + " ckpt convert " + canon + " " + back + " --to " + c.layout +
                              " --n-heads 4 --n-kv-heads 2 --world 2", &out), 0) << out;
        Tree theirs(std::string(c.ckpt) + "/.metadata"), ours(back + "/.metadata");
        auto tpd = dict(dict(pkl_state(theirs.root))["'planner_data'"]), opd = dict(dict(pkl_state(ours.root))["'planner_data'"]);
        size_t same = 0;
        for (auto &kv : tpd) {
            if (kv.first.find("dataloader.") != std::string::npos) continue; // torchtitan's per-rank loader state
            ASSERT_TRUE(opd.count(kv.first)) << c.layout << ": " << kv.first;
            EXPECT_EQ(repr(opd[kv.first]), repr(kv.second)) << c.layout << ": " << kv.first;
            same++;
        }
        EXPECT_GT(same, 60u) << c.layout;
    }
    rm_rf(t);
}
