// The tokenizer fixtures of tests/data/tokenizers/ (tools/gen/gen_tokenizer_fixtures.py) as the tests use
// them: the corpus's documents, a JSONL file of them, and the stream the data kinds must pack from HF's ids.
#pragma once

#include <jansson.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "test_util.h"

namespace fsdp_test {

inline const std::string kTokDir = "tests/data/tokenizers";

// corpus.hex: one document per line, the hex of its bytes (some are not valid UTF-8).
inline std::vector<std::string> tok_corpus() {
    std::vector<std::string> docs;
    std::string all = read_file(kTokDir + "/corpus.hex");
    for (size_t a = 0; a < all.size();) {
        size_t e = all.find('\n', a);
        if (e == std::string::npos) e = all.size();
        std::string doc;
        for (size_t k = a; k + 1 < e; k += 2) doc.push_back((char)std::stoi(all.substr(k, 2), nullptr, 16));
        docs.push_back(doc);
        a = e + 1;
    }
    return docs;
}

// A JSON string of raw bytes: '"', '\\' and control characters escaped, every other byte as it is (invalid
// UTF-8 stays invalid: the reader repairs a line as errors="replace" before parsing it).
inline std::string json_raw(const std::string &s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') o += std::string("\\") + (char)c;
        else if (c < 0x20) {
            char b[8];
            snprintf(b, sizeof b, "\\u%04x", c);
            o += b;
        } else o += (char)c;
    }
    return o + "\"";
}

// Every corpus document as a JSONL line {"n": i, FIELD: text}, written to path.
inline std::string write_corpus_jsonl(const std::string &path, const std::string &field = "text") {
    std::vector<std::string> docs = tok_corpus();
    std::string out;
    for (size_t i = 0; i < docs.size(); i++)
        out += "{\"n\": " + std::to_string(i) + ", \"" + field + "\": " + json_raw(docs[i]) + "}\n";
    write_file(path, out);
    return path;
}

// One int array field of each line of STYLE/expected.jsonl.
inline std::vector<std::vector<int32_t>> tok_expected_ids(const std::string &style, const char *key) {
    std::vector<std::vector<int32_t>> rows;
    std::string all = read_file(kTokDir + "/" + style + "/expected.jsonl");
    for (size_t a = 0; a < all.size();) {
        size_t e = all.find('\n', a);
        if (e == std::string::npos) e = all.size();
        json_error_t je;
        json_t *j = json_loadb(all.data() + a, e - a, 0, &je), *ids = json_object_get(j, key);
        std::vector<int32_t> v;
        for (size_t k = 0; k < json_array_size(ids); k++) v.push_back((int32_t)json_integer_value(json_array_get(ids, k)));
        if (j) rows.push_back(v);
        json_decref(j);
        a = e + 1;
    }
    return rows;
}

// What `kind: jsonl` packs from the corpus: HF's ids of every document with the template (ids_special),
// EOS after each unless the template already put it there.
inline std::vector<int32_t> hf_stream(const std::string &style, int32_t eos) {
    std::vector<int32_t> s;
    for (const std::vector<int32_t> &ids : tok_expected_ids(style, "ids_special")) {
        s.insert(s.end(), ids.begin(), ids.end());
        if (ids.empty() || s.back() != eos) s.push_back(eos);
    }
    return s;
}

} // namespace fsdp_test
