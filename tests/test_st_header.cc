// The one-pass safetensors header reader (ckpt/safetensors_json.c, safetensors_entry.c): every
// JSON spelling of the header's shape is read, everything else refused with the file and the header
// byte named, and a header of many tensors costs memory in proportion to its size (issue 25).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "ckpt/reader.h"
}
#include "ckpt/safetensors.h"
#include "test_util.h"

namespace {

std::string make_st(const std::string &header, const std::string &data) {
    std::string out(8, '\0');
    uint64_t n = header.size();
    for (int i = 0; i < 8; i++) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out + header + data;
}

struct Opened {
    std::string dir = fsdp_test::make_tmpdir("sthdr"), path = dir + "/h.safetensors";
    st_reader *r = nullptr;
    fsdp_err err{};
    int rc = 0;
    Opened(const std::string &header, const std::string &data) {
        fsdp_test::write_file(path, make_st(header, data));
        rc = st_open(&r, path.c_str(), &err);
    }
    ~Opened() {
        st_close(r);
        fsdp_test::rm_rf(dir);
    }
    std::string msg() const { return err.msg; }
};

// A header that must be refused: the code, the file named, and (when given) a piece of the message.
void refused(const std::string &header, const std::string &data, const char *want, const char *why) {
    Opened o(header, data);
    EXPECT_EQ(o.rc, FSDP_E_FORMAT) << why << ": " << header;
    EXPECT_EQ(o.r, nullptr) << why;
    EXPECT_NE(o.msg().find("h.safetensors"), std::string::npos) << why << ": " << o.msg();
    if (want) {
        EXPECT_NE(o.msg().find(want), std::string::npos) << why << ": " << o.msg();
    }
}

const char *kT = "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}";

std::string one(const std::string &entry) { return "{\"t\":" + entry + "}"; }

}  // namespace

TEST(StHeader, EveryJsonSpellingOfTheShapeIsRead) {
    // whitespace everywhere, keys in any order, unknown keys of any JSON value, -0, escapes and
    // raw UTF-8 in names, escaped key names, metadata with escapes
    std::string h =
        " \t\r\n{ \"__metadata__\" : { \"format\" : \"pt\" , \"k\\u00e9y\" : \"v\\ud83d\\ude00\\n\" } ,\n"
        "\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u0041\" : { \"data_offsets\" : [ 4 , 4 ] , \"shape\" : [ 2 , -0 ] ,"
        " \"dtype\" : \"F16\" , \"x\" : {\"n\":[1,2.5e-3,{\"m\":null}],\"t\":true} } ,"
        "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\":{\"dt\\u0079pe\":\"I8\",\"shape\":[],\"data_offsets\":[4,5],"
        "\"z\":-1.5E+3,\"s\":\"\\\"\"},"
        "\"first\":{\"shape\":[2],\"dtype\":\"F\\u0031\\u0036\",\"data_offsets\":[0,4]}}  \n";
    Opened o(h, std::string(5, '\0'));
    ASSERT_EQ(o.rc, 0) << o.msg();
    ASSERT_EQ(st_count(o.r), 3u);
    // listed in data-offset order
    EXPECT_STREQ(st_tensor(o.r, 0)->name, "first");
    EXPECT_STREQ(st_tensor(o.r, 1)->name, "a\"b\\c/d\b\f\n\r\tA");
    EXPECT_STREQ(st_tensor(o.r, 2)->name, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    const st_tensor_info *a = st_find(o.r, "a\"b\\c/d\b\f\n\r\tA");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->dtype, FSDP_DT_F16);
    EXPECT_EQ(a->ndim, 2);
    EXPECT_EQ(a->shape[0], 2);
    EXPECT_EQ(a->shape[1], 0);
    EXPECT_EQ(a->nbytes, 0u);
    EXPECT_EQ(a->offset, 8 + h.size() + 4);
    const st_tensor_info *u = st_find(o.r, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    ASSERT_NE(u, nullptr);
    EXPECT_EQ(u->dtype, FSDP_DT_I8);
    EXPECT_EQ(u->ndim, 0);
    EXPECT_EQ(st_find(o.r, "first")->dtype, FSDP_DT_F16);
    ASSERT_EQ(st_metadata_count(o.r, 0), 2u);
    EXPECT_STREQ(st_metadata_get(o.r, 0, "format"), "pt");
    EXPECT_STREQ(st_metadata_get(o.r, 0, "k\xc3\xa9y"), "v\xf0\x9f\x98\x80\n");
    const char *k, *v;
    ASSERT_EQ(st_metadata_at(o.r, 0, 1, &k, &v), 0);  // in header order
    EXPECT_STREQ(k, "k\xc3\xa9y");
}

TEST(StHeader, DuplicateKeysAreRefusedAtEveryLevel) {
    refused("{\"t\":" + std::string(kT) + ",\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", "xy",
            "duplicate tensor 't'", "tensor twice");
    // the same name spelled differently is the same name
    refused("{\"t\":" + std::string(kT) + ",\"\\u0074\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
            "xy", "duplicate tensor 't'", "tensor twice, escaped");
    refused(one("{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}"), "x", "duplicate key \"dtype\"",
            "dtype twice");
    refused(one("{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"shap\\u0065\":[1]}"), "x",
            "duplicate key \"shape\"", "shape twice, escaped");
    refused(one("{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1,\"x\":2}"), "x", "duplicate key \"x\"",
            "unknown key twice");
    refused(one("{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":{\"y\":1,\"y\":2}}"), "x", "duplicate",
            "duplicate inside an ignored value");
    refused("{\"__metadata__\":{},\"__metadata__\":{},\"t\":" + std::string(kT) + "}", "x",
            "duplicate key \"__metadata__\"", "metadata twice");
    refused("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"},\"t\":" + std::string(kT) + "}", "x", "duplicate key \"a\"",
            "metadata key twice");
}

TEST(StHeader, NumbersMustBeNonNegativeJsonIntegersWithin64Bits) {
    const char *shapes[] = {"[-1]", "[1.0]", "[1e0]", "[\"1\"]", "[true]", "[null]", "[[1]]", "[+1]", "[1,]", "[,1]"};
    for (const char *s : shapes)
        refused(one(std::string("{\"dtype\":\"U8\",\"shape\":") + s + ",\"data_offsets\":[0,1]}"), "x", "shape", s);
    const char *offsets[] = {"[-1,0]", "[0,1.0]", "[0]", "[0,1,2]", "[0,\"1\"]", "{}", "[0 1]"};
    for (const char *s : offsets)
        refused(one(std::string("{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":") + s + "}"), "x", nullptr, s);
    // not JSON numbers at all: the header byte is named
    const char *bad[] = {"[01]", "[1.]", "[-]", "[1e]", "[1e+]", "[-01]"};
    for (const char *s : bad)
        refused(one(std::string("{\"dtype\":\"U8\",\"shape\":") + s + ",\"data_offsets\":[0,1]}"), "x", "header byte", s);
    // outside int64 (as Jansson refuses them): huge, and huge negative
    refused(one("{\"dtype\":\"U8\",\"shape\":[9223372036854775808],\"data_offsets\":[0,1]}"), "x",
            "does not fit in 64 bits", "2^63");
    refused(one("{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,123456789012345678901234567890]}"), "x",
            "does not fit in 64 bits", "2^96");
    refused(one("{\"dtype\":\"U8\",\"shape\":[-9223372036854775809],\"data_offsets\":[0,1]}"), "x",
            "does not fit in 64 bits", "-2^63-1");
    // the largest int64 is an integer (then too many bytes for its data_offsets)
    refused(one("{\"dtype\":\"U8\",\"shape\":[9223372036854775807],\"data_offsets\":[0,1]}"), "x", "needs", "int64 max");
}

TEST(StHeader, StringsAreCheckedLikeJansson) {
    auto named = [](const std::string &name) { return "{\"" + name + "\":" + std::string(kT) + "}"; };
    refused(named("a\x01"), "x", "control character", "raw control character");
    refused(named("a\\x"), "x", "invalid escape", "bad escape");
    refused(named("a\\u12"), "x", "4 hex digits", "short \\u");
    refused(named("a\\u0000"), "x", "\\u0000", "NUL");
    refused(named("a\\ud800"), "x", "surrogate", "lone high surrogate");
    refused(named("a\\ud800\\u0041"), "x", "surrogate", "high surrogate then a letter");
    refused(named("a\\udc00"), "x", "surrogate", "lone low surrogate");
    refused(named("a\xc0\x80"), "x", "UTF-8", "overlong NUL");
    refused(named("a\xed\xa0\x80"), "x", "UTF-8", "UTF-8 surrogate");
    refused(named("a\xf4\x90\x80\x80"), "x", "UTF-8", "above U+10FFFF");
    refused(named("a\xe2\x82"), "x", "UTF-8", "cut sequence");
    refused(named("a\xff"), "x", "UTF-8", "0xff");
}

TEST(StHeader, StructureErrorsNameTheHeaderByte) {
    std::string t = kT;
    refused("[" + t + "]", "x", "not an object", "top-level array");
    refused("1", "x", "header byte 0", "top-level scalar");
    std::string garbage = "{\"t\":" + t + "} x";
    refused(garbage, "x", ("header byte " + std::to_string(garbage.size() - 1)).c_str(), "trailing garbage");
    refused("{\"t\":" + t + "}}", "x", "followed by", "a second brace");
    refused("{\"t\":" + t + ",}", "x", "header byte", "trailing comma");
    refused("{\"t\"" + t + "}", "x", "':' expected", "missing colon");
    refused("{\"t\":" + t + " \"u\":" + t + "}", "x", "',' or '}' expected", "missing comma");
    refused("{t:" + t + "}", "x", "header byte 1", "unquoted name");
    refused(one("{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],}"), "x", "header byte", "comma in a tensor");
    refused(one("[1]"), "x", "entry must be an object", "tensor as an array");
    refused(one("{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":nul}"), "x", "header byte",
            "bad ignored value");
    // __metadata__ holds strings only
    const char *values[] = {"1", "null", "true", "{\"b\":\"c\"}", "[\"b\"]", "1.5"};
    for (const char *v : values)
        refused(std::string("{\"__metadata__\":{\"a\":") + v + "},\"t\":" + t + "}", "x",
                "__metadata__ value of 'a' must be a string", v);
    refused("{\"__metadata__\":[],\"t\":" + t + "}", "x", "got an array", "metadata array");
    refused("{\"__metadata__\":\"x\",\"t\":" + t + "}", "x", "got a scalar", "metadata string");
}

TEST(StHeader, EveryTruncationIsRefused) {
    std::string h = "{\"__metadata__\":{\"f\":\"p\\u00e9\"},\"a\\u00e9\":{\"dtype\":\"F32\",\"shape\":[2, 1],"
                    "\"data_offsets\":[0,8],\"x\":[1,{\"y\":\"z\"}]},"
                    "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[8,9]}}";
    {
        Opened full(h, std::string(9, '\0'));
        ASSERT_EQ(full.rc, 0) << full.msg();
    }
    for (size_t n = 0; n < h.size(); n++) {
        Opened o(h.substr(0, n), std::string(9, '\0'));
        EXPECT_EQ(o.rc, FSDP_E_FORMAT) << n;
        EXPECT_NE(o.msg().find("h.safetensors"), std::string::npos) << o.msg();
    }
}

namespace {

// A header of n tensors listed out of data-offset order (tensor i at slot (i * 7919) % n), each
// "layers.<i/64>.block.<i%64>.weight" U8 of shape [1 + i % 3]; its data size in *data.
std::string many_tensors(size_t n, size_t *data) {
    std::vector<uint64_t> begin(n);
    uint64_t off = 0;
    for (size_t s = 0; s < n; s++) {
        size_t i = (s * 7919) % n;
        begin[i] = off;
        off += 1 + i % 3;
    }
    std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
    char buf[256];
    for (size_t i = 0; i < n; i++) {
        snprintf(buf, sizeof buf, ",\"layers.%zu.block.%zu.weight\":{\"dtype\":\"U8\",\"shape\":[%zu],\"data_offsets\":[%llu,%llu]}",
                 i / 64, i % 64, 1 + i % 3, (unsigned long long)begin[i], (unsigned long long)(begin[i] + 1 + i % 3));
        h += buf;
    }
    *data = off;
    return h + "}";
}

// A field of /proc/self/status in KiB (VmRSS, VmHWM); -1 when absent.
long status_kib(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') v = atol(line + n + 1);
    fclose(f);
    return v;
}

// Resets this process's peak resident set (VmHWM) to its current one (Linux 4.0 and later).
bool reset_peak() {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    bool ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

}  // namespace

TEST(StHeader, ManyTensorsAreReadInOffsetOrderWithTheirNames) {
    const size_t n = 200000;
    size_t data = 0;
    std::string h = many_tensors(n, &data);
    Opened o(h, std::string(data, '\0'));
    ASSERT_EQ(o.rc, 0) << o.msg();
    ASSERT_EQ(st_count(o.r), n);
    uint64_t prev = 0;
    for (size_t k = 0; k < n; k++) {  // tiling in offset order: slot k holds tensor (k * 7919) % n
        const st_tensor_info *t = st_tensor(o.r, k);
        size_t i = (k * 7919) % n;
        ASSERT_EQ(t->offset, 8 + h.size() + prev) << k;
        ASSERT_EQ(t->nbytes, 1 + i % 3) << k;
        prev += t->nbytes;
    }
    for (size_t i = 0; i < n; i += 997) {
        std::string name = "layers." + std::to_string(i / 64) + ".block." + std::to_string(i % 64) + ".weight";
        const st_tensor_info *t = st_find(o.r, name.c_str());
        ASSERT_NE(t, nullptr) << name;
        EXPECT_STREQ(t->name, name.c_str());
        EXPECT_EQ(t->dtype, FSDP_DT_U8);
        EXPECT_EQ(t->ndim, 1);
        EXPECT_EQ(t->shape[0], (int64_t)(1 + i % 3));
    }
    EXPECT_EQ(st_find(o.r, "layers.0.block.64.weight"), nullptr);
    // the checkpoint reader finds names through the safetensors index
    ckpt_reader *c = nullptr;
    fsdp_err err{};
    ASSERT_EQ(ckpt_open(o.path.c_str(), CKPT_AUTO, &c, &err), 0) << err.msg;
    long at = ckpt_find(c, "layers.3000.block.7.weight");
    ASSERT_GE(at, 0);
    EXPECT_STREQ(ckpt_entry_at(c, (size_t)at)->name, "layers.3000.block.7.weight");
    EXPECT_EQ(ckpt_find(c, "layers.3000.block.64.weight"), -1);
    ckpt_close(c);
}

TEST(StHeader, ManyTensorsNeedASmallMultipleOfTheHeader) {
    // ckpt_open of 200000 tiny tensors (a 17 MB header): the growth of the peak resident set per
    // tensor. A JSON tree of the header (Jansson) took about 1.3 KB a tensor; the tables the
    // readers keep (st_tensor_info, ckpt_entry, the sorted names) take about 250 bytes.
    const size_t n = 200000;
    std::string dir = fsdp_test::make_tmpdir("sthdr"), path = dir + "/big.safetensors";
    size_t data = 0, hsize = 0;
    {
        std::string h = many_tensors(n, &data);
        hsize = h.size();
        fsdp_test::write_file(path, make_st(h, std::string(data, '\0')));
    }
    bool reset = reset_peak();
    if (!reset) fsdp_test::rm_rf(dir);
    ASSERT_TRUE(reset) << "/proc/self/clear_refs cannot reset the peak resident set (Linux >= 4.0 has it)";
    long base = status_kib("VmHWM");
    ckpt_reader *c = nullptr;
    fsdp_err err{};
    int rc = ckpt_open(path.c_str(), CKPT_AUTO, &c, &err);
    long peak = status_kib("VmHWM");
    ckpt_close(c);
    fsdp_test::rm_rf(dir);
    ASSERT_EQ(rc, 0) << err.msg;
    ASSERT_GT(base, 0);
    double grown = (double)(peak - base) * 1024.0;
    printf("  peak resident set grew %.0f bytes a tensor (header: %.0f bytes a tensor)\n", grown / (double)n,
           (double)hsize / (double)n);
    EXPECT_LT(grown / (double)n, 600.0) << "peak " << peak << " KiB from " << base << " KiB";
    EXPECT_LT(grown, 6.0 * (double)hsize) << "peak " << peak << " KiB from " << base << " KiB, header " << hsize;
}
