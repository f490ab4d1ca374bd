// Issue 40 item 4: the `.metadata` of a many-rank save stays small and cheap to read. The writer names
// each distinct string (a tensor's key, a file, a field), class and torch.Size once and fetches it again
// (BINGET), as Python's pickler does; the reader keeps each int and the empty tuple once. Checked on a
// generated grid of saves (tensors x ranks x dims): what is read back equals what was written, every key
// and file name is in the file once, and the bytes per chunk stay bounded as the ranks grow.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.h"

extern "C" {
#include "ckpt/dcp.h"
#include "runtime/shard.h"
}

using namespace fsdp_test;

namespace {

size_t count_of(const std::string &hay, const std::string &needle) {
    size_t n = 0;
    for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) n++;
    return n;
}

// tensors x ranks records of a Shard(0) save (2-D [rows, 64] tensors, some with fewer rows than ranks)
std::vector<dcp_record> save(int tensors, int ranks) {
    std::vector<dcp_record> recs;
    for (int r = 0; r < ranks; r++) {
        uint64_t pos = 0;
        for (int t = 0; t < tensors; t++) {
            dcp_record rec{};
            snprintf(rec.fqn, sizeof rec.fqn, "layers.%d.attention.w%c.weight", t / 4, "qkvo"[t % 4]);
            rec.is_tensor = 1, rec.dtype = FSDP_DT_BF16, rec.ndim = 2;
            rec.shape[0] = t % 4 == 1 ? 8 : 96, rec.shape[1] = 64;
            shard_rows(rec.shape[0], ranks, r, &rec.offsets[0], &rec.sizes[0]);
            rec.offsets[1] = 0, rec.sizes[1] = 64;
            snprintf(rec.where.relative_path, sizeof rec.where.relative_path, "__%d_0.distcp", r);
            rec.where.offset = pos, rec.where.length = (uint64_t)(rec.sizes[0] * 64 * 2);
            pos += rec.where.length;
            recs.push_back(rec);
        }
    }
    return recs;
}

TEST(DcpMetaMemo, ManyRankSavesReadBackEqualAndNameEachStringOnce) {
    double per_chunk_small = 0;
    for (int tensors : {4, 24})
        for (int ranks : {1, 16, 128}) {
            std::string dir = make_tmpdir("memo");
            std::vector<dcp_record> recs = save(tensors, ranks);
            fsdp_err err{};
            ASSERT_EQ(dcp_write_metadata(dir.c_str(), recs.data(), recs.size(), &err), 0) << err.msg;
            std::string meta = read_file(dir + "/.metadata");
            for (int r = 0; r < ranks; r += 7) {
                std::string file = "__" + std::to_string(r) + "_0.distcp";
                EXPECT_EQ(count_of(meta, file), 1u) << file << ": written once, fetched again";
            }
            EXPECT_EQ(count_of(meta, "layers.0.attention.wq.weight"), 1u);
            EXPECT_EQ(count_of(meta, "ChunkStorageMetadata"), 1u);
            EXPECT_EQ(count_of(meta, "relative_path"), 1u);
            double per_chunk = (double)meta.size() / (double)recs.size();
            if (tensors == 24 && ranks == 16) per_chunk_small = per_chunk;
            if (tensors == 24 && ranks == 128) {
                EXPECT_LT(per_chunk, per_chunk_small * 1.2) << "bytes per chunk grow";
            }
            if (ranks >= 16) {
                EXPECT_LT(per_chunk, 120.0) << tensors << " tensors on " << ranks << " ranks";
            }

            dcp_item *items = nullptr;
            size_t n = 0;
            char ver[32];
            ASSERT_EQ(dcp_parse_metadata(meta.data(), meta.size(), "m", &items, &n, ver, sizeof ver, &err), 0) << err.msg;
            ASSERT_EQ(n, (size_t)tensors);
            size_t seen = 0;
            for (size_t i = 0; i < n; i++) {
                ASSERT_EQ(items[i].n_chunks, (size_t)ranks);
                for (size_t k = 0; k < items[i].n_chunks; k++) {
                    const dcp_record &w = recs[k * (size_t)tensors + i]; // rank k's record of tensor i
                    const dcp_chunk &c = items[i].chunks[k];
                    EXPECT_STREQ(items[i].fqn, w.fqn);
                    EXPECT_EQ(c.offsets[0], w.offsets[0]);
                    EXPECT_EQ(c.sizes[0], w.sizes[0]);
                    EXPECT_EQ(c.sizes[1], 64);
                    seen++;
                    // an empty shard's storage: torch keys storage_data by (fqn, offset) and every empty
                    // shard sits at offset rows, so which one's entry it gets is not told (it holds nothing)
                    if (w.sizes[0] == 0) continue;
                    EXPECT_STREQ(c.where.relative_path, w.where.relative_path);
                    EXPECT_EQ(c.where.offset, w.where.offset);
                    EXPECT_EQ(c.where.length, w.where.length);
                }
            }
            EXPECT_EQ(seen, recs.size());
            dcp_items_free(items, n);
            rm_rf(dir);
        }
}

} // namespace
