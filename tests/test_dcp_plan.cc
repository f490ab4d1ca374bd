// Issue 40 item 4: the read planner (ckpt/dcp_plan.h) finds exactly the chunks a box meets, with the
// same intersections as a scan of every chunk, on every kind of tiling a DCP checkpoint holds: FSDP2's
// Shard(0) rows with empty shards, 2-D and 3-D grids (TP x FSDP, experts x FSDP), uneven guillotine
// cuts, 0-d tensors; and a box that meets no chunk, or is empty, gets no read.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "dcp_layout.h"

extern "C" {
#include "ckpt/dcp.h"
#include "ckpt/dcp_chunks.h"
#include "ckpt/dcp_plan.h"
#include "runtime/shard.h"
}

namespace {

typedef std::tuple<size_t, std::vector<int64_t>, std::vector<int64_t>> Read; // chunk, at, len

typedef fsdp_test::DcpLayout Tensor;

// A grid: dim d cut into parts[d] Shard(0)-style pieces (ceil; the last ones may be empty).
void grid(Tensor &t, const std::vector<int> &parts) {
    size_t nd = t.shape.size(), total = 1;
    for (int p : parts) total *= (size_t)p;
    for (size_t k = 0; k < total; k++) {
        std::vector<int64_t> off(nd), sz(nd);
        size_t rest = k;
        for (size_t d = nd; d-- > 0;) {
            int r = (int)(rest % (size_t)parts[d]);
            rest /= (size_t)parts[d];
            shard_rows(t.shape[d], parts[d], r, &off[d], &sz[d]);
        }
        t.add(off, sz);
    }
}

// Random cuts of the box [lo, hi) across random dims until depth runs out.
void cuts(std::mt19937 &g, std::vector<int64_t> lo, std::vector<int64_t> hi, int depth, Tensor &t) {
    size_t nd = lo.size();
    std::vector<size_t> can;
    for (size_t d = 0; d < nd; d++)
        if (hi[d] - lo[d] > 1) can.push_back(d);
    if (depth == 0 || can.empty() || g() % 4 == 0) {
        std::vector<int64_t> sz(nd);
        for (size_t d = 0; d < nd; d++) sz[d] = hi[d] - lo[d];
        t.add(lo, sz);
        return;
    }
    size_t d = can[g() % can.size()];
    int64_t at = lo[d] + 1 + (int64_t)(g() % (uint64_t)(hi[d] - lo[d] - 1));
    std::vector<int64_t> mid_hi = hi, mid_lo = lo;
    mid_hi[d] = at, mid_lo[d] = at;
    cuts(g, lo, mid_hi, depth - 1, t);
    cuts(g, mid_lo, hi, depth - 1, t);
}

int collect(void *user, size_t chunk, const int64_t *at, const int64_t *len) {
    auto *p = static_cast<std::pair<int, std::vector<Read> *> *>(user);
    p->second->emplace_back(chunk, std::vector<int64_t>(at, at + p->first), std::vector<int64_t>(len, len + p->first));
    return 0;
}

// What a scan of every chunk finds (the planner's reference).
std::vector<Read> scan(const Tensor &t, const std::vector<int64_t> &off, const std::vector<int64_t> &len) {
    std::vector<Read> out;
    size_t nd = t.shape.size();
    for (size_t k = 0; k < t.chunks.size(); k++) {
        const dcp_chunk &c = t.chunks[k];
        std::vector<int64_t> at(nd), il(nd);
        bool meets = true;
        for (size_t d = 0; d < nd; d++) {
            if (c.sizes[d] == 0 || len[d] == 0) meets = false;
            int64_t s = std::max(off[d], c.offsets[d]), e = std::min(off[d] + len[d], c.offsets[d] + c.sizes[d]);
            at[d] = s, il[d] = e - s;
            if (e <= s) meets = false;
        }
        if (meets) out.emplace_back(k, at, il);
    }
    return out;
}

// Plans every box of a grid of boxes (and random ones) and compares with the scan; returns reads planned.
size_t check_tensor(std::mt19937 &g, Tensor &t, int boxes) {
    dcp_item it = t.item(FSDP_DT_BF16);
    fsdp_err err{};
    EXPECT_EQ(dcp_check_tiling("t", &it, &err), 0) << err.msg;
    dcp_plan_ix ix;
    EXPECT_EQ(dcp_plan_ix_build(&it, &ix, &err), 0) << err.msg;
    size_t nd = t.shape.size(), planned = 0;
    for (int b = 0; b < boxes; b++) {
        std::vector<int64_t> off(nd), len(nd);
        for (size_t d = 0; d < nd; d++) {
            off[d] = (int64_t)(g() % (uint64_t)(t.shape[d] + 1));
            len[d] = (int64_t)(g() % (uint64_t)(t.shape[d] - off[d] + 1));
            if (b == 0) off[d] = 0, len[d] = t.shape[d]; // the whole tensor
        }
        std::vector<Read> got;
        std::pair<int, std::vector<Read> *> user((int)nd, &got);
        EXPECT_EQ(dcp_plan_box(&it, &ix, off.data(), len.data(), collect, &user), 0);
        std::vector<Read> want = scan(t, off, len);
        std::sort(got.begin(), got.end());
        EXPECT_EQ(got, want) << "tensor of " << nd << " dims, " << t.chunks.size() << " chunks, box " << b;
        int64_t vol = 1, sum = 0;
        for (size_t d = 0; d < nd; d++) vol *= len[d];
        for (const Read &r : got) {
            int64_t v = 1;
            for (int64_t l : std::get<2>(r)) v *= l;
            sum += v;
        }
        EXPECT_EQ(sum, vol) << "the reads cover the box exactly once";
        planned += got.size();
    }
    dcp_plan_ix_free(&ix);
    return planned;
}

TEST(DcpPlan, GridsAsFsdpTpAndExpertsSaveThemMatchAScan) {
    std::mt19937 g(40);
    size_t planned = 0;
    // rows over 1..9 ranks (more ranks than rows: empty shards), 2-D and 3-D grids, as a generated sweep
    for (int64_t rows : {1, 3, 8, 17})
        for (int64_t cols : {1, 4, 9})
            for (int pr : {1, 2, 5, 9})
                for (int pc : {1, 3}) {
                    Tensor t;
                    t.shape = {rows, cols};
                    grid(t, {pr, pc});
                    std::shuffle(t.chunks.begin(), t.chunks.end(), g);
                    planned += check_tensor(g, t, 30);
                    Tensor e; // experts x rows x cols, experts over pr groups, rows over pc
                    e.shape = {4, rows, cols};
                    grid(e, {pr, pc, 1});
                    planned += check_tensor(g, e, 20);
                }
    EXPECT_GT(planned, 2000u);
}

TEST(DcpPlan, UnevenCutsMatchAScan) {
    std::mt19937 g(41);
    for (int iter = 0; iter < 1500; iter++) {
        Tensor t;
        size_t nd = 1 + g() % 4;
        for (size_t d = 0; d < nd; d++) t.shape.push_back(1 + (int64_t)(g() % 7));
        cuts(g, std::vector<int64_t>(nd, 0), t.shape, 7, t);
        if (g() % 3 == 0) t.add(std::vector<int64_t>(nd, 0), std::vector<int64_t>(nd, 0)); // an empty chunk
        std::shuffle(t.chunks.begin(), t.chunks.end(), g);
        check_tensor(g, t, 12);
    }
}

TEST(DcpPlan, ScalarsAndEmptyBoxes) {
    std::mt19937 g(42);
    Tensor s; // a 0-d tensor: its one chunk is the whole of it
    s.add({}, {});
    dcp_item it = s.item();
    fsdp_err err{};
    dcp_plan_ix ix;
    ASSERT_EQ(dcp_plan_ix_build(&it, &ix, &err), 0);
    std::vector<Read> got;
    std::pair<int, std::vector<Read> *> user(0, &got);
    EXPECT_EQ(dcp_plan_box(&it, &ix, nullptr, nullptr, collect, &user), 0);
    EXPECT_EQ(got.size(), 1u);
    dcp_plan_ix_free(&ix);

    Tensor t;
    t.shape = {6, 4};
    grid(t, {3, 2});
    it = t.item();
    ASSERT_EQ(dcp_plan_ix_build(&it, &ix, &err), 0);
    got.clear();
    user.first = 2;
    int64_t off[2] = {2, 0}, len[2] = {0, 4};
    EXPECT_EQ(dcp_plan_box(&it, &ix, off, len, collect, &user), 0);
    EXPECT_TRUE(got.empty()) << "an empty box needs no read";
    // a callback's non-zero ends the plan with that value
    auto stop = [](void *, size_t, const int64_t *, const int64_t *) -> int { return 7; };
    int64_t all_off[2] = {0, 0}, all_len[2] = {6, 4};
    EXPECT_EQ(dcp_plan_box(&it, &ix, all_off, all_len, stop, nullptr), 7);
    dcp_plan_ix_free(&ix);
}

} // namespace
