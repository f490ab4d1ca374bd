// Issue 40 item 4: a `.metadata` is folded while it is parsed (ckpt/dcp_meta_fold.h): chunks, storage
// keys and storage records become table entries as the pickle reader builds them, and their objects are
// reused at once, so a 4096-rank checkpoint is never a whole pickle tree in memory. What is read must be
// exactly what the whole tree gives (DCP_PARSE_TREE), entry for entry and error for error:
//   - every .metadata torch 2.11 and Bagel wrote among the fixtures (protocol 4: every object memoized,
//     SETITEMS in batches), and a generated grid of saves (ranks x dims x empty shards x byte values x
//     files) written by fsdp-run's writer;
//   - every input of the .metadata fuzz corpus (malformed ones among them): the same result code and the
//     same message, folded or not;
//   - and the folding must hold memory down: the pickle objects alive at the peak stay a few thousand
//     however many chunks the file lists (against one per object without folding), and a memo of more
//     entries than the whole tree allows (torch's own 4096-rank .metadata) keeps only what is fetched.
#include <gtest/gtest.h>

#include <dirent.h>

#include <string>
#include <vector>

#include "test_util.h"

extern "C" {
#include "ckpt/dcp.h"
#include "ckpt/pickle.h"
#include "ckpt/dcp_chunks.h"
#include "ckpt/dcp_meta_fold.h"
#include "runtime/shard.h"
}

using namespace fsdp_test;

namespace {

struct Parsed {
    int rc = 0;
    std::string msg;
    dcp_item *items = nullptr;
    size_t n = 0;
    std::string version, save_id;
    ~Parsed() { dcp_items_free(items, n); }
};

void parse(const std::string &bytes, int whole, int flags, Parsed *p) {
    fsdp_err err{};
    char ver[32] = "", sid[128] = "";
    // a scratch copy: DCP_PARSE_CONSUME may give its pages back
    std::vector<char> buf(bytes.begin(), bytes.end());
    p->rc = dcp_parse_metadata_id(buf.data(), buf.size(), "m", whole, flags, &p->items, &p->n, ver, sizeof ver, sid,
                                  sizeof sid, &err);
    p->msg = p->rc ? err.msg : "";
    p->version = ver;
    p->save_id = sid;
}

void expect_same(const Parsed &a, const Parsed &b, const std::string &what) {
    ASSERT_EQ(a.rc, b.rc) << what << ": " << a.msg << " | " << b.msg;
    EXPECT_EQ(a.msg, b.msg) << what;
    if (a.rc) return;
    EXPECT_EQ(a.version, b.version) << what;
    EXPECT_EQ(a.save_id, b.save_id) << what;
    ASSERT_EQ(a.n, b.n) << what;
    for (size_t i = 0; i < a.n; i++) {
        const dcp_item &x = a.items[i], &y = b.items[i];
        std::string at = what + ": " + x.fqn;
        ASSERT_STREQ(x.fqn, y.fqn) << at;
        ASSERT_EQ(x.is_tensor, y.is_tensor) << at;
        EXPECT_STREQ(x.where.relative_path, y.where.relative_path) << at;
        EXPECT_EQ(x.where.offset, y.where.offset) << at;
        EXPECT_EQ(x.where.length, y.where.length) << at;
        if (!x.is_tensor) continue;
        ASSERT_EQ(x.dtype, y.dtype) << at;
        ASSERT_EQ(x.ndim, y.ndim) << at;
        for (int d = 0; d < x.ndim; d++) EXPECT_EQ(x.shape[d], y.shape[d]) << at;
        ASSERT_EQ(x.n_chunks, y.n_chunks) << at;
        for (size_t k = 0; k < x.n_chunks; k++) {
            const dcp_chunk &c = x.chunks[k], &e = y.chunks[k];
            for (int d = 0; d < x.ndim; d++) {
                ASSERT_EQ(c.offsets[d], e.offsets[d]) << at << " chunk " << k;
                ASSERT_EQ(c.sizes[d], e.sizes[d]) << at << " chunk " << k;
            }
            EXPECT_STREQ(c.where.relative_path, e.where.relative_path) << at << " chunk " << k;
            EXPECT_EQ(c.where.offset, e.where.offset) << at << " chunk " << k;
            EXPECT_EQ(c.where.length, e.where.length) << at << " chunk " << k;
        }
    }
}

// folded (as dcp_open reads, giving the buffer back) against the whole tree, as a global and a rank-local file
void check_bytes(const std::string &bytes, const std::string &what) {
    for (int whole : {1, 0}) {
        Parsed folded, tree;
        parse(bytes, whole, DCP_PARSE_CONSUME, &folded);
        parse(bytes, whole, DCP_PARSE_TREE, &tree);
        expect_same(folded, tree, what + (whole ? "" : " (rank-local)"));
    }
}

void find_metadata(const std::string &dir, std::vector<std::string> *out) {
    DIR *d = opendir(dir.c_str());
    if (!d) return;
    while (struct dirent *e = readdir(d)) {
        std::string name = e->d_name;
        if (name == "." || name == "..") continue;
        std::string p = dir + "/" + name;
        if (name == ".metadata") out->push_back(p);
        else if (e->d_type == DT_DIR) find_metadata(p, out);
    }
    closedir(d);
}

TEST(DcpMetaFold, TorchWrittenFixturesReadAsTheWholeTree) {
    std::vector<std::string> files;
    find_metadata(fixtures_dir(), &files);
    ASSERT_GE(files.size(), 8u) << "the torch and Bagel DCP fixtures under " << fixtures_dir();
    for (const std::string &f : files) check_bytes(read_file(f), f);
}

// A generated save: every tensor Shard(0) (and Shard(1) for every third) over `ranks`, uneven and empty
// shards, a byte value per rank, each rank its own file.
std::vector<dcp_record> grid_save(int ranks, int ndim, int tensors) {
    std::vector<dcp_record> recs;
    for (int r = 0; r < ranks; r++) {
        uint64_t pos = 0;
        for (int t = 0; t < tensors; t++) {
            dcp_record rec{};
            snprintf(rec.fqn, sizeof rec.fqn, "model.layers.%d.w%d", t / 3, t % 3);
            rec.is_tensor = 1, rec.dtype = t % 2 ? FSDP_DT_BF16 : FSDP_DT_F32, rec.ndim = ndim;
            for (int d = 0; d < ndim; d++) rec.shape[d] = d == 0 ? 3 + 5 * t : 2 + d, rec.sizes[d] = rec.shape[d];
            int dim = ndim > 1 && t % 3 == 2 ? 1 : 0;
            if (ndim > 0) shard_rows(rec.shape[dim], ranks, r, &rec.offsets[dim], &rec.sizes[dim]);
            else if (r) continue; // a scalar is rank 0's
            int64_t numel = 1;
            for (int d = 0; d < ndim; d++) numel *= rec.sizes[d];
            snprintf(rec.where.relative_path, sizeof rec.where.relative_path, "__%d_0.distcp", r);
            rec.where.offset = pos, rec.where.length = (uint64_t)numel * (t % 2 ? 2 : 4);
            pos += rec.where.length + 64;
            recs.push_back(rec);
        }
        dcp_record v{};
        snprintf(v.fqn, sizeof v.fqn, "optimizer.param_groups.0.lr");
        snprintf(v.where.relative_path, sizeof v.where.relative_path, "__%d_0.distcp", r);
        v.where.offset = pos, v.where.length = 40;
        if (r == 0) recs.push_back(v);
    }
    return recs;
}

TEST(DcpMetaFold, GeneratedGridOfSavesReadsAsTheWholeTree) {
    for (int ranks : {1, 2, 3, 7, 64})
        for (int ndim : {0, 1, 2, 3}) {
            std::string dir = make_tmpdir("fold");
            std::vector<dcp_record> recs = grid_save(ranks, ndim, 7);
            fsdp_err err{};
            ASSERT_EQ(dcp_write_metadata(dir.c_str(), recs.data(), recs.size(), &err), 0) << err.msg;
            check_bytes(read_file(dir + "/.metadata"), std::to_string(ranks) + " ranks, " + std::to_string(ndim) + "-D");
            rm_rf(dir);
        }
}

TEST(DcpMetaFold, EveryFuzzCorpusInputGetsTheSameResultAndMessage) {
    std::string dir = "tests/fuzz/corpus/dcp_meta";
    DIR *d = opendir(dir.c_str());
    ASSERT_NE(d, nullptr) << dir;
    size_t files = 0, refused = 0;
    while (struct dirent *e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        std::string bytes = read_file(dir + "/" + e->d_name);
        Parsed folded, tree;
        parse(bytes, 1, DCP_PARSE_CONSUME, &folded);
        parse(bytes, 1, DCP_PARSE_TREE, &tree);
        expect_same(folded, tree, dir + "/" + e->d_name);
        files++;
        refused += folded.rc != 0;
    }
    closedir(d);
    EXPECT_GT(files, 100u);
    EXPECT_GT(refused, 10u) << "the corpus holds malformed inputs too";
}

// The objects the pickle reader holds at its largest while it parses n chunks, folded or not.
size_t peak_objects(const std::string &bytes, bool fold) {
    dcp_fold f;
    pkl_fold hooks;
    dcp_fold_hooks(&f, &hooks, 0);
    pkl_doc *doc = nullptr;
    const pkl_obj *root = nullptr;
    fsdp_err err{};
    EXPECT_EQ(pkl_parse_fold(bytes.data(), bytes.size(), "m", fold ? &hooks : nullptr, &doc, &root, &err), 0) << err.msg;
    size_t n = pkl_doc_objects(doc);
    pkl_free(doc);
    dcp_fold_free(&f);
    return n;
}

TEST(DcpMetaFold, ThePickleObjectsAliveStayFewHoweverManyChunks) {
    std::vector<size_t> folded;
    for (int ranks : {64, 512}) {
        std::string dir = make_tmpdir("fold");
        std::vector<dcp_record> recs = grid_save(ranks, 2, 24);
        fsdp_err err{};
        ASSERT_EQ(dcp_write_metadata(dir.c_str(), recs.data(), recs.size(), &err), 0) << err.msg;
        std::string bytes = read_file(dir + "/.metadata");
        size_t with = peak_objects(bytes, true), without = peak_objects(bytes, false);
        EXPECT_GT(without, recs.size() * 5) << ranks << " ranks: the whole tree";
        EXPECT_LT(with, recs.size() / 2 + 2000) << ranks << " ranks: folded";
        folded.push_back(with);
        rm_rf(dir);
    }
    // 8 times the chunks: the folded peak grows by the one tensor's chunk list on the stack, not 8 times
    EXPECT_LT(folded[1], folded[0] * 4) << folded[0] << " -> " << folded[1];
}

// ---- hand-made pickles that put the folded classes where they do not belong ----

const char *kMeta = "torch.distributed.checkpoint.metadata";

void obj(pkl_w *w, const char *mod, const char *cls) {
    pkl_w_global(w, mod, cls);
    pkl_w_empty_tuple(w);
    pkl_w_newobj(w);
}

// ChunkStorageMetadata(offsets, sizes); bad: offsets of another length than sizes
void chunk(pkl_w *w, int64_t off, int64_t size, bool bad = false) {
    obj(w, kMeta, "ChunkStorageMetadata");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "offsets");
    int64_t o[2] = {off, 0}, z[1] = {size};
    pkl_w_size(w, o, bad ? 2 : 1);
    pkl_w_str(w, "sizes");
    pkl_w_size(w, z, 1);
    pkl_w_setitems(w);
    pkl_w_build(w);
}

void index(pkl_w *w, const char *fqn, int64_t off) {
    obj(w, kMeta, "MetadataIndex");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "fqn");
    pkl_w_str(w, fqn);
    pkl_w_str(w, "offset");
    pkl_w_size(w, &off, 1);
    pkl_w_setitems(w);
    pkl_w_build(w);
}

void storage(pkl_w *w, const char *file, int64_t off, int64_t len) {
    obj(w, "torch.distributed.checkpoint.filesystem", "_StorageInfo");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "relative_path");
    pkl_w_str(w, file);
    pkl_w_str(w, "offset");
    pkl_w_int(w, off);
    pkl_w_str(w, "length");
    pkl_w_int(w, len);
    pkl_w_setitems(w);
    pkl_w_build(w);
}

// TensorStorageMetadata of a float32 [4] tensor whose chunks list the callback writes
template <class F> void tensor(pkl_w *w, F chunks) {
    obj(w, kMeta, "TensorStorageMetadata");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "properties");
    obj(w, kMeta, "TensorProperties");
    pkl_w_mark(w);
    pkl_w_global(w, "torch", "float32");
    pkl_w_tuple(w);
    pkl_w_build(w);
    pkl_w_str(w, "size");
    int64_t four = 4;
    pkl_w_size(w, &four, 1);
    pkl_w_str(w, "chunks");
    pkl_w_empty_list(w);
    pkl_w_mark(w);
    chunks();
    pkl_w_appends(w);
    pkl_w_setitems(w);
    pkl_w_build(w);
}

// Metadata(state_dict_metadata = {"w": value()}, storage_data = {entries()})
template <class V, class S> std::string metadata(V value, S entries) {
    pkl_w w;
    pkl_w_init(&w);
    pkl_w_proto(&w, 2);
    obj(&w, kMeta, "Metadata");
    pkl_w_empty_dict(&w);
    pkl_w_mark(&w);
    pkl_w_str(&w, "state_dict_metadata");
    pkl_w_empty_dict(&w);
    pkl_w_mark(&w);
    pkl_w_str(&w, "w");
    value(&w);
    pkl_w_setitems(&w);
    pkl_w_str(&w, "storage_data");
    pkl_w_empty_dict(&w);
    entries(&w);
    pkl_w_setitems(&w);
    pkl_w_build(&w);
    pkl_w_stop(&w);
    std::string out((const char *)w.buf, w.len);
    pkl_w_free(&w);
    return out;
}

TEST(DcpMetaFold, FoldedClassesOutOfPlaceGetTheWholeTreesErrors) {
    auto good_chunks = [](pkl_w *w) {
        return [w] { chunk(w, 0, 2), chunk(w, 2, 2); };
    };
    auto pair = [](pkl_w *w, int64_t off, const char *file) {
        pkl_w_mark(w);
        index(w, "w", off);
        storage(w, file, 16 * off, 8);
        pkl_w_setitems(w);
    };
    std::vector<std::pair<std::string, std::string>> cases = {
        {"a valid one", metadata([&](pkl_w *w) { tensor(w, good_chunks(w)); },
                                 [&](pkl_w *w) { pair(w, 0, "__0_0.distcp"), pair(w, 2, "__1_0.distcp"); })},
        {"a chunk as the tensor's metadata", metadata([](pkl_w *w) { chunk(w, 0, 4); }, [](pkl_w *) {})},
        {"a storage record as the tensor's metadata",
         metadata([](pkl_w *w) { storage(w, "__0_0.distcp", 0, 16); }, [](pkl_w *) {})},
        {"an index among the chunks", metadata([&](pkl_w *w) { tensor(w, [w] { chunk(w, 0, 2), index(w, "w", 2); }); },
                                               [](pkl_w *) {})},
        {"a malformed chunk after folded ones",
         metadata([&](pkl_w *w) { tensor(w, [w] { chunk(w, 0, 2), chunk(w, 2, 2, true); }); }, [](pkl_w *) {})},
        {"a storage key and an index value",
         metadata([&](pkl_w *w) { tensor(w, good_chunks(w)); },
                  [](pkl_w *w) {
                      pkl_w_mark(w);
                      storage(w, "__0_0.distcp", 0, 8);
                      index(w, "w", 0);
                      pkl_w_setitems(w);
                  })},
        {"a folded pair, then a chunk as a key",
         metadata([&](pkl_w *w) { tensor(w, good_chunks(w)); },
                  [&](pkl_w *w) {
                      pair(w, 0, "__0_0.distcp");
                      pkl_w_mark(w);
                      chunk(w, 2, 2);
                      storage(w, "__1_0.distcp", 32, 8);
                      pkl_w_setitems(w);
                  })},
        {"a file name with a slash", metadata([&](pkl_w *w) { tensor(w, good_chunks(w)); },
                                              [&](pkl_w *w) { pair(w, 0, "../x"), pair(w, 2, "__1_0.distcp"); })},
        {"a later entry for the same chunk wins",
         metadata([&](pkl_w *w) { tensor(w, good_chunks(w)); },
                  [&](pkl_w *w) { pair(w, 0, "__0_0.distcp"), pair(w, 2, "__1_0.distcp"), pair(w, 0, "__2_0.distcp"); })},
    };
    int refused = 0;
    for (const auto &c : cases) {
        Parsed folded, tree;
        parse(c.second, 1, DCP_PARSE_CONSUME, &folded);
        parse(c.second, 1, DCP_PARSE_TREE, &tree);
        expect_same(folded, tree, c.first);
        refused += folded.rc != 0;
        if (c.first == "a valid one" || c.first == "a later entry for the same chunk wins") {
            ASSERT_EQ(folded.rc, 0) << c.first << ": " << folded.msg;
            ASSERT_EQ(folded.n, 1u);
            ASSERT_EQ(folded.items[0].n_chunks, 2u);
        }
        if (c.first == "a later entry for the same chunk wins") {
            EXPECT_STREQ(folded.items[0].chunks[0].where.relative_path, "__2_0.distcp");
        }
        if (c.first == "a chunk as the tensor's metadata") {
            EXPECT_NE(folded.msg.find("ChunkStorageMetadata"), std::string::npos) << folded.msg;
        }
    }
    EXPECT_EQ(refused, (int)cases.size() - 2);
}

// torch's own .metadata of a 4096-rank 405B memoizes over 10M objects (protocol 4 memoizes every one) and
// fetches few of them again: folding keeps only those (a dense memo), so the whole-tree limit does not apply.
TEST(DcpMetaFold, AMemoOfMoreThanTenMillionEntriesParsesWhenFolding) {
    const uint32_t n = 10500000, late = 10400000;
    std::string b = "\x80\x04]"; // PROTO 4, EMPTY_LIST
    b.reserve((size_t)n * 3 + n / 500 + 32);
    for (uint32_t i = 0; i < n; i++) {
        if (i % 1000 == 0) b += '('; // MARK: batches of 1000 as Python's pickler writes them
        b += 'K';
        b += (char)(i % 251);
        b += '\x94'; // MEMOIZE: entry i
        if (i % 1000 == 999 || i + 1 == n) b += 'e'; // APPENDS
    }
    b += 'j'; // LONG_BINGET late
    for (int k = 0; k < 4; k++) b += (char)((late >> (8 * k)) & 0xff);
    b += "a."; // APPEND, STOP
    pkl_fold none{};
    pkl_doc *doc = nullptr;
    const pkl_obj *root = nullptr;
    fsdp_err err{};
    ASSERT_EQ(pkl_parse_fold(b.data(), b.size(), "big", &none, &doc, &root, &err), 0) << err.msg;
    ASSERT_EQ(root->kind, PKL_LIST);
    ASSERT_EQ(root->n, (size_t)n + 1);
    EXPECT_EQ(root->items[n]->i, (int64_t)(late % 251));
    EXPECT_EQ(root->items[7]->i, 7);
    pkl_free(doc);
    // the whole tree keeps every entry and refuses so many
    EXPECT_NE(pkl_parse(b.data(), b.size(), "big", &doc, &root, &err), 0);
    EXPECT_NE(std::string(err.msg).find("beyond the limit"), std::string::npos) << err.msg;
}

} // namespace
