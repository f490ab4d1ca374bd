// Reading the metrics files (JSON lines) in tests: Jansson, one object per line.
#ifndef FSDP_TESTS_JSONL_UTIL_H
#define FSDP_TESTS_JSONL_UTIL_H

#include <jansson.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace fsdp_test {

// The number under `key` in every line of a JSON-lines file that parses (0 where a line lacks it).
inline std::vector<double> jsonl_field(const std::string &jsonl, const char *key) {
    std::vector<double> v;
    std::string s = read_file(jsonl);
    size_t p = 0;
    while (p < s.size()) {
        size_t e = s.find('\n', p);
        if (e == std::string::npos) e = s.size();
        json_error_t je;
        json_t *j = json_loadb(s.data() + p, e - p, 0, &je);
        if (j) {
            v.push_back(json_number_value(json_object_get(j, key)));
            json_decref(j);
        }
        p = e + 1;
    }
    return v;
}

}  // namespace fsdp_test

#endif
