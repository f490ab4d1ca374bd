// `fsdp-run tokenize` (issue 41 item 1's CLI and item 4's errors): JSONL documents by their field, whole
// text files, the template with --special, --threads giving the same output, --decode reading the ids back
// into JSONL that tokenize reads again, and a clear error with the file and line for what is wrong.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

using namespace fsdp_test;

namespace {

const std::string kTok = "tests/data/tokenizers/neox";

std::string tok_cmd(const std::string &args, int *rc) {
    std::string out;
    *rc = run_cmd(fsdp_run_bin() + " tokenize " + args, &out);
    return out;
}

// A JSONL file of n documents from the corpus (valid UTF-8 ones, as JSON strings), field name f.
std::string jsonl_of_corpus(const std::string &dir, const std::string &f, size_t *n) {
    std::string all = read_file("tests/data/tokenizers/corpus.hex"), out;
    *n = 0;
    for (size_t a = 0; a < all.size() && *n < 40;) {
        size_t e = all.find('\n', a);
        std::string hex = all.substr(a, e - a), doc, esc;
        a = e + 1;
        for (size_t k = 0; k + 1 < hex.size(); k += 2) doc.push_back((char)std::stoi(hex.substr(k, 2), nullptr, 16));
        bool ok = true;
        for (unsigned char c : doc) ok &= c >= 0x20 || c == '\n' || c == '\t';
        if (!ok || doc.find('"') != std::string::npos || doc.find('\\') != std::string::npos) continue;
        for (char c : doc) esc += c == '\n' ? std::string("\\n") : c == '\t' ? std::string("\\t") : std::string(1, c);
        out += "{\"id\": " + std::to_string(*n) + ", \"" + f + "\": \"" + esc + "\"}\n";
        ++*n;
    }
    std::string p = dir + "/docs.jsonl";
    write_file(p, out);
    return p;
}

size_t lines(const std::string &s) {
    size_t n = 0;
    for (char c : s) n += c == '\n';
    return n;
}

} // namespace

TEST(TokenizeCli, JsonlTextTemplateThreadsAndDecodeRoundTrip) {
    std::string dir = make_tmpdir("tokcli");
    size_t n;
    std::string docs = jsonl_of_corpus(dir, "content", &n);
    ASSERT_GT(n, 20u);
    int rc;
    std::string out = tok_cmd("-q --tokenizer " + kTok + " --field content " + docs, &rc);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_EQ(lines(out), n);
    EXPECT_EQ(out.substr(0, 1), "[");
    std::string out2 = tok_cmd("-q --tokenizer " + kTok + "/tokenizer.json --field content --threads 2 " + docs, &rc);
    ASSERT_EQ(rc, 0) << out2;
    EXPECT_EQ(out2, out);
    // the template: OLMo/NeoX's <|endoftext|> (id 5000 in this vocabulary) after every document
    std::string sp = tok_cmd("-q --tokenizer " + kTok + " --field content --special " + docs, &rc);
    ASSERT_EQ(rc, 0) << sp;
    EXPECT_EQ(lines(sp), n);
    for (size_t a = 0, b = 0; a < out.size() && b < sp.size();) {
        size_t ea = out.find('\n', a), eb = sp.find('\n', b);
        std::string plain = out.substr(a, ea - a), with = sp.substr(b, eb - b);
        EXPECT_EQ(with, plain == "[]" ? "[5000]" : plain.substr(0, plain.size() - 1) + ",5000]");
        a = ea + 1;
        b = eb + 1;
    }
    // decode -> JSONL {"content": ...} -> encode again: the same ids
    write_file(dir + "/ids.jsonl", out);
    std::string back = tok_cmd("--tokenizer " + kTok + " --decode --field content " + dir + "/ids.jsonl", &rc);
    ASSERT_EQ(rc, 0) << back;
    write_file(dir + "/back.jsonl", back);
    std::string again = tok_cmd("-q --tokenizer " + kTok + " --field content " + dir + "/back.jsonl", &rc);
    ASSERT_EQ(rc, 0) << again;
    EXPECT_EQ(again, out);
    // a text file is one document; its summary counts the replaced bytes
    write_file(dir + "/a.txt", std::string("caf\xc3\xa9 \xff and more\n"));
    std::string txt = tok_cmd("--tokenizer " + kTok + " " + dir + "/a.txt", &rc);
    ASSERT_EQ(rc, 0) << txt;
    EXPECT_NE(txt.find("tokenize: 1 documents"), std::string::npos) << txt;
    EXPECT_NE(txt.find("1 invalid UTF-8 sequences replaced by U+FFFD"), std::string::npos) << txt;
    rm_rf(dir);
}

TEST(TokenizeCli, ErrorsNameTheFileAndLine) {
    std::string dir = make_tmpdir("tokcli");
    write_file(dir + "/bad.jsonl", "{\"text\": \"ok\"}\n\n{\"text\": \"fine\"}\n{\"text\": oops}\n");
    write_file(dir + "/nofield.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n");
    write_file(dir + "/notstr.jsonl", "{\"text\": 12}\n");
    write_file(dir + "/notobj.jsonl", "[1, 2]\n");
    write_file(dir + "/ids.jsonl", "[1, 2]\n[3, \"x\"]\n");
    write_file(dir + "/bigid.jsonl", "[1, 999999]\n");
    struct Case {
        std::string args, want;
        int code;
    } cases[] = {
        {"--tokenizer " + kTok + " " + dir + "/bad.jsonl", dir + "/bad.jsonl:4: not a JSON line", 1},
        {"--tokenizer " + kTok + " " + dir + "/nofield.jsonl", dir + "/nofield.jsonl:2: no field \"text\"", 1},
        {"--tokenizer " + kTok + " " + dir + "/notstr.jsonl", dir + "/notstr.jsonl:1: field \"text\" is a number", 1},
        {"--tokenizer " + kTok + " " + dir + "/notobj.jsonl", dir + "/notobj.jsonl:1: expected a JSON object", 1},
        {"--tokenizer " + kTok + " --decode " + dir + "/ids.jsonl", dir + "/ids.jsonl:2: element 1 is not an integer", 1},
        {"--tokenizer " + kTok + " --decode " + dir + "/bigid.jsonl", dir + "/bigid.jsonl:1: ", 2},
        {"--tokenizer " + dir + " " + dir + "/bad.jsonl", dir + "/tokenizer.json: no tokenizer.json there", 1},
        {"--tokenizer " + kTok + " " + dir + "/missing.txt", dir + "/missing.txt", 1},
        {"--tokenizer " + kTok, "no input file given", 2},
        {dir + "/bad.jsonl", "--tokenizer DIR is required", 2},
        {"--tokenizer " + kTok + " --threads 0 x", "--threads expects 1..1024", 2},
        {"--tokenizer " + kTok + " --bogus x", "unknown option '--bogus'", 2},
    };
    for (const Case &c : cases) {
        int rc;
        std::string out = tok_cmd(c.args, &rc);
        EXPECT_EQ(rc, c.code) << c.args << "\n" << out;
        EXPECT_NE(out.find(c.want), std::string::npos) << c.args << "\n" << out;
    }
    rm_rf(dir);
}
