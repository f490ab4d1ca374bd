// A DCP tensor's chunk layout built in memory (no file): a shape and its chunks, viewed as a dcp_item,
// for the tests of the chunk checks and the read planner.
#ifndef FSDP_TESTS_DCP_LAYOUT_H
#define FSDP_TESTS_DCP_LAYOUT_H

#include <cstdint>
#include <vector>

extern "C" {
#include "ckpt/dcp.h"
}

namespace fsdp_test {

struct DcpLayout {
    std::vector<int64_t> shape;
    std::vector<dcp_chunk> chunks;
    std::vector<int64_t> coords; // per chunk: its offsets, then its sizes (what dcp_chunk points at)
    void add(const std::vector<int64_t> &off, const std::vector<int64_t> &sz) {
        const int64_t *was = coords.data();
        coords.insert(coords.end(), off.begin(), off.end());
        coords.insert(coords.end(), sz.begin(), sz.end());
        dcp_chunk c{};
        c.where.relative_path = "";
        chunks.push_back(c);
        if (coords.data() != was) point(0);
        else point(chunks.size() - 1);
    }
    // chunks from k on point at their coords
    void point(size_t k) {
        const size_t nd = shape.size();
        for (; k < chunks.size(); k++) {
            chunks[k].offsets = coords.data() + 2 * nd * k;
            chunks[k].sizes = coords.data() + 2 * nd * k + nd;
        }
    }
    // a view of the layout (valid while the layout is unchanged), float32 unless told
    dcp_item item(fsdp_dtype dt = FSDP_DT_F32) {
        dcp_item it{};
        it.fqn = (char *)"t";
        it.is_tensor = 1;
        it.dtype = dt;
        it.ndim = (int)shape.size();
        for (size_t d = 0; d < shape.size(); d++) it.shape[d] = shape[d];
        it.chunks = chunks.data();
        it.n_chunks = chunks.size();
        return it;
    }
};

} // namespace fsdp_test

#endif
