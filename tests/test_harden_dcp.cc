// Issue 13, items 5-7 for DCP and safetensors: checked arithmetic on sizes from files (no UB, no
// 18446744073709551612-byte tensors, no 4 TiB allocations), exact chunk tiling checks, and the
// metadata / state bookkeeping at scale (40k keys, 40k chunks, 20,000 layers) without quadratic
// steps. Run under `make asan` too: UBSan aborts on the signed overflows these reproduce.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dcp_layout.h"
#include "test_util.h"

extern "C" {
#include "ckpt/dcp.h"
#include "ckpt/dcp_chunks.h"
#include "ckpt/pickle.h"
#include "ckpt/reader.h"
#include "ckpt/safetensors.h"
#include "decoder/decoder_params.h"
#include "runtime/shard.h"
#include "runtime/state.h"
}

using namespace fsdp_test;

namespace {

const char *const META = "torch.distributed.checkpoint.metadata";

// ---- a Metadata pickle written op by op (deterministic, any values, including corrupt ones) ----

struct Chunk {
    std::vector<int64_t> off, sz;
    std::string file = "__0_0.distcp";
    uint64_t at = 0, len = 64;
    bool storage = true;
};
struct Tensor {
    std::string fqn;
    std::vector<int64_t> shape;
    std::vector<Chunk> chunks;
    std::string dtype = "float32";
};

void obj_begin(pkl_w *w, const char *mod, const char *cls) {
    pkl_w_global(w, mod, cls);
    pkl_w_empty_tuple(w);
    pkl_w_newobj(w);
}

void tensor_props(pkl_w *w, const std::string &dtype) {
    obj_begin(w, META, "TensorProperties");
    pkl_w_mark(w);
    pkl_w_global(w, "torch", dtype.c_str());
    pkl_w_global(w, "torch.serialization", "_get_layout");
    pkl_w_str(w, "torch.strided");
    pkl_w_tuple_n(w, 1);
    pkl_w_reduce(w);
    pkl_w_bool(w, 0);
    pkl_w_global(w, META, "_MEM_FORMAT_ENCODING");
    pkl_w_int(w, 0);
    pkl_w_tuple_n(w, 1);
    pkl_w_reduce(w);
    pkl_w_bool(w, 0);
    pkl_w_tuple(w);
    pkl_w_build(w);
}

void storage_key(pkl_w *w, const std::string &fqn, const std::vector<int64_t> &off) {
    obj_begin(w, META, "MetadataIndex");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "fqn");
    pkl_w_str(w, fqn.c_str());
    pkl_w_str(w, "offset");
    pkl_w_size(w, off.data(), (int)off.size());
    pkl_w_setitems(w);
    pkl_w_build(w);
}

void storage_info(pkl_w *w, const Chunk &c) {
    obj_begin(w, "torch.distributed.checkpoint.filesystem", "_StorageInfo");
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    pkl_w_str(w, "relative_path");
    pkl_w_str(w, c.file.c_str());
    pkl_w_str(w, "offset");
    pkl_w_int(w, (int64_t)c.at);
    pkl_w_str(w, "length");
    pkl_w_int(w, (int64_t)c.len);
    pkl_w_setitems(w);
    pkl_w_build(w);
}

// A Metadata pickle of the tensors (a key may repeat, for the duplicate-key case).
std::string meta_pickle(const std::vector<Tensor> &ts) {
    pkl_w w;
    pkl_w_init(&w);
    pkl_w_proto(&w, 2);
    obj_begin(&w, META, "Metadata");
    pkl_w_empty_dict(&w);
    pkl_w_mark(&w);
    pkl_w_str(&w, "state_dict_metadata");
    pkl_w_empty_dict(&w);
    for (const Tensor &t : ts) {
        pkl_w_mark(&w);
        pkl_w_str(&w, t.fqn.c_str());
        obj_begin(&w, META, "TensorStorageMetadata");
        pkl_w_empty_dict(&w);
        pkl_w_mark(&w);
        pkl_w_str(&w, "properties");
        tensor_props(&w, t.dtype);
        pkl_w_str(&w, "size");
        pkl_w_size(&w, t.shape.data(), (int)t.shape.size());
        pkl_w_str(&w, "chunks");
        pkl_w_empty_list(&w);
        pkl_w_mark(&w);
        for (const Chunk &c : t.chunks) {
            obj_begin(&w, META, "ChunkStorageMetadata");
            pkl_w_empty_dict(&w);
            pkl_w_mark(&w);
            pkl_w_str(&w, "offsets");
            pkl_w_size(&w, c.off.data(), (int)c.off.size());
            pkl_w_str(&w, "sizes");
            pkl_w_size(&w, c.sz.data(), (int)c.sz.size());
            pkl_w_setitems(&w);
            pkl_w_build(&w);
        }
        pkl_w_appends(&w);
        pkl_w_setitems(&w);
        pkl_w_build(&w);
        pkl_w_setitems(&w);
    }
    pkl_w_str(&w, "storage_data");
    pkl_w_empty_dict(&w);
    for (const Tensor &t : ts)
        for (const Chunk &c : t.chunks) {
            if (!c.storage) continue;
            pkl_w_mark(&w);
            storage_key(&w, t.fqn, c.off);
            storage_info(&w, c);
            pkl_w_setitems(&w);
        }
    pkl_w_str(&w, "version");
    pkl_w_str(&w, "1.0.0");
    pkl_w_setitems(&w);
    pkl_w_build(&w);
    pkl_w_stop(&w);
    std::string s((const char *)w.buf, w.len);
    pkl_w_free(&w);
    return s;
}

const int64_t P62 = (int64_t)1 << 62, P40 = (int64_t)1 << 40;

// item 6: a size whose element count overflows int64 (2^62 x 4); the one chunk claims it all
std::string item6_volume_overflow() {
    Tensor t{"w", {P62, 4}, {}};
    t.chunks.push_back(Chunk{{0, 0}, {P62, 4}});
    return meta_pickle({t});
}

// item 6: offsets + sizes past INT64_MAX; with the old checks the chunks "covered" the tensor
std::string item6_offset_plus_size_overflow() {
    Tensor t{"w", {8}, {}};
    t.chunks.push_back(Chunk{{0}, {4}});
    t.chunks.push_back(Chunk{{INT64_MAX - 1}, {4}, "__0_0.distcp", 64});
    return meta_pickle({t});
}

// item 7: 2^40 float32 elements over a 24-byte storage record
std::string item7_2p40_over_24_bytes() {
    Tensor t{"w", {P40}, {}};
    t.chunks.push_back(Chunk{{0}, {P40}, "__0_0.distcp", 0, 24});
    return meta_pickle({t});
}

std::string parse_err(const std::string &bytes, const char *what = "ck/.metadata") {
    dcp_item *items = nullptr;
    size_t n = 0;
    char ver[32];
    fsdp_err err;
    err.msg[0] = 0;
    int rc = dcp_parse_metadata(bytes.data(), bytes.size(), what, &items, &n, ver, sizeof ver, &err);
    if (rc == 0) {
        dcp_items_free(items, n);
        return "";
    }
    EXPECT_EQ(rc, FSDP_E_FORMAT) << err.msg;
    return err.msg;
}

// A DCP directory holding `meta` as .metadata and a data file of `data_bytes` zero bytes.
std::string meta_dir(const std::string &meta, size_t data_bytes = 64) {
    std::string d = make_tmpdir("fsdp-hdcp");
    write_file(d + "/.metadata", meta);
    write_file(d + "/__0_0.distcp", std::string(data_bytes, '\0'));
    return d;
}

std::string open_err(const std::string &dir) {
    dcp_ckpt *c = nullptr;
    fsdp_err err;
    err.msg[0] = 0;
    if (dcp_open(dir.c_str(), &c, &err) == 0) {
        dcp_close(c);
        return "";
    }
    return err.msg;
}

bool has(const std::string &s, const std::string &sub) { return s.find(sub) != std::string::npos; }

// ---- chunk layouts checked directly (dcp_check_chunk_bounds + dcp_check_tiling) ----

struct Layout : DcpLayout {
    Layout() = default;
    Layout(std::vector<int64_t> s) { shape = std::move(s); }
    std::string check() {
        dcp_item it = item();
        fsdp_err err;
        err.msg[0] = 0;
        if (dcp_check_tensor_size("m", &it, &err) || dcp_check_chunk_bounds("m", &it, &err) ||
            dcp_check_tiling("m", &it, &err))
            return err.msg;
        return "";
    }
};

// Cell counts of a small layout, by brute force: 0 exact, 1 some cell covered twice, 2 a hole only.
int brute_force(const Layout &l) {
    int nd = (int)l.shape.size();
    int64_t cells = 1;
    for (int64_t s : l.shape) cells *= s;
    std::vector<int> count((size_t)cells, 0);
    for (const dcp_chunk &c : l.chunks) {
        int64_t v = 1;
        for (int d = 0; d < nd; d++) v *= c.sizes[d];
        if (v == 0) continue;
        std::vector<int64_t> idx(nd, 0);
        for (int64_t e = 0; e < v; e++) {
            int64_t flat = 0;
            for (int d = 0; d < nd; d++) flat = flat * l.shape[d] + c.offsets[d] + idx[d];
            count[(size_t)flat]++;
            for (int d = nd - 1; d >= 0; d--) {
                if (++idx[d] < c.sizes[d]) break;
                idx[d] = 0;
            }
        }
    }
    bool twice = false, hole = false;
    for (int c : count) twice |= c > 1, hole |= c == 0;
    return twice ? 1 : hole ? 2 : 0;
}

// A random guillotine partition of [0, shape): split a random box along a random dim, repeatedly.
void guillotine(std::mt19937 &g, const std::vector<int64_t> &off, const std::vector<int64_t> &sz, int depth,
                Layout &out) {
    int nd = (int)sz.size();
    std::vector<int> splittable;
    for (int d = 0; d < nd; d++)
        if (sz[d] > 1) splittable.push_back(d);
    if (depth == 0 || splittable.empty() || g() % 4 == 0) {
        out.add(off, sz);
        return;
    }
    int d = splittable[g() % splittable.size()];
    int64_t cut = 1 + (int64_t)(g() % (uint64_t)(sz[d] - 1));
    std::vector<int64_t> o2 = off, s1 = sz, s2 = sz;
    s1[d] = cut;
    o2[d] = off[d] + cut;
    s2[d] = sz[d] - cut;
    guillotine(g, off, s1, depth - 1, out);
    guillotine(g, o2, s2, depth - 1, out);
}

}  // namespace

// ---- item 6: signed overflow in the chunk checks ------------------------------------------------

TEST(HardenDcpOverflow, VolumeOverflowIsCorruptMetadata) {
    // before: volume() wrapped 2^62 * 4 to 0 (UB), the chunk "covered" the 0-element tensor and
    // `ckpt inspect` printed 18446744073709551612 bytes
    std::string e = parse_err(item6_volume_overflow());
    EXPECT_TRUE(has(e, "ck/.metadata: w: corrupt .metadata")) << e;
    EXPECT_TRUE(has(e, "more elements than int64 can count")) << e;
    // a chunk whose own sizes overflow, inside a valid tensor size
    Tensor t{"w", {4, 4}, {}};
    t.chunks.push_back(Chunk{{0, 0}, {P62, P62}});
    e = parse_err(meta_pickle({t}));
    EXPECT_TRUE(has(e, "corrupt .metadata: chunk 0: sizes [4611686018427387904, 4611686018427387904]")) << e;
    // numel fits but the byte count does not (2^61 x float64 = 2^64 bytes)
    Tensor b{"b", {(int64_t)1 << 61}, {}, "float64"};
    b.chunks.push_back(Chunk{{0}, {(int64_t)1 << 61}});
    e = parse_err(meta_pickle({b}));
    EXPECT_TRUE(has(e, "b: corrupt .metadata: size [2305843009213693952] of float64 is more than 2^63 bytes")) << e;
    // a negative dim
    Tensor n{"n", {-4}, {}};
    e = parse_err(meta_pickle({n}));
    EXPECT_TRUE(has(e, "n: corrupt .metadata: size [-4] has a negative dimension")) << e;
}

TEST(HardenDcpOverflow, OffsetPlusSizeOverflowIsCorruptMetadata) {
    // before: offsets[d] + sizes[d] overflowed (UB) to a negative index, passed the bounds check,
    // and with the chunk [0, 4) the two "covered" all 8 elements
    std::string e = parse_err(item6_offset_plus_size_overflow());
    EXPECT_TRUE(has(e, "w: corrupt .metadata: chunk 1: offset 9223372036854775806 + size 4 of dim 0 overflows int64"))
        << e;
    // the same reached through dcp_open, naming the file
    std::string d = meta_dir(item6_offset_plus_size_overflow());
    e = open_err(d);
    EXPECT_TRUE(has(e, d + "/.metadata: w: corrupt .metadata")) << e;
    rm_rf(d);
}

TEST(HardenDcpOverflow, RankLocalMergeOfOverflowingSizes) {
    // before: the rank-local merge summed `tot *= shape[d]` without a check
    std::string d = make_tmpdir("fsdp-hdcp");
    write_file(d + "/__0.metadata", item6_volume_overflow());
    write_file(d + "/__0_0.distcp", std::string(64, '\0'));
    std::string e = open_err(d);
    EXPECT_TRUE(has(e, d + "/__0.metadata: w: corrupt .metadata")) << e;
    rm_rf(d);
}

TEST(HardenDcpOverflow, EmptyChunkWithAHugeOffsetIsSkippedOnRead) {
    // empty chunks may carry any offset; before, dcp_read_box still formed offsets + sizes of such
    // a chunk (INT64_MAX + 4: UB, which UBSan reports in `make asan`)
    std::string d = make_tmpdir("fsdp-hdcp");
    fsdp_err err;
    dcp_file_writer w;
    ASSERT_EQ(dcp_file_open(&w, d.c_str(), 0, &err), 0) << err.msg;
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t shape[2] = {2, 4}, off[2] = {0, 0};
    dcp_record rec;
    ASSERT_EQ(dcp_file_add_tensor(&w, "w", FSDP_DT_F32, 2, shape, off, shape, v, &rec, &err), 0) << err.msg;
    ASSERT_EQ(dcp_file_close(&w, &err), 0) << err.msg;
    Tensor t{"w", {2, 4}, {}};
    t.chunks.push_back(Chunk{{0, INT64_MAX}, {0, 4}, "", 0, 0, false});
    t.chunks.push_back(Chunk{{0, 0}, {2, 4}, rec.where.relative_path, rec.where.offset, rec.where.length});
    write_file(d + "/.metadata", meta_pickle({t}));
    dcp_ckpt *c;
    ASSERT_EQ(dcp_open(d.c_str(), &c, &err), 0) << err.msg;
    int64_t o[2] = {0, 0}, len[2] = {2, 4};
    float back[8];
    ASSERT_EQ(dcp_read_box(c, 0, o, len, back, FSDP_DT_F32, &err), 0) << err.msg;
    for (int i = 0; i < 8; i++) EXPECT_EQ(back[i], v[i]);
    dcp_close(c);
    rm_rf(d);
}

TEST(HardenDcpOverflow, ShardRowsOfHugeDims) {
    // before: (d0 + world - 1) overflowed for d0 near INT64_MAX (UB; negative rows)
    for (int64_t d0 : {INT64_MAX, INT64_MAX - 1, (int64_t)1 << 62, (int64_t)7}) {
        for (int world : {2, 3, 7}) {
            int64_t next = 0;
            for (int r = 0; r < world; r++) {
                int64_t r0, rows;
                shard_rows(d0, world, r, &r0, &rows);
                ASSERT_GE(rows, 0) << d0 << " " << world << " " << r;
                if (rows > 0) {
                    EXPECT_EQ(r0, next) << d0 << " " << world << " " << r;
                    next = r0 + rows;
                } else {
                    EXPECT_EQ(r0, d0);
                }
            }
            EXPECT_EQ(next, d0) << d0 << " " << world;
        }
    }
}

// ---- `ckpt inspect` / `ckpt diff` of the crafted files --------------------------------------------

TEST(HardenDcpCli, InspectOfCraftedMetadataIsCorruptExitOne) {
    struct {
        const char *name;
        std::string meta;
        const char *msg;
    } cases[] = {{"item6-volume-overflow", item6_volume_overflow(), "more elements than int64 can count"},
                 {"item6-offset-plus-size-overflow", item6_offset_plus_size_overflow(), "overflows int64"},
                 {"item7-2p40-over-24-bytes", item7_2p40_over_24_bytes(), "needs 4398046511104 bytes"}};
    for (auto &c : cases) {
        std::string d = meta_dir(c.meta);
        std::string out;
        int rc = run_cmd(fsdp_run_bin() + " ckpt inspect " + d, &out);
        EXPECT_EQ(rc, 1) << c.name << ": " << out;
        EXPECT_TRUE(has(out, d + "/.metadata: w: corrupt .metadata")) << c.name << ": " << out;
        EXPECT_TRUE(has(out, c.msg)) << c.name << ": " << out;
        EXPECT_FALSE(has(out, "18446744073709551612")) << out;
        rc = run_cmd(fsdp_run_bin() + " ckpt diff " + d + " " + d, &out);
        EXPECT_EQ(rc, 1) << c.name << ": " << out;
        EXPECT_TRUE(has(out, "corrupt .metadata")) << c.name << ": " << out;
        rm_rf(d);
    }
}

// The crafted files are committed to the fuzz corpus byte for byte as these helpers write them; with
// FSDP_REWRITE_CORPUS=1 in the environment the test writes them first (after a change of the helpers).
TEST(HardenDcpCli, CraftedFilesAreInTheFuzzCorpus) {
    const char *rewrite = getenv("FSDP_REWRITE_CORPUS");
    if (rewrite && !strcmp(rewrite, "1")) {
        write_file("tests/fuzz/corpus/dcp_meta/item6-volume-overflow", item6_volume_overflow());
        write_file("tests/fuzz/corpus/dcp_meta/item6-offset-plus-size-overflow", item6_offset_plus_size_overflow());
        write_file("tests/fuzz/corpus/dcp_meta/item7-2p40-over-24-bytes", item7_2p40_over_24_bytes());
    }
    EXPECT_EQ(read_file("tests/fuzz/corpus/dcp_meta/item6-volume-overflow"), item6_volume_overflow());
    EXPECT_EQ(read_file("tests/fuzz/corpus/dcp_meta/item6-offset-plus-size-overflow"),
              item6_offset_plus_size_overflow());
    EXPECT_EQ(read_file("tests/fuzz/corpus/dcp_meta/item7-2p40-over-24-bytes"), item7_2p40_over_24_bytes());
}

// ---- item 7: sizes from files are validated before anything allocates ---------------------------------

TEST(HardenDcpSizes, DcpClaimOf2p40ElementsOver24BytesIsCorrupt) {
    // before: dcp_open accepted it (the chunk covers the tensor, the 24 bytes lie in the file) and
    // `ckpt inspect` reported 4 TiB; a read then asked malloc for 4 TiB
    std::string d = meta_dir(item7_2p40_over_24_bytes(), 24);
    std::string e = open_err(d);
    EXPECT_TRUE(has(e, d + "/.metadata: w: corrupt .metadata: chunk 0 (sizes [1099511627776] of float32) needs "
                           "4398046511104 bytes, but its storage in __0_0.distcp holds only 24"))
        << e;
    ckpt_reader *r = nullptr;
    fsdp_err err;
    EXPECT_EQ(ckpt_open(d.c_str(), CKPT_AUTO, &r, &err), FSDP_E_FORMAT);
    EXPECT_EQ(r, nullptr);
    rm_rf(d);
    // the same bound per chunk: each of two chunks needs 8 bytes, the second's record holds 4
    Tensor t{"w", {4}, {}};
    t.chunks.push_back(Chunk{{0}, {2}, "__0_0.distcp", 0, 8});
    t.chunks.push_back(Chunk{{2}, {2}, "__0_0.distcp", 8, 4});
    std::string e2 = parse_err(meta_pickle({t}));
    EXPECT_TRUE(has(e2, "chunk 1 (sizes [2] of")) << e2;
    EXPECT_TRUE(has(e2, "needs 8 bytes, but its storage in __0_0.distcp holds only 4")) << e2;
}

TEST(HardenDcpSizes, SafetensorsClaimOf2p40ElementsOver24BytesIsCorrupt) {
    // (the safetensors reader already matched data_offsets against dtype x shape exactly; this pins it)
    std::string hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1099511627776],\"data_offsets\":[0,24]}}";
    while (hdr.size() % 8) hdr += ' ';
    std::string file(8, '\0');
    uint64_t n = hdr.size();
    for (int i = 0; i < 8; i++) file[i] = (char)(n >> (8 * i));
    file += hdr + std::string(24, '\0');
    std::string d = make_tmpdir("fsdp-hdcp");
    write_file(d + "/m.safetensors", file);
    st_reader *r = nullptr;
    fsdp_err err;
    EXPECT_EQ(st_open(&r, (d + "/m.safetensors").c_str(), &err), FSDP_E_FORMAT);
    EXPECT_TRUE(has(err.msg, "tensor 'w': corrupt header: shape [1099511627776] of F32 needs 4398046511104 bytes but "
                             "data_offsets [0, 24] hold 24"))
        << err.msg;
    std::string out;
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " ckpt inspect " + d + "/m.safetensors", &out), 1) << out;
    EXPECT_TRUE(has(out, "corrupt header")) << out;
    // a shape whose byte count overflows: corrupt, not an allocation
    hdr = "{\"w\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,8]}}";
    file.assign(8, '\0');
    n = hdr.size();
    for (int i = 0; i < 8; i++) file[i] = (char)(n >> (8 * i));
    file += hdr + std::string(8, '\0');
    write_file(d + "/m.safetensors", file);
    EXPECT_EQ(st_open(&r, (d + "/m.safetensors").c_str(), &err), FSDP_E_FORMAT);
    EXPECT_TRUE(has(err.msg, "corrupt header: shape [2305843009213693952] of F64 overflows")) << err.msg;
    rm_rf(d);
}

// ---- the tiling check is exact ---------------------------------------------------------------------

TEST(HardenDcpTiling, RandomLayoutsAgreeWithCellCounts) {
    std::mt19937 g(13);
    int exact = 0, overlap = 0, hole = 0;
    for (int iter = 0; iter < 3000; iter++) {
        Layout l;
        int nd = 1 + (int)(g() % 4);
        for (int d = 0; d < nd; d++) l.shape.push_back(1 + (int64_t)(g() % 5));
        std::vector<int64_t> zero(nd, 0);
        if (iter % 3 == 0) {
            // random boxes: rarely a tiling
            int nb = 1 + (int)(g() % 6);
            for (int b = 0; b < nb; b++) {
                std::vector<int64_t> o, s;
                for (int d = 0; d < nd; d++) {
                    int64_t a = (int64_t)(g() % (uint64_t)l.shape[d]);
                    o.push_back(a);
                    s.push_back(1 + (int64_t)(g() % (uint64_t)(l.shape[d] - a)));
                }
                l.add(o, s);
            }
        } else {
            guillotine(g, zero, l.shape, 6, l);
            int mutate = (int)(g() % 5);
            size_t k = g() % l.chunks.size();
            if (mutate == 1 && l.chunks.size() > 1) {
                l.chunks.erase(l.chunks.begin() + (long)k); // a hole
            } else if (mutate == 2) {
                l.chunks.push_back(l.chunks[k]); // a duplicate
            } else if (mutate == 3) {
                int d = (int)(g() % nd); // grow one chunk by a row where it can
                if (l.chunks[k].offsets[d] > 0) l.chunks[k].offsets[d]--, l.chunks[k].sizes[d]++;
                else if (l.chunks[k].sizes[d] < l.shape[d]) l.chunks[k].sizes[d]++;
            } else if (mutate == 4) {
                l.add(zero, std::vector<int64_t>(nd, 0)); // an empty chunk: harmless
            }
            std::shuffle(l.chunks.begin(), l.chunks.end(), g);
        }
        int truth = brute_force(l);
        std::string e = l.check();
        if (truth == 0) {
            EXPECT_EQ(e, "") << iter;
            exact++;
        } else if (truth == 1) {
            EXPECT_TRUE(has(e, "two chunks overlap")) << iter << ": " << e;
            overlap++;
        } else {
            EXPECT_TRUE(has(e, "(the checkpoint is missing pieces)")) << iter << ": " << e;
            hole++;
        }
    }
    // every kind was seen often
    EXPECT_GT(exact, 500);
    EXPECT_GT(overlap, 300);
    EXPECT_GT(hole, 200);
}

TEST(HardenDcpTiling, NamedCasesAndScalars) {
    Layout a{{4, 2}};
    a.add({0, 0}, {2, 2});
    a.add({2, 0}, {2, 2});
    EXPECT_EQ(a.check(), "");
    a.add({1, 1}, {2, 1});
    EXPECT_TRUE(has(a.check(), "m: t: two chunks overlap: chunk 0 (offsets [0, 0], sizes [2, 2]) and chunk 2 "
                               "(offsets [1, 1], sizes [2, 1])"))
        << a.check();
    Layout b{{4, 2}};
    b.add({0, 0}, {2, 2});
    EXPECT_TRUE(has(b.check(), "m: t: the chunks cover 4 of 8 elements (the checkpoint is missing pieces)"))
        << b.check();
    // out of bounds keeps its message
    b.add({3, 0}, {2, 2});
    EXPECT_TRUE(has(b.check(), "chunk 1 reaches index 5 of dim 0 (size 4)")) << b.check();
    // empty shards (offset = dim size, as PyTorch >= 2.8 records them) are fine
    Layout c{{3, 2}};
    c.add({0, 0}, {2, 2});
    c.add({2, 0}, {1, 2});
    c.add({3, 0}, {0, 2});
    c.add({3, 0}, {0, 2});
    EXPECT_EQ(c.check(), "");
    // 0-d tensors: exactly one chunk
    Layout s{{}};
    EXPECT_TRUE(has(s.check(), "cover 0 of 1")) << s.check();
    s.add({}, {});
    EXPECT_EQ(s.check(), "");
    s.add({}, {});
    EXPECT_TRUE(has(s.check(), "two chunks overlap")) << s.check();
    // a tensor with a zero dim and no chunks
    Layout z{{0, 5}};
    EXPECT_EQ(z.check(), "");
}

TEST(HardenDcpTiling, FortyThousandChunksInSeveralLayouts) {
    const int64_t n = 40000;
    // Shard(0) rows
    Layout rows{{n, 8}};
    for (int64_t i = 0; i < n; i++) rows.add({i, 0}, {1, 8});
    EXPECT_EQ(rows.check(), "");
    // a 200 x 200 grid of blocks
    Layout grid{{400, 600}};
    for (int64_t i = 0; i < 200; i++)
        for (int64_t j = 0; j < 200; j++) grid.add({2 * i, 3 * j}, {2, 3});
    EXPECT_EQ(grid.check(), "");
    // strips both ways: the layout that costs a sweep along one dim O(n^2) pair tests
    Layout mixed{{n / 2, n}};
    for (int64_t i = 0; i < n / 2; i++) mixed.add({i, 0}, {1, n / 2});
    for (int64_t j = 0; j < n / 2; j++) mixed.add({0, n / 2 + j}, {n / 2, 1});
    EXPECT_EQ(mixed.check(), "");
    // ... with one strip missing: the error names the count, or says the tiling fails, in bounded time
    Layout holed = mixed;
    holed.chunks.erase(holed.chunks.begin() + 12345);
    std::string e = holed.check();
    EXPECT_TRUE(has(e, "t: the chunks do not tile the tensor: they hold 799980000 elements for 800000000 (pieces are "
                       "missing or overlap)"))
        << e;
    // one extra chunk overlapping two rows of the 40k: found and named
    rows.add({n - 3, 2}, {2, 1});
    e = rows.check();
    EXPECT_TRUE(has(e, "two chunks overlap: chunk 39997 (offsets [39997, 0], sizes [1, 8]) and chunk 40000")) << e;
    // rows and a grid shuffled: the order of the chunk list does not matter
    std::mt19937 g(5);
    std::shuffle(grid.chunks.begin(), grid.chunks.end(), g);
    EXPECT_EQ(grid.check(), "");
}

// ---- rank-local metadata (`__<r>.metadata`, no .metadata) ---------------------------------------------

namespace {

// Writes rank r's data file and its rank-local metadata: rows [2r, 2r+2) of "w" [6, 4], the
// replicated "b" [3] and the value "step" = 5.
void write_rank_local(const std::string &dir, int r, int64_t row_off = -1) {
    fsdp_err err;
    dcp_file_writer w;
    ASSERT_EQ(dcp_file_open(&w, dir.c_str(), r, &err), 0) << err.msg;
    std::vector<float> wv(8), bv = {1.5f, 2.5f, 3.5f};
    for (int i = 0; i < 8; i++) wv[(size_t)i] = (float)(100 * r + i);
    int64_t shape[2] = {6, 4}, off[2] = {row_off < 0 ? 2 * r : row_off, 0}, sz[2] = {2, 4};
    int64_t bshape[1] = {3}, boff[1] = {0};
    dcp_record recs[3];
    ASSERT_EQ(dcp_file_add_tensor(&w, "w", FSDP_DT_F32, 2, shape, off, sz, wv.data(), &recs[0], &err), 0) << err.msg;
    ASSERT_EQ(dcp_file_add_tensor(&w, "b", FSDP_DT_F32, 1, bshape, boff, bshape, bv.data(), &recs[1], &err), 0);
    pkl_w pw;
    pkl_w_init(&pw);
    pkl_w_int(&pw, 5);
    ASSERT_EQ(dcp_file_add_value(&w, "train_state.step", pw.buf, pw.len, &recs[2], &err), 0) << err.msg;
    pkl_w_free(&pw);
    ASSERT_EQ(dcp_file_close(&w, &err), 0) << err.msg;
    ASSERT_EQ(dcp_write_metadata(dir.c_str(), recs, 3, &err), 0) << err.msg;
    ASSERT_EQ(rename((dir + "/.metadata").c_str(), (dir + "/__" + std::to_string(r) + ".metadata").c_str()), 0);
}

}  // namespace

TEST(HardenDcpRankLocal, ShardedTensorsMergeAndReadBack) {
    // before: each __<r>.metadata had to cover every tensor on its own ("the chunks cover 8 of 24
    // elements"), so no rank-local checkpoint of a sharded tensor could be opened
    std::string d = make_tmpdir("fsdp-hdcp");
    for (int r = 2; r >= 0; r--) write_rank_local(d, r);
    dcp_ckpt *c = nullptr;
    fsdp_err err;
    ASSERT_EQ(dcp_open(d.c_str(), &c, &err), 0) << err.msg;
    ASSERT_EQ(c->n, 3u);
    // keys in rank order of first appearance, whatever the directory order
    EXPECT_STREQ(c->items[0].fqn, "w");
    EXPECT_STREQ(c->items[1].fqn, "b");
    EXPECT_STREQ(c->items[2].fqn, "train_state.step");
    long wi = dcp_find(c, "w"), bi = dcp_find(c, "b"), si = dcp_find(c, "train_state.step");
    ASSERT_EQ(wi, 0);
    ASSERT_EQ(bi, 1);
    ASSERT_EQ(si, 2);
    EXPECT_EQ(dcp_find(c, "nope"), -1);
    EXPECT_EQ(c->items[wi].n_chunks, 3u);
    EXPECT_EQ(c->items[bi].n_chunks, 1u); // the replicated chunk is kept once
    int64_t off[2] = {0, 0}, len[2] = {6, 4};
    std::vector<float> all(24);
    ASSERT_EQ(dcp_read_box(c, (size_t)wi, off, len, all.data(), FSDP_DT_F32, &err), 0) << err.msg;
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 8; i++) EXPECT_EQ(all[(size_t)(8 * r + i)], (float)(100 * r + i));
    int64_t boff[1] = {0}, blen[1] = {3};
    float b[3];
    ASSERT_EQ(dcp_read_box(c, (size_t)bi, boff, blen, b, FSDP_DT_F32, &err), 0) << err.msg;
    EXPECT_EQ(b[2], 3.5f);
    EXPECT_STREQ(dcp_value_text(c, (size_t)si), "5");
    dcp_close(c);
    // a missing rank leaves a hole
    unlink((d + "/__1.metadata").c_str());
    std::string e = open_err(d);
    EXPECT_TRUE(has(e, d + "/__*.metadata: w: the chunks cover 16 of 24 elements (the checkpoint is missing pieces)"))
        << e;
    // a rank whose rows overlap another's
    write_rank_local(d, 1, 1);
    e = open_err(d);
    EXPECT_TRUE(has(e, "w: two chunks overlap: chunk 0 (offsets [0, 0], sizes [2, 4]) and chunk 1 (offsets [1, 0], "
                       "sizes [2, 4])"))
        << e;
    rm_rf(d);
}

TEST(HardenDcpRankLocal, RanksMustAgreeOnATensor) {
    std::string d = make_tmpdir("fsdp-hdcp");
    Tensor a{"w", {4, 2}, {}}, b{"w", {4, 3}, {}};
    a.chunks.push_back(Chunk{{0, 0}, {2, 2}});
    b.chunks.push_back(Chunk{{2, 0}, {2, 3}});
    write_file(d + "/__0.metadata", meta_pickle({a}));
    write_file(d + "/__1.metadata", meta_pickle({b}));
    write_file(d + "/__0_0.distcp", std::string(64, '\0'));
    std::string e = open_err(d);
    EXPECT_TRUE(has(e, "w: corrupt rank-local metadata: __1.metadata describes it differently (dtype or size)")) << e;
    rm_rf(d);
}

// ---- metadata details the rewrite must keep ----------------------------------------------------------

TEST(HardenDcpMetadata, StorageLookupByOffsetsAndDuplicateKeys) {
    // 1000 chunks listed in reverse, storage entries in another order: each chunk gets its own
    Tensor t{"w", {1000, 2}, {}};
    for (int64_t i = 999; i >= 0; i--) t.chunks.push_back(Chunk{{i, 0}, {1, 2}, "__0_0.distcp", 8 * (uint64_t)i, 8});
    std::string m = meta_pickle({t});
    dcp_item *items;
    size_t n;
    char ver[32];
    fsdp_err err;
    ASSERT_EQ(dcp_parse_metadata(m.data(), m.size(), "x", &items, &n, ver, sizeof ver, &err), 0) << err.msg;
    ASSERT_EQ(n, 1u);
    for (size_t k = 0; k < items[0].n_chunks; k++)
        EXPECT_EQ(items[0].chunks[k].where.offset, 8 * (uint64_t)items[0].chunks[k].offsets[0]) << k;
    dcp_items_free(items, n);
    // a chunk without a storage entry
    t.chunks[500].storage = false;
    std::string e = parse_err(meta_pickle({t}), "x");
    EXPECT_TRUE(has(e, "x: w: a chunk has no storage entry")) << e;
    // a key listed twice in state_dict_metadata
    Tensor s{"s", {2}, {}};
    s.chunks.push_back(Chunk{{0}, {2}});
    e = parse_err(meta_pickle({s, s}));
    EXPECT_TRUE(has(e, "s: corrupt .metadata: the key is listed twice in state_dict_metadata")) << e;
}

TEST(HardenDcpMetadata, WriterGroupsInterleavedRecords) {
    std::string d = make_tmpdir("fsdp-hdcp");
    fsdp_err err;
    dcp_file_writer w;
    ASSERT_EQ(dcp_file_open(&w, d.c_str(), 0, &err), 0) << err.msg;
    std::vector<dcp_record> recs(5);
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t shape[1] = {8}, o[4] = {6, 0, 2, 4}, sz[1] = {2};
    int64_t bshape[1] = {2}, boff[1] = {0};
    // w's chunks interleaved with another key, and out of order
    for (int k = 0; k < 4; k++) {
        int64_t off[1] = {o[k]};
        ASSERT_EQ(dcp_file_add_tensor(&w, "w", FSDP_DT_F32, 1, shape, off, sz, v + o[k], &recs[(size_t)(k < 2 ? k : k + 1)],
                                      &err),
                  0);
    }
    ASSERT_EQ(dcp_file_add_tensor(&w, "b", FSDP_DT_F32, 1, bshape, boff, bshape, v, &recs[2], &err), 0);
    ASSERT_EQ(dcp_file_close(&w, &err), 0);
    ASSERT_EQ(dcp_write_metadata(d.c_str(), recs.data(), recs.size(), &err), 0) << err.msg;
    dcp_ckpt *c;
    ASSERT_EQ(dcp_open(d.c_str(), &c, &err), 0) << err.msg;
    ASSERT_EQ(c->n, 2u);
    EXPECT_STREQ(c->items[0].fqn, "w");
    ASSERT_EQ(c->items[0].n_chunks, 4u);
    for (int k = 0; k < 4; k++) EXPECT_EQ(c->items[0].chunks[k].offsets[0], o[k]) << k; // in record order
    int64_t off0[1] = {0}, len[1] = {8};
    float back[8];
    ASSERT_EQ(dcp_read_box(c, 0, off0, len, back, FSDP_DT_F32, &err), 0) << err.msg;
    for (int i = 0; i < 8; i++) EXPECT_EQ(back[i], v[i]);
    dcp_close(c);
    // a value written twice is refused
    pkl_w pw;
    pkl_w_init(&pw);
    pkl_w_int(&pw, 1);
    ASSERT_EQ(dcp_file_open(&w, d.c_str(), 1, &err), 0) << err.msg;
    dcp_record vr[2];
    ASSERT_EQ(dcp_file_add_value(&w, "k", pw.buf, pw.len, &vr[0], &err), 0);
    ASSERT_EQ(dcp_file_add_value(&w, "k", pw.buf, pw.len, &vr[1], &err), 0);
    ASSERT_EQ(dcp_file_close(&w, &err), 0);
    pkl_w_free(&pw);
    EXPECT_EQ(dcp_write_metadata(d.c_str(), vr, 2, &err), FSDP_E_INVALID);
    EXPECT_TRUE(has(err.msg, "DCP save: key k written twice")) << err.msg;
    rm_rf(d);
}

// Real PyTorch checkpoints: every key is found at its own index through the new indexes.
TEST(HardenDcpMetadata, FixtureKeysAreFoundByName) {
    std::vector<std::string> dirs = {tiny("dcp_dtypes"), tiny("dcp_full_ws3"), tiny("dcp_model_ws2"),
                                     tiny("dcp_seed_ws1")};
    for (const char *e : {"dcp_safetensors_serialization", "dcp_tensor_step_and_bytes", "dcp_tutorial_layout"})
        dirs.push_back(fixtures_dir() + "/torch-2.11/everyday/" + e);
    for (const std::string &d : dirs) {
        if (!exists(d)) continue;
        dcp_ckpt *c;
        fsdp_err err;
        ASSERT_EQ(dcp_open(d.c_str(), &c, &err), 0) << err.msg;
        EXPECT_GT(c->n, 0u) << d;
        for (size_t i = 0; i < c->n; i++) EXPECT_EQ(dcp_find(c, c->items[i].fqn), (long)i) << d;
        dcp_close(c);
        ckpt_reader *r;
        ASSERT_EQ(ckpt_open(d.c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
        for (size_t i = 0; i < ckpt_count(r); i++) EXPECT_EQ(ckpt_find(r, ckpt_entry_at(r, i)->name), (long)i) << d;
        EXPECT_EQ(ckpt_find(r, "no.such.key"), -1);
        ckpt_close(r);
    }
}

// ---- scale: each of these took minutes with the quadratic code ------------------------------------

namespace {

// n keys of one chunk each, or (chunk_rows > 0) one tensor of n chunks of chunk_rows rows; record
// `skip` is left out of the metadata.
std::string write_keys_ckpt(size_t n, int64_t chunk_rows, size_t skip = SIZE_MAX) {
    std::string d = make_tmpdir("fsdp-hdcp");
    std::vector<dcp_record> recs(n);
    for (size_t i = 0; i < n; i++) {
        dcp_record &r = recs[i];
        memset(&r, 0, sizeof r);
        r.is_tensor = 1;
        r.dtype = FSDP_DT_F32;
        r.ndim = 2;
        if (chunk_rows) { // one tensor of n chunks
            snprintf(r.fqn, sizeof r.fqn, "w");
            r.shape[0] = (int64_t)n * chunk_rows, r.shape[1] = 4;
            r.offsets[0] = (int64_t)i * chunk_rows;
            r.sizes[0] = chunk_rows, r.sizes[1] = 4;
        } else { // n keys
            snprintf(r.fqn, sizeof r.fqn, "layers.%zu.attention.wq.weight", i);
            r.shape[0] = r.sizes[0] = 1, r.shape[1] = r.sizes[1] = 4;
        }
        snprintf(r.where.relative_path, sizeof r.where.relative_path, "__0_0.distcp");
        r.where.offset = 16 * i * (uint64_t)(chunk_rows ? chunk_rows : 1);
        r.where.length = 16 * (uint64_t)(chunk_rows ? chunk_rows : 1);
    }
    if (skip < n) recs.erase(recs.begin() + (long)skip);
    fsdp_err err;
    EXPECT_EQ(dcp_write_metadata(d.c_str(), recs.data(), recs.size(), &err), 0) << err.msg;
    int fd = open((d + "/__0_0.distcp").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, (off_t)(16 * n * (size_t)(chunk_rows ? chunk_rows : 1))), 0);
    close(fd);
    return d;
}

}  // namespace

TEST(HardenDcpScale, MetadataOf40kKeys) {
    const size_t n = 40000;
    std::string d = write_keys_ckpt(n, 0);
    dcp_ckpt *c;
    fsdp_err err;
    ASSERT_EQ(dcp_open(d.c_str(), &c, &err), 0) << err.msg;
    ASSERT_EQ(c->n, n);
    char name[64];
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "layers.%zu.attention.wq.weight", i);
        ASSERT_EQ(dcp_find(c, name), (long)i);
        ASSERT_EQ(c->items[i].chunks[0].where.offset, 16 * i);
    }
    dcp_close(c);
    ckpt_reader *r;
    ASSERT_EQ(ckpt_open(d.c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
    for (size_t i = 0; i < n; i += 7) {
        snprintf(name, sizeof name, "layers.%zu.attention.wq.weight", i);
        ASSERT_EQ(ckpt_find(r, name), (long)i);
        EXPECT_EQ(ckpt_entry_at(r, i)->nbytes, 16u);
    }
    ckpt_close(r);
    rm_rf(d);
}

TEST(HardenDcpScale, OneTensorOf40kChunks) {
    const size_t n = 40000;
    std::string d = write_keys_ckpt(n, 2);
    dcp_ckpt *c;
    fsdp_err err;
    ASSERT_EQ(dcp_open(d.c_str(), &c, &err), 0) << err.msg;
    ASSERT_EQ(c->n, 1u);
    ASSERT_EQ(c->items[0].n_chunks, n);
    for (size_t k = 0; k < n; k++)
        ASSERT_EQ(c->items[0].chunks[k].where.offset, 16 * (uint64_t)c->items[0].chunks[k].offsets[0]) << k;
    dcp_close(c);
    rm_rf(d);
    // the same with chunk 20000 left out of the metadata: a hole, found at this scale
    d = write_keys_ckpt(n, 2, 20000);
    std::string e = open_err(d);
    EXPECT_TRUE(has(e, "w: the chunks cover 319992 of 320000 elements (the checkpoint is missing pieces)")) << e;
    rm_rf(d);
}

TEST(HardenDcpScale, TwentyThousandLayersInitSaveLoadInspect) {
    std::string d = make_tmpdir("fsdp-hdcp");
    std::string recipe = d + "/scale.yaml";
    write_file(recipe, "version: 1\nname: scale\nvars: {out: " + d +
                           "/ck}\nruntime: {device: cpu, seed: 0}\n"
                           "model: {arch: llama3, preset: tiny, n_layers: 20000, dim: 8, n_heads: 1, n_kv_heads: 1, "
                           "vocab_size: 16}\n"
                           "stages:\n  - {id: init, uses: init-meta}\n"
                           "  - {id: save, uses: save-dcp, with: {path: \"${out}\"}}\n"
                           "  - {id: load, uses: load-ckpt, after: [save], with: {path: \"${out}\", strict: true}}\n");
    std::string out;
    int rc = run_cmd(fsdp_run_bin() + " " + recipe, &out);
    ASSERT_EQ(rc, 0) << out.substr(out.size() > 4000 ? out.size() - 4000 : 0);
    EXPECT_TRUE(has(out, "loaded 180003 parameters")) << out.substr(out.size() > 2000 ? out.size() - 2000 : 0);
    rc = run_cmd(fsdp_run_bin() + " ckpt inspect " + d + "/ck > " + d + "/inspect.txt", &out);
    EXPECT_EQ(rc, 0) << out;
    std::string listing = read_file(d + "/inspect.txt");
    EXPECT_TRUE(has(listing.substr(0, 200), "dcp checkpoint, 180006 keys")) << listing.substr(0, 200);
    EXPECT_EQ(std::count(listing.begin(), listing.end(), '\n'), 180006 + 4); // + header, layout, total, checked
    rm_rf(d);
}

// ---- the sharded state and the parameter table at scale -------------------------------------------------

TEST(HardenDcpState, DeclareAndFind180kParameters) {
    fsdp_state *s = (fsdp_state *)calloc(1, sizeof(fsdp_state));
    s->layout = STATE_SHARDED;
    s->world = 1;
    fsdp_err err;
    const size_t n = 180000;
    int64_t shape[1] = {3};
    char name[96];
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "layers.%zu.p%zu.weight", i / 9, i % 9);
        ASSERT_EQ(state_add_param(s, name, 1, shape, (int)(i / 9), &err), 0) << err.msg;
        s->p[i].data[0] = (float)i;
    }
    ASSERT_EQ(s->n, n);
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "layers.%zu.p%zu.weight", i / 9, i % 9);
        state_param *p = state_find(s, name);
        ASSERT_EQ(p, &s->p[i]);
        ASSERT_EQ(p->data[0], (float)i);
    }
    EXPECT_EQ(state_find(s, "layers.0.p9.weight"), nullptr);
    EXPECT_EQ(state_find(s, ""), nullptr);
    EXPECT_EQ(state_add_param(s, "layers.7.p3.weight", 1, shape, 7, &err), FSDP_E_INVALID);
    EXPECT_TRUE(has(err.msg, "parameter layers.7.p3.weight declared twice")) << err.msg;
    EXPECT_EQ(s->n, n);
    state_free(s);
}

TEST(HardenDcpState, LlamaParamsFindOf20000Layers) {
    decoder_config c;
    fsdp_err err;
    ASSERT_EQ(decoder_config_preset(&c, "tiny", &err), 0) << err.msg;
    c.n_layers = 20000;
    decoder_params t{};
    ASSERT_EQ(decoder_params_build(&c, &t, &err), 0) << err.msg;
    ASSERT_EQ(t.n, 180003);
    for (int i = 0; i < t.n; i++) ASSERT_EQ(decoder_params_find(&t, t.p[i].name), i) << t.p[i].name;
    for (const char *bad : {"layers.01.attention.wq.weight", "layers.20000.attention.wq.weight",
                            "layers.-1.attention.wq.weight", "layers..attention.wq.weight",
                            "layers.5.tok_embeddings.weight", "attention.wq.weight", "layers.5.attention.wq",
                            "layers.99999999999999999999.ffn_norm.weight", "layers.5", ""})
        EXPECT_EQ(decoder_params_find(&t, bad), -1) << bad;
    decoder_params_free(&t);
}
