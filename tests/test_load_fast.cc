// The load read engine (ckpt/ckpt_pread.h): reads fused with the CRC-32, the dtype conversion and
// the NaN check, on several threads and pieces, give bit for bit what the fallback path gives
// (FSDP_LOAD_FAST=0: whole read, then separate passes) and what the fixtures expect, for f32 and
// bf16 data, whole and resharded reads; every failure names the file (and the tensor) whichever
// reader thread met it.
#include <gtest/gtest.h>

#include "ckpt_compare.h"
#include "state_fixture.h"
#include "test_util.h"

#include <cmath>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

extern "C" {
#include "ckpt/ckpt_pread.h"
#include "ckpt/dcp.h"
#include "ckpt/state_io.h"
#include "runtime/comm.h"
#include "runtime/state.h"
}

using namespace fsdp_test;

namespace {

// One way of reading: FSDP_LOAD_FAST, FSDP_LOAD_THREADS, FSDP_LOAD_PIECE (nullptr: unset).
struct Mode {
    const char *fast, *threads, *piece;
};
const Mode kModes[] = {{"1", "3", "4096"}, {"1", "1", nullptr}, {"1", "2", "65536"}, {"0", "2", "4096"}, {"0", "1", nullptr}};

std::string mode_name(const Mode &m) {
    return std::string("fast=") + m.fast + " threads=" + m.threads + " piece=" + (m.piece ? m.piece : "default");
}

// sets a mode for its lifetime
struct ModeEnv {
    explicit ModeEnv(const Mode &m) {
        setenv("FSDP_LOAD_FAST", m.fast, 1);
        setenv("FSDP_LOAD_THREADS", m.threads, 1);
        if (m.piece) setenv("FSDP_LOAD_PIECE", m.piece, 1);
        else unsetenv("FSDP_LOAD_PIECE");
    }
    ~ModeEnv() {
        unsetenv("FSDP_LOAD_FAST");
        unsetenv("FSDP_LOAD_THREADS");
        unsetenv("FSDP_LOAD_PIECE");
    }
};

std::string random_bytes(size_t n, uint32_t seed) { return lcg_bytes(n, seed, 7); }

// bf16 values: finite random ones, with Inf / denormals / -0 at given places and a NaN at nan_at
std::string bf16_data(size_t n, size_t nan_at) {
    std::string s = random_bytes(n * 2, 11);
    for (size_t i = 0; i < n; i++) {
        uint16_t v;
        memcpy(&v, &s[i * 2], 2);
        if ((v & 0x7f80) == 0x7f80) v &= 0xbfff; // no Inf / NaN by chance
        if (i % 997 == 5) v = 0x7f80;             // +Inf
        if (i % 991 == 3) v = 0x0001;             // denormal
        if (i % 983 == 1) v = 0x8000;             // -0
        if (i == nan_at) v = 0x7fc1;              // a NaN
        memcpy(&s[i * 2], &v, 2);
    }
    return s;
}

int open_file(const std::string &path) {
    int fd = open(path.c_str(), O_RDONLY);
    EXPECT_GE(fd, 0) << path;
    return fd;
}

// reads n elements of src at `at` of fd as dst in the current mode
int read_as(int fd, uint64_t at, size_t n, fsdp_dtype src, fsdp_dtype dst, std::string *out, ckpt_rd_xf *xf,
            fsdp_err *err) {
    out->assign(n * fsdp_dtype_size(dst), 'x');
    *xf = ckpt_rd_xf{n, src, dst, 1, 1, 0, 0};
    return ckpt_pread_xf(fd, &(*out)[0], at, xf, "data.bin", nullptr, err);
}

bool has_nan_f32(const std::string &b) {
    for (size_t i = 0; i + 4 <= b.size(); i += 4) {
        float f;
        memcpy(&f, &b[i], 4);
        if (std::isnan(f)) return true;
    }
    return false;
}

} // namespace

TEST(LoadFastEngine, FusedReadsEqualTheFallbackInEveryDtypePairAndPiecing) {
    std::string t = make_tmpdir("fsdp-loadfast");
    const size_t n = 300007; // elements: many 4 KiB pieces, a short last one
    for (bool with_nan : {false, true}) {
        // room for n f32 too; the NaN in the last element of a bf16 read (its last piece)
        std::string data = random_bytes(24, 3) + bf16_data(n * 2, with_nan ? n - 1 : SIZE_MAX);
        write_file(t + "/data.bin", data);
        int fd = open_file(t + "/data.bin");
        struct Pair {
            fsdp_dtype src, dst;
        } pairs[] = {{FSDP_DT_U8, FSDP_DT_U8},   {FSDP_DT_BF16, FSDP_DT_F32}, {FSDP_DT_F32, FSDP_DT_F32},
                     {FSDP_DT_F32, FSDP_DT_BF16}, {FSDP_DT_F16, FSDP_DT_F32}, {FSDP_DT_BF16, FSDP_DT_F64}};
        for (const Pair &p : pairs) {
            const size_t ss = fsdp_dtype_size(p.src);
            // the reference: the stored bytes converted by fsdp_convert in one call
            const std::string stored = data.substr(24, n * ss);
            std::string want(n * fsdp_dtype_size(p.dst), '\0');
            fsdp_err err;
            ASSERT_EQ(fsdp_convert(&want[0], p.dst, stored.data(), p.src, n, &err), 0) << err.msg;
            const uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)stored.data(), (uInt)stored.size());
            const bool nan = p.dst == FSDP_DT_F32 && has_nan_f32(want);
            if (with_nan && p.src == FSDP_DT_BF16 && p.dst == FSDP_DT_F32) {
                ASSERT_TRUE(nan);
            }
            for (const Mode &m : kModes) {
                ModeEnv env(m);
                std::string got;
                ckpt_rd_xf xf;
                ASSERT_EQ(read_as(fd, 24, n, p.src, p.dst, &got, &xf, &err), 0) << err.msg << " " << mode_name(m);
                EXPECT_TRUE(got == want) << fsdp_dtype_name(p.src) << " -> " << fsdp_dtype_name(p.dst) << " "
                                         << mode_name(m);
                EXPECT_EQ(xf.crc, crc) << mode_name(m);
                EXPECT_EQ(xf.nan, nan ? 1 : 0) << fsdp_dtype_name(p.src) << " -> " << fsdp_dtype_name(p.dst) << " "
                                               << mode_name(m);
            }
        }
        close(fd);
    }
    rm_rf(t);
}

// On every mode, reading n elements of src (as float32) at off fails with rc and a message holding want.
static void expect_read_fails(int fd, uint64_t off, size_t n, fsdp_dtype src, int rc, const char *want) {
    for (const Mode &m : kModes) {
        ModeEnv env(m);
        std::string got;
        ckpt_rd_xf xf;
        fsdp_err err;
        err.msg[0] = 0;
        EXPECT_EQ(read_as(fd, off, n, src, FSDP_DT_F32, &got, &xf, &err), rc) << mode_name(m);
        EXPECT_NE(std::string(err.msg).find(want), std::string::npos) << err.msg << " " << mode_name(m);
    }
}

TEST(LoadFastEngine, ShortReadFromAnyThreadNamesTheFileAndTheFirstMissingByte) {
    std::string t = make_tmpdir("fsdp-loadfast");
    write_file(t + "/data.bin", random_bytes(50000, 5));
    int fd = open_file(t + "/data.bin");
    for (const Mode &m : kModes) {
        ModeEnv env(m);
        for (fsdp_dtype src : {FSDP_DT_U8, FSDP_DT_BF16}) {
            std::string got;
            ckpt_rd_xf xf;
            fsdp_err err;
            err.msg[0] = 0;
            // 80000 stored bytes from byte 0: the pieces past byte 50000 fail, on whichever thread
            size_t n = 80000 / fsdp_dtype_size(src);
            fsdp_dtype dst = src == FSDP_DT_U8 ? FSDP_DT_U8 : FSDP_DT_F32;
            EXPECT_EQ(read_as(fd, 0, n, src, dst, &got, &xf, &err), FSDP_E_FORMAT) << mode_name(m);
            EXPECT_NE(std::string(err.msg).find("data.bin: the file ends before byte 50000 (truncated?)"),
                      std::string::npos)
                << err.msg << " " << mode_name(m);
        }
    }
    close(fd);
    // a read that fails (a directory) names the byte and the reason
    int dfd = open(t.c_str(), O_RDONLY | O_DIRECTORY);
    ASSERT_GE(dfd, 0);
    expect_read_fails(dfd, 8, 100000, FSDP_DT_BF16, FSDP_E_IO, "data.bin: read error at byte 8");
    close(dfd);
    rm_rf(t);
}

TEST(LoadFastEngine, RefusedDtypePairIsAnErrorBeforeAnyRead) {
    std::string t = make_tmpdir("fsdp-loadfast");
    write_file(t + "/data.bin", random_bytes(4096, 9));
    int fd = open_file(t + "/data.bin");
    expect_read_fails(fd, 0, 256, FSDP_DT_C64, FSDP_E_INVALID, "cannot convert");
    close(fd);
    rm_rf(t);
}

// Every PyTorch-written fixture reads back with its expected values on every path: f32 DCP saved on
// 1, 2 and 3 ranks, the dtypes DCP (bf16, f16, ...), a torch.save file; bf16 also widened to f32.
TEST(LoadFastDcp, FixturesEqualTheirExpectedValuesOnEveryPath) {
    for (const Mode &m : kModes) {
        ModeEnv env(m);
        SCOPED_TRACE(mode_name(m));
        Ckpt ws1(tiny("dcp_seed_ws1")), init(tiny("model_init.safetensors"));
        Ckpt ws2(tiny("dcp_model_ws2")), ws3(tiny("dcp_full_ws3")), st(tiny("model_step5.safetensors"));
        Ckpt pt(tiny("model_step5.pt")), dt(tiny("dcp_dtypes")), dt_want(tiny("dcp_dtypes_expected.safetensors"));
        ASSERT_TRUE(ws1.r && init.r && ws2.r && ws3.r && st.r && pt.r && dt.r && dt_want.r);
        expect_same_tensors(ws1.r, init.r);
        expect_same_tensors(ws2.r, st.r);
        expect_same_tensors(ws3.r, st.r);
        expect_same_tensors(pt.r, st.r);
        expect_same_tensors(dt.r, dt_want.r);
        for (const char *name : {"bf16", "f16", "f32", "f64", "transposed", "sliced"}) {
            EXPECT_TRUE(tensor_bytes(dt.r, name, FSDP_DT_F32) == tensor_bytes(dt_want.r, name, FSDP_DT_F32)) << name;
        }
    }
}

namespace {
// rows [r0, r1) of tensor `name` as f32 through ckpt_read_rows_nan
std::vector<float> rows_of(ckpt_reader *r, const char *name, int64_t r0, int64_t r1, int *nan) {
    long i = ckpt_find(r, name);
    EXPECT_GE(i, 0) << name;
    if (i < 0) return {};
    const ckpt_entry *e = ckpt_entry_at(r, (size_t)i);
    int64_t per = 1;
    for (int d = 1; d < e->ndim; d++) per *= e->shape[d];
    std::vector<float> v((size_t)((r1 - r0) * per));
    fsdp_err err;
    EXPECT_EQ(ckpt_read_rows_nan(r, (size_t)i, r0, r1, v.data(), FSDP_DT_F32, nan, &err), 0) << err.msg;
    return v;
}
} // namespace

// Saved on 2 ranks and read as 1 and 3 ranks' rows, saved on 3 and read as 2 ranks': chunks that
// cover a rank's rows and chunks that give only part of them, and a column box (scattered).
TEST(LoadFastDcp, ReshardedReadsEqualTheFallbackAndTheExpected) {
    const char *names[] = {"tok_embeddings.weight", "output.weight", "layers.0.attention.wq.weight", "norm.weight"};
    struct Case {
        const char *ck;
        int world;
    } cases[] = {{"dcp_model_ws2", 1}, {"dcp_model_ws2", 3}, {"dcp_full_ws3", 2}};
    Ckpt st(tiny("model_step5.safetensors"));
    ASSERT_TRUE(st.r);
    for (const Case &c : cases)
        for (const char *name : names) {
            const ckpt_entry *e = ckpt_entry_at(st.r, (size_t)ckpt_find(st.r, name));
            for (int rank = 0; rank < c.world; rank++) {
                int64_t r0 = e->shape[0] * rank / c.world, r1 = e->shape[0] * (rank + 1) / c.world;
                int nan = -1;
                std::vector<float> want = rows_of(st.r, name, r0, r1, &nan);
                EXPECT_EQ(nan, 0);
                for (const Mode &m : kModes) {
                    ModeEnv env(m);
                    Ckpt ck(tiny(c.ck));
                    ASSERT_TRUE(ck.r);
                    nan = -1;
                    EXPECT_TRUE(rows_of(ck.r, name, r0, r1, &nan) == want)
                        << c.ck << " as " << c.world << " ranks, rank " << rank << " " << name << " " << mode_name(m);
                    EXPECT_EQ(nan, 0);
                }
            }
        }
    // a column box across the row chunks of 3 ranks: scattered into the destination
    dcp_ckpt *d;
    fsdp_err err;
    std::vector<float> full = rows_of(st.r, "output.weight", 0, 256, nullptr);
    for (const Mode &m : kModes) {
        ModeEnv env(m);
        ASSERT_EQ(dcp_open(tiny("dcp_full_ws3").c_str(), &d, &err), 0) << err.msg;
        long i = dcp_find(d, "output.weight");
        ASSERT_GE(i, 0);
        int64_t off[2] = {50, 7}, len[2] = {150, 40};
        std::vector<float> box((size_t)(len[0] * len[1]));
        int nan = -1;
        ASSERT_EQ(dcp_read_box_nan(d, (size_t)i, off, len, box.data(), FSDP_DT_F32, &nan, &err), 0) << err.msg;
        EXPECT_EQ(nan, 0);
        for (int64_t r = 0; r < len[0]; r++)
            for (int64_t k = 0; k < len[1]; k++)
                ASSERT_EQ(box[(size_t)(r * len[1] + k)], full[(size_t)((off[0] + r) * 64 + off[1] + k)])
                    << r << "," << k << " " << mode_name(m);
        dcp_close(d);
    }
}

namespace {
std::string copy_fixture(const std::string &name, const std::string &dir) {
    std::string to = dir + "/" + name;
    EXPECT_EQ(mkdir(to.c_str(), 0755), 0);
    for (const char *f : {".metadata", "__0_0.distcp", "__1_0.distcp"})
        write_file(to + "/" + f, read_file(tiny(name) + "/" + f));
    return to;
}
} // namespace

// A missing data file names the file and a tensor it holds; a data file cut short after the
// checkpoint was opened fails the read of a tensor it held, naming both, on every path.
TEST(LoadFastDcp, MissingOrTruncatedDataFileNamesTheFileAndTheTensor) {
    std::string t = make_tmpdir("fsdp-loadfast");
    std::string ck = copy_fixture("dcp_model_ws2", t);
    ASSERT_EQ(unlink((ck + "/__1_0.distcp").c_str()), 0);
    for (const Mode &m : kModes) {
        ModeEnv env(m);
        ckpt_reader *r = nullptr;
        fsdp_err err;
        err.msg[0] = 0;
        EXPECT_NE(ckpt_open(ck.c_str(), CKPT_AUTO, &r, &err), 0);
        EXPECT_NE(std::string(err.msg).find("__1_0.distcp"), std::string::npos) << err.msg;
        EXPECT_NE(std::string(err.msg).find("tensor "), std::string::npos) << err.msg;
    }
    rm_rf(t);
    for (const Mode &m : kModes) {
        ModeEnv env(m);
        t = make_tmpdir("fsdp-loadfast");
        ck = copy_fixture("dcp_model_ws2", t);
        ckpt_reader *r = nullptr;
        fsdp_err err;
        ASSERT_EQ(ckpt_open(ck.c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
        ASSERT_EQ(truncate((ck + "/__1_0.distcp").c_str(), 100000), 0);
        size_t failed = 0;
        for (size_t i = 0; i < ckpt_count(r); i++) {
            const ckpt_entry *e = ckpt_entry_at(r, i);
            if (!e->is_tensor || e->ndim == 0) continue;
            std::vector<float> v((size_t)(e->nbytes / fsdp_dtype_size(e->dtype)));
            err.msg[0] = 0;
            if (ckpt_read_rows(r, i, 0, e->shape[0], v.data(), FSDP_DT_F32, &err) == 0) continue;
            failed++;
            EXPECT_NE(std::string(err.msg).find("__1_0.distcp"), std::string::npos) << err.msg;
            EXPECT_NE(std::string(err.msg).find(std::string("tensor ") + e->name), std::string::npos) << err.msg;
        }
        EXPECT_GT(failed, 0u) << mode_name(m);
        ckpt_close(r);
        rm_rf(t);
    }
}

namespace {
fsdp_state *big_state(int rank, int world, bool fill) {
    const std::vector<StateParamSpec> specs = {
        {"big.weight", 2, {600, 1024}, -1}, {"small.weight", 2, {7, 5}, 0}, {"norm.weight", 1, {3000, 0}, -1}};
    return make_spec_state(rank, world, specs, StateValues{0.001, 3.0, 1e-6, 1.0, 3}, fill, false);
}

int load_into(fsdp_state *dst, const std::string &ck, fsdp_err *err) {
    sio_load_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.strict = 1;
    sio_load_result res;
    err->msg[0] = 0;
    return sio_load(dst, ck.c_str(), &lo, &res, err);
}
} // namespace

// A state saved as f32 and as bf16 loads into 1, 2 and 3 ranks bit for bit alike on every path;
// a NaN stored anywhere (here in the last piece of a large tensor) fails a strict load on every path.
TEST(LoadFastState, StrictLoadsEqualTheFallbackAndReportNaNOnEveryPath) {
    std::string t = make_tmpdir("fsdp-loadfast");
    fsdp_err err;
    comm *c;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    fsdp_state *src = big_state(0, 1, true);
    sio_save_opts so = {};
    so.optimizer = 0;
    so.overwrite = 0;
    ASSERT_EQ(sio_save(src, c, (t + "/f32").c_str(), &so, &err), 0) << err.msg;
    for (size_t i = 0; i < src->n; i++) src->p[i].dtype = FSDP_DT_BF16;
    ASSERT_EQ(sio_save(src, c, (t + "/bf16").c_str(), &so, &err), 0) << err.msg;
    for (const char *kind : {"f32", "bf16"})
        for (int world : {1, 2, 3})
            for (int rank = 0; rank < world; rank++)
                for (const Mode &m : kModes) {
                    ModeEnv env(m);
                    fsdp_state *dst = big_state(rank, world, false);
                    ASSERT_EQ(load_into(dst, t + "/" + kind, &err), 0) << err.msg << " " << mode_name(m);
                    for (size_t i = 0; i < dst->n; i++) {
                        const state_param *p = &dst->p[i];
                        const float *q = src->p[i].data + p->row0 * p->row_numel;
                        for (size_t k = 0; k < state_param_local_numel(p); k++) {
                            float want = !strcmp(kind, "f32") ? q[k] : fsdp_bf16_to_f32(fsdp_f32_to_bf16(q[k]));
                            ASSERT_EQ(0, memcmp(&p->data[k], &want, 4))
                                << kind << " " << p->name << "[" << k << "] rank " << rank << "/" << world << " "
                                << mode_name(m);
                        }
                    }
                    state_free(dst);
                }
    // a NaN in the last element of the large tensor (its last piece, read by some thread)
    for (size_t i = 0; i < src->n; i++) src->p[i].dtype = FSDP_DT_F32;
    const state_param *big = state_find(src, "big.weight");
    big->data[state_param_local_numel(big) - 1] = NAN;
    so.overwrite = 1;
    ASSERT_EQ(sio_save(src, c, (t + "/f32").c_str(), &so, &err), 0) << err.msg;
    for (const Mode &m : kModes) {
        ModeEnv env(m);
        fsdp_state *dst = big_state(0, 1, false);
        EXPECT_NE(load_into(dst, t + "/f32", &err), 0) << mode_name(m);
        EXPECT_NE(std::string(err.msg).find("big.weight holds NaN after loading"), std::string::npos)
            << err.msg << " " << mode_name(m);
        EXPECT_EQ(std::string(err.msg).find("norm.weight holds NaN"), std::string::npos) << err.msg;
        state_free(dst);
    }
    state_free(src);
    comm_destroy(c);
    rm_rf(t);
}
