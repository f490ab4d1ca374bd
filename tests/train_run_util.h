// Helpers of the train-steps / eval tests (test_train_accum.cc, test_train_eval.cc,
// test_schedules.cc): running fsdp-run on a recipe, its metrics lines, its report, saved weights.
#ifndef FSDP_TESTS_TRAIN_RUN_UTIL_H
#define FSDP_TESTS_TRAIN_RUN_UTIL_H

#include <gtest/gtest.h>
#include <jansson.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "st_test_reader.h"
#include "test_util.h"
#include "jsonl_util.h"

namespace train_test {

struct Dir {
    std::string d = fsdp_test::make_tmpdir("fsdp-train16");
    ~Dir() { fsdp_test::rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

// fsdp-run ARGS (prefix: e.g. an mpirun command); the exit code and the output.
inline int run(const std::string &args, std::string *out, const std::string &prefix = "") {
    return fsdp_test::run_cmd("timeout -k 10 300 " + prefix + (prefix.empty() ? "" : " ") + fsdp_test::fsdp_run_bin() +
                                  " " + args,
                              out);
}

// The JSON objects of a JSONL file that have `key`, in order (caller json_decref's).
inline std::vector<json_t *> lines_with(const std::string &path, const char *key) {
    std::vector<json_t *> v;
    for (json_t *j : fsdp_test::jsonl_objects(path)) {
        if (json_object_get(j, key)) v.push_back(j);
        else json_decref(j);
    }
    return v;
}

inline std::vector<double> column(const std::string &path, const char *key) {
    std::vector<double> out;
    for (json_t *j : lines_with(path, key)) {
        out.push_back(json_number_value(json_object_get(j, key)));
        json_decref(j);
    }
    return out;
}

// A stage's metric from a --report file (NAN when absent).
inline double report_metric(const std::string &report, const char *stage, const char *key) {
    json_error_t je;
    json_t *r = json_load_file(report.c_str(), 0, &je);
    EXPECT_TRUE(r) << je.text;
    double v = NAN;
    json_t *stages = json_object_get(r, "stages");
    for (size_t i = 0; i < json_array_size(stages); i++) {
        json_t *s = json_array_get(stages, i);
        if (!strcmp(json_string_value(json_object_get(s, "stage")), stage)) {
            json_t *m = json_object_get(json_object_get(s, "metrics"), key);
            if (m) v = json_number_value(m);
        }
    }
    json_decref(r);
    return v;
}

// Largest |a - b| / (1 + |b|) over every tensor of two safetensors files of the same names.
inline double max_rel_diff(const std::string &a, const std::string &b, std::string *worst = nullptr) {
    std::map<std::string, st_test::Tensor> ta, tb;
    std::string why;
    EXPECT_TRUE(st_test::load(a, &ta, &why)) << why;
    EXPECT_TRUE(st_test::load(b, &tb, &why)) << why;
    EXPECT_EQ(ta.size(), tb.size());
    double m = 0;
    for (auto &kv : ta) {
        auto it = tb.find(kv.first);
        if (it == tb.end()) {
            ADD_FAILURE() << kv.first << " missing in " << b;
            continue;
        }
        EXPECT_EQ(kv.second.f32.size(), it->second.f32.size()) << kv.first;
        for (size_t i = 0; i < kv.second.f32.size() && i < it->second.f32.size(); i++) {
            double d = std::fabs((double)kv.second.f32[i] - it->second.f32[i]) / (1.0 + std::fabs(it->second.f32[i]));
            if (d > m) {
                m = d;
                if (worst) *worst = kv.first;
            }
        }
    }
    return m;
}

}  // namespace train_test

#endif
