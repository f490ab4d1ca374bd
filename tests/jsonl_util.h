// Reading the metrics files (JSON lines) in tests: Jansson, one object per line.
#ifndef FSDP_TESTS_JSONL_UTIL_H
#define FSDP_TESTS_JSONL_UTIL_H

#include <gtest/gtest.h>
#include <jansson.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace fsdp_test {

// Every JSON object of a JSON-lines file, in order (the caller json_decref's them). strict: a line
// that does not parse is a test failure; otherwise it is skipped.
inline std::vector<json_t *> jsonl_objects(const std::string &jsonl, bool strict = true) {
    std::vector<json_t *> v;
    std::string s = read_file(jsonl);
    size_t p = 0;
    while (p < s.size()) {
        size_t e = s.find('\n', p);
        if (e == std::string::npos) e = s.size();
        json_error_t je;
        json_t *j = json_loadb(s.data() + p, e - p, 0, &je);
        if (strict) {
            EXPECT_TRUE(j) << je.text << " in " << s.substr(p, e - p);
        }
        if (j) v.push_back(j);
        p = e + 1;
    }
    return v;
}

// The number under `key` in every line of a JSON-lines file that parses (0 where a line lacks it).
inline std::vector<double> jsonl_field(const std::string &jsonl, const char *key) {
    std::vector<double> v;
    for (json_t *j : jsonl_objects(jsonl, false)) {
        v.push_back(json_number_value(json_object_get(j, key)));
        json_decref(j);
    }
    return v;
}

}  // namespace fsdp_test

#endif
