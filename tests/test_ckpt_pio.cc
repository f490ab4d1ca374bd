// Parallel positional I/O (ckpt/ckpt_pio.h) and the checkpoint paths built on it: pieces
// moved by several threads give the same bytes and CRCs as one sequential transfer, large
// torch.save payloads are byte-identical to the streamed ones, and sharded loads of large
// tensors (partial boxes, dtype conversions) read the right values.
#include <gtest/gtest.h>

#include "state_fixture.h"
#include "test_util.h"

#include <cmath>
#include <csignal>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

extern "C" {
#include "ckpt/ckpt_pio.h"
#include "ckpt/ckpt_pread.h"
#include "ckpt/ckpt_pwrite.h"
#include "ckpt/dcp.h"
#include "ckpt/state_io.h"
#include "ckpt/torchsave.h"
#include "ckpt/zip.h"
#include "runtime/comm.h"
#include "runtime/mempages.h"
#include "runtime/state.h"
}

using namespace fsdp_test;

namespace {
std::string pattern(size_t n, uint32_t seed) { return lcg_bytes(n, seed, 1); }

// a state with a large 2-D parameter (3 MiB, above the parallel-write threshold), a small
// one and a 1-D one, values derived from the global element index
fsdp_state *make_state(int rank, int world, bool fill, bool opt) {
    const std::vector<StateParamSpec> specs = {
        {"big.weight", 2, {768, 1024}, -1}, {"small.weight", 2, {7, 5}, 0}, {"norm.weight", 1, {1000, 0}, -1}};
    return make_spec_state(rank, world, specs, StateValues{0.001, 3.0, 1e-6, 1.0, 3}, fill, opt);
}
}  // namespace

TEST(CkptPio, ParallelReadEqualsTheFileAtAnyPiecing) {
    std::string t = make_tmpdir("fsdp-pio");
    std::string data = pattern(1000003, 1);
    write_file(t + "/f", data);
    int fd = open((t + "/f").c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    fsdp_err err;
    const size_t pieces[] = {4096, 4099, 65536, 1 << 20, 0};
    for (size_t piece : pieces)
        for (int th : {1, 2, 4}) {
            ckpt_pio_opts o = {piece, th, 0, 0};
            std::string got(data.size() - 17, 'x');
            ASSERT_EQ(ckpt_pread_all(fd, &got[0], got.size(), 17, "f", &o, &err), 0) << err.msg;
            EXPECT_EQ(got, data.substr(17)) << "piece " << piece << " threads " << th;
        }
    close(fd);
    rm_rf(t);
}

TEST(CkptPio, ReadPastTheEndNamesTheFileAndTheFirstMissingByte) {
    std::string t = make_tmpdir("fsdp-pio");
    write_file(t + "/short.bin", pattern(50000, 2));
    int fd = open((t + "/short.bin").c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    std::string got(80000, '\0');
    for (int th : {1, 4}) {
        ckpt_pio_opts o = {4096, th, 0, 0};
        fsdp_err err;
        err.msg[0] = 0;
        EXPECT_EQ(ckpt_pread_all(fd, &got[0], got.size(), 0, "short.bin", &o, &err), FSDP_E_FORMAT);
        EXPECT_NE(std::string(err.msg).find("short.bin"), std::string::npos) << err.msg;
        EXPECT_NE(std::string(err.msg).find("ends before byte 50000"), std::string::npos) << err.msg;
    }
    close(fd);
    rm_rf(t);
}

// write(2)-family calls of this process so far (/proc/self/io syscw), -1 when unreadable
static long write_syscalls() {
    std::string io = read_file("/proc/self/io");
    size_t p = io.find("syscw: ");
    return p == std::string::npos ? -1 : std::stol(io.substr(p + 7));
}

// ckpt_pwrite_sliced: the bytes land at their offset across several 1 MiB calls; a write the file system
// stops part-way (here the file size limit, inside the second call) and a write that fails at once name the
// first byte not written; each call writes at most CKPT_WRITE_SLICE bytes (the page cache's folio size
// follows the call's: see ckpt_pio.h).
TEST(CkptPio, SlicedWriteGivesTheBytesAndNamesTheFirstByteNotWritten) {
    std::string t = make_tmpdir("fsdp-pio");
    const size_t n = 3 * CKPT_WRITE_SLICE + 17;
    const uint64_t off = 4097;
    std::string data = pattern(n, 7), path = t + "/f";
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    uint64_t at = 1;
    long calls = write_syscalls();
    EXPECT_EQ(ckpt_pwrite_sliced(fd, data.data(), n, off, &at), 0);
    if (calls >= 0) {
        EXPECT_EQ(write_syscalls() - calls, 4);  // 3 slices of 1 MiB and the 17 bytes
    }
    close(fd);
    std::string got = read_file(path);
    ASSERT_EQ(got.size(), off + n);
    EXPECT_TRUE(got.compare(off, n, data) == 0);
    EXPECT_EQ(got.substr(0, off), std::string(off, '\0'));

    // RLIMIT_FSIZE ends the file inside the second call: a short write, then EFBIG
    const uint64_t limit = off + CKPT_WRITE_SLICE + CKPT_WRITE_SLICE / 2 + 3;
    struct rlimit old_lim, lim;
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_lim), 0);
    lim = old_lim;
    lim.rlim_cur = limit;
    void (*old_sig)(int) = signal(SIGXFSZ, SIG_IGN);
    fd = open(path.c_str(), O_RDWR | O_TRUNC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int e = ckpt_pwrite_sliced(fd, data.data(), n, off, &at);
    setrlimit(RLIMIT_FSIZE, &old_lim);
    signal(SIGXFSZ, old_sig);
    close(fd);
    EXPECT_EQ(e, EFBIG);
    EXPECT_EQ(at, limit);
    got = read_file(path);
    ASSERT_EQ(got.size(), limit);
    EXPECT_TRUE(got.compare(off, limit - off, data, 0, limit - off) == 0);

    fd = open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(ckpt_pwrite_sliced(fd, data.data(), n, off, &at), EBADF);
    EXPECT_EQ(at, off);
    close(fd);
    rm_rf(t);
}

// A record written through the zip stream (payloads up to a piece, pickles) reaches write(2) in calls of at
// most CKPT_WRITE_SLICE too (stdio passes a larger fwrite on whole), and reads back with its CRC.
TEST(CkptPio, ZipStreamPayloadIsWrittenInSlices) {
    std::string t = make_tmpdir("fsdp-pio");
    std::string data = pattern(3 * CKPT_WRITE_SLICE + 5, 9), path = t + "/a.zip";
    FILE *f = fopen(path.c_str(), "wb");
    ASSERT_TRUE(f);
    zip_writer w;
    fsdp_err err;
    ASSERT_EQ(zip_writer_begin(&w, f, &err), 0) << err.msg;
    ASSERT_EQ(zip_writer_start(&w, "a/data/0", data.size(), &err), 0) << err.msg;
    long calls = write_syscalls();
    ASSERT_EQ(zip_writer_data(&w, data.data(), data.size(), &err), 0) << err.msg;
    if (calls >= 0) {
        EXPECT_GE(write_syscalls() - calls, 3);  // one 3 MiB write(2) without the slices
    }
    ASSERT_EQ(zip_writer_end_record(&w, &err), 0) << err.msg;
    uint64_t len = 0;
    ASSERT_EQ(zip_writer_finish(&w, &len, &err), 0) << err.msg;
    zip_writer_free(&w);
    ASSERT_EQ(fclose(f), 0);
    std::string z = read_file(path);
    EXPECT_EQ(z.size(), len);
    size_t at = z.find(data.substr(0, 64));
    ASSERT_NE(at, std::string::npos);
    EXPECT_TRUE(z.compare(at, data.size(), data) == 0);
    zip_reader zr;
    int fd = open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(zip_open_fd(&zr, fd, 0, len, path.c_str(), &err), 0) << err.msg;
    zip_entry *e = zip_find(&zr, "data/0");
    ASSERT_TRUE(e);
    EXPECT_EQ(zip_verify(&zr, e, &err), 0) << err.msg;
    zip_close(&zr);
    close(fd);
    rm_rf(t);
}

TEST(CkptPio, ParallelWriteGivesTheBytesAndTheCrcOfOneSequentialWrite) {
    std::string t = make_tmpdir("fsdp-pio");
    std::string data = pattern(777777, 3);
    uint32_t want = (uint32_t)crc32(0, (const Bytef *)data.data(), (uInt)data.size());
    fsdp_err err;
    for (int th : {1, 3}) {
        for (int wb : {0, 1}) {
            std::string p = t + "/w" + std::to_string(th) + std::to_string(wb);
            int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            ASSERT_GE(fd, 0);
            ckpt_pio_opts o = {10007, th, wb, 0};
            uint32_t crc = 0;
            ASSERT_EQ(ckpt_pwrite_all(fd, data.data(), data.size(), 100, &crc, p.c_str(), &o, &err), 0) << err.msg;
            close(fd);
            EXPECT_EQ(crc, want);
            std::string back = read_file(p);
            ASSERT_EQ(back.size(), data.size() + 100);
            EXPECT_EQ(back.substr(100), data);
            EXPECT_EQ(back.substr(0, 100), std::string(100, '\0'));
        }
    }
    // nothing to write: the CRC of no bytes
    int fd = open((t + "/empty").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    uint32_t crc = 1;
    ASSERT_EQ(ckpt_pwrite_all(fd, data.data(), 0, 0, &crc, "empty", nullptr, &err), 0) << err.msg;
    EXPECT_EQ(crc, (uint32_t)crc32(0, Z_NULL, 0));
    close(fd);
    // a read-only descriptor: a write error naming the file
    fd = open((t + "/w10").c_str(), O_RDONLY);
    err.msg[0] = 0;
    ckpt_pio_opts o = {4096, 2, 0, 0};
    EXPECT_EQ(ckpt_pwrite_all(fd, data.data(), 100000, 0, &crc, "ro-file", &o, &err), FSDP_E_IO);
    EXPECT_NE(std::string(err.msg).find("ro-file"), std::string::npos) << err.msg;
    close(fd);
    // parallel memcpy
    std::string dst(data.size(), '\0');
    ckpt_pio_opts co = {1000, 4, 0, 0};
    ckpt_copy_par(&dst[0], data.data(), data.size(), &co);
    EXPECT_EQ(dst, data);
    rm_rf(t);
}

TEST(CkptPio, LargeTorchSavePayloadIsByteIdenticalToTheStreamedOne) {
    std::string t = make_tmpdir("fsdp-pio");
    std::string payload = pattern(3 * 1048576 + 12, 4);
    fsdp_err err;
    // the same archive through the streamed and the parallel payload writer, after some
    // leading bytes so that the archive does not start at offset 0
    for (int par : {0, 1}) {
        FILE *f = fopen((t + "/z" + std::to_string(par)).c_str(), "w+b");
        ASSERT_TRUE(f);
        fwrite("lead", 1, 4, f);
        zip_writer zw;
        ASSERT_EQ(zip_writer_begin(&zw, f, &err), 0) << err.msg;
        ASSERT_EQ(zip_writer_add(&zw, "archive/data.pkl", "x", 1, &err), 0);
        ASSERT_EQ(zip_writer_start(&zw, "archive/data/0", payload.size(), &err), 0);
        size_t half = payload.size() / 2;
        // two pieces: the CRC of the record combines them
        if (par) {
            ASSERT_EQ(zip_writer_data_par(&zw, payload.data(), half, &err), 0) << err.msg;
            ASSERT_EQ(zip_writer_data_par(&zw, payload.data() + half, payload.size() - half, &err), 0) << err.msg;
        } else {
            ASSERT_EQ(zip_writer_data(&zw, payload.data(), half, &err), 0);
            ASSERT_EQ(zip_writer_data(&zw, payload.data() + half, payload.size() - half, &err), 0);
        }
        ASSERT_EQ(zip_writer_end_record(&zw, &err), 0) << err.msg;
        ASSERT_EQ(zip_writer_add(&zw, "archive/version", "3\n", 2, &err), 0);
        uint64_t len;
        ASSERT_EQ(zip_writer_finish(&zw, &len, &err), 0) << err.msg;
        zip_writer_free(&zw);
        fclose(f);
    }
    std::string a = read_file(t + "/z0"), b = read_file(t + "/z1");
    ASSERT_GT(a.size(), payload.size());
    EXPECT_TRUE(a == b) << "parallel payload writer changed the archive bytes";
    zip_reader z;
    ASSERT_EQ(zip_open_mem(&z, b.data() + 4, b.size() - 4, "z1", &err), 0) << err.msg;
    zip_entry *e = zip_find(&z, "data/0");
    ASSERT_TRUE(e);
    EXPECT_EQ(e->crc, (uint32_t)crc32(0, (const Bytef *)payload.data(), (uInt)payload.size()));
    zip_close(&z);
    rm_rf(t);
}

TEST(CkptPio, LargeTensorArchiveReadsBackWholeInBoxesAndConverted) {
    std::string t = make_tmpdir("fsdp-pio");
    const int64_t R = 640, C = 1000;  // 2.4 MiB of f32
    std::vector<float> v((size_t)(R * C));
    for (size_t i = 0; i < v.size(); i++) v[i] = (float)i * 0.25f - 1000.0f;
    int64_t shape[2] = {R, C};
    fsdp_err err;
    FILE *f = fopen((t + "/a.pt").c_str(), "wb");
    ASSERT_TRUE(f);
    uint64_t alen;
    ASSERT_EQ(ts_write_tensor(f, FSDP_DT_F32, 2, shape, v.data(), nullptr, nullptr, &alen, &err), 0) << err.msg;
    fclose(f);
    int fd = open((t + "/a.pt").c_str(), O_RDONLY);
    zip_reader z;
    ASSERT_EQ(zip_open_fd(&z, fd, 0, alen, "a.pt", &err), 0) << err.msg;
    EXPECT_EQ(zip_find(&z, "data/0")->crc, (uint32_t)crc32(0, (const Bytef *)v.data(), (uInt)(v.size() * 4)));
    pkl_doc *doc;
    const pkl_obj *root;
    ts_tensor tt;
    ASSERT_EQ(ts_load_pickle(&z, &doc, &root, &err), 0) << err.msg;
    ASSERT_EQ(ts_tensor_from_pickle(root, "a.pt", &tt, &err), 0) << err.msg;
    pkl_free(doc);
    std::vector<float> all(v.size());
    int64_t off[2] = {0, 0}, len[2] = {R, C};
    ASSERT_EQ(ts_read_box(&z, &tt, off, len, all.data(), FSDP_DT_F32, &err), 0) << err.msg;
    EXPECT_EQ(all, v);
    // a partial box (rows 100..599, columns 3..902) as f64
    int64_t bo[2] = {100, 3}, bl[2] = {500, 900};
    std::vector<double> box((size_t)(bl[0] * bl[1]));
    ASSERT_EQ(ts_read_box(&z, &tt, bo, bl, box.data(), FSDP_DT_F64, &err), 0) << err.msg;
    for (int64_t r = 0; r < bl[0]; r += 37)
        for (int64_t c = 0; c < bl[1]; c += 11)
            ASSERT_EQ(box[(size_t)(r * bl[1] + c)], (double)v[(size_t)((bo[0] + r) * C + bo[1] + c)]);
    zip_close(&z);
    close(fd);
    rm_rf(t);
}

TEST(CkptPio, SavedStateLoadsIntoEveryShardingAndDtype) {
    std::string t = make_tmpdir("fsdp-pio");
    std::string ck = t + "/ck";
    fsdp_err err;
    comm *c;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    fsdp_state *src = make_state(0, 1, true, true);
    sio_save_opts so = {};
    so.optimizer = 1;
    so.overwrite = 0;
    ASSERT_EQ(sio_save(src, c, ck.c_str(), &so, &err), 0) << err.msg;
    // every rank of a 3-way sharding reads its rows (partial boxes of the single chunk)
    for (int r = 0; r < 3; r++) {
        fsdp_state *dst = make_state(r, 3, false, false);
        sio_load_opts lo;
        memset(&lo, 0, sizeof lo);
        lo.strict = 1;
        lo.load_optimizer = 1;
        sio_load_result res;
        ASSERT_EQ(sio_load(dst, ck.c_str(), &lo, &res, &err), 0) << err.msg;
        for (size_t i = 0; i < dst->n; i++) {
            const state_param *p = &dst->p[i], *q = &src->p[i];
            size_t n = state_param_local_numel(p), at = (size_t)(p->row0 * p->row_numel);
            EXPECT_EQ(0, memcmp(p->data, q->data + at, n * 4)) << p->name << " rank " << r;
            EXPECT_EQ(0, memcmp(p->exp_avg, q->exp_avg + at, n * 4)) << p->name << " rank " << r;
            EXPECT_EQ(0, memcmp(p->exp_avg_sq, q->exp_avg_sq + at, n * 4)) << p->name << " rank " << r;
        }
        EXPECT_EQ(dst->opt_step, 3);
        state_free(dst);
    }
    // a column box of the large tensor, converted to bf16
    dcp_ckpt *d;
    ASSERT_EQ(dcp_open(ck.c_str(), &d, &err), 0) << err.msg;
    long i = dcp_find(d, "big.weight");
    ASSERT_GE(i, 0);
    int64_t off[2] = {5, 17}, len[2] = {700, 333};
    std::vector<uint16_t> bf((size_t)(len[0] * len[1]));
    ASSERT_EQ(dcp_read_box(d, (size_t)i, off, len, bf.data(), FSDP_DT_BF16, &err), 0) << err.msg;
    const state_param *bp = state_find(src, "big.weight");
    for (int64_t r = 0; r < len[0]; r += 13)
        for (int64_t k = 0; k < len[1]; k += 7)
            ASSERT_EQ(bf[(size_t)(r * len[1] + k)],
                      fsdp_f32_to_bf16(bp->data[(size_t)((off[0] + r) * 1024 + off[1] + k)]));
    dcp_close(d);
    // async and sync saves of a large state write the same data file
    sio_async *a;
    std::string ck2 = t + "/ck2";
    ASSERT_EQ(sio_save_begin(src, c, ck2.c_str(), &so, &a, &err), 0) << err.msg;
    ASSERT_EQ(sio_save_finish(a, &err), 0) << err.msg;
    sio_async_free(a);
    EXPECT_TRUE(dcp_data_blanked(ck + "/__0_0.distcp") == dcp_data_blanked(ck2 + "/__0_0.distcp"));
    state_free(src);
    comm_destroy(c);
    rm_rf(t);
}

TEST(CkptPio, TruncatedDataFileIsAnErrorNamingTheFile) {
    std::string t = make_tmpdir("fsdp-pio");
    std::string ck = t + "/ck";
    fsdp_err err;
    comm *c;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    fsdp_state *src = make_state(0, 1, true, false);
    sio_save_opts so = {};
    so.optimizer = 0;
    so.overwrite = 0;
    ASSERT_EQ(sio_save(src, c, ck.c_str(), &so, &err), 0) << err.msg;
    std::string data = read_file(ck + "/__0_0.distcp");
    ASSERT_GT(data.size(), 3u << 20);
    write_file(ck + "/__0_0.distcp", data.substr(0, data.size() / 2));
    fsdp_state *dst = make_state(0, 1, false, false);
    sio_load_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.strict = 1;
    sio_load_result res;
    err.msg[0] = 0;
    EXPECT_NE(sio_load(dst, ck.c_str(), &lo, &res, &err), 0);
    EXPECT_NE(std::string(err.msg).find("__0_0.distcp"), std::string::npos) << err.msg;
    EXPECT_NE(std::string(err.msg).find("truncated"), std::string::npos) << err.msg;
    state_free(dst);
    state_free(src);
    comm_destroy(c);
    rm_rf(t);
}

TEST(CkptPio, StrictLoadLeavesOnlyUnrestoredParametersNaN) {
    std::string t = make_tmpdir("fsdp-pio");
    std::string ck = t + "/ck";
    fsdp_err err;
    comm *c;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    fsdp_state *src = make_state(0, 1, true, false);
    sio_save_opts so = {};
    so.optimizer = 0;
    so.overwrite = 0;
    ASSERT_EQ(sio_save(src, c, ck.c_str(), &so, &err), 0) << err.msg;
    // the destination has one parameter more than the checkpoint, with non-NaN values
    fsdp_state *dst = make_state(0, 1, false, false);
    int64_t shape[1] = {300};
    ASSERT_EQ(state_add_param(dst, "extra.weight", 1, shape, -1, &err), 0) << err.msg;
    for (size_t i = 0; i < dst->n; i++)
        for (size_t k = 0; k < state_param_local_numel(&dst->p[i]); k++) dst->p[i].data[k] = 1.0f;
    sio_load_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.strict = 1;
    sio_load_result res;
    err.msg[0] = 0;
    EXPECT_NE(sio_load(dst, ck.c_str(), &lo, &res, &err), 0);
    EXPECT_NE(std::string(err.msg).find("extra.weight not restored"), std::string::npos) << err.msg;
    const state_param *x = state_find(dst, "extra.weight");
    for (size_t k = 0; k < 300; k++) ASSERT_TRUE(std::isnan(x->data[k])) << k;
    for (size_t i = 0; i < src->n; i++)
        EXPECT_EQ(0, memcmp(dst->p[i].data, src->p[i].data, state_param_local_numel(&src->p[i]) * 4)) << src->p[i].name;
    // a checkpoint value that is NaN is reported
    src->p[2].data[5] = NAN;
    so.overwrite = 1;
    ASSERT_EQ(sio_save(src, c, ck.c_str(), &so, &err), 0) << err.msg;
    fsdp_state *d2 = make_state(0, 1, false, false);
    err.msg[0] = 0;
    EXPECT_NE(sio_load(d2, ck.c_str(), &lo, &res, &err), 0);
    EXPECT_NE(std::string(err.msg).find("norm.weight holds NaN"), std::string::npos) << err.msg;
    state_free(d2);
    state_free(dst);
    state_free(src);
    comm_destroy(c);
    rm_rf(t);
}

TEST(CkptPio, ParallelConversionEqualsTheSequentialOne) {
    const size_t n = 100003;
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++) f[i] = (float)std::sin((double)i) * 1e3f;
    fsdp_err err;
    const fsdp_dtype dts[] = {FSDP_DT_BF16, FSDP_DT_F16, FSDP_DT_F64, FSDP_DT_I64};
    for (fsdp_dtype dt : dts) {
        size_t es = fsdp_dtype_size(dt);
        std::string want(n * es, '\0'), got(n * es, '\1');
        ASSERT_EQ(fsdp_convert(&want[0], dt, f.data(), FSDP_DT_F32, n, &err), 0) << err.msg;
        ckpt_pio_opts o = {4000, 3, 0, 0};
        ASSERT_EQ(ckpt_convert_par(&got[0], dt, f.data(), FSDP_DT_F32, n, &o, &err), 0) << err.msg;
        EXPECT_TRUE(want == got) << fsdp_dtype_name(dt);
        // and back to f32
        std::vector<float> back(n, -1.0f), back1(n, -2.0f);
        ASSERT_EQ(ckpt_convert_par(back.data(), FSDP_DT_F32, got.data(), dt, n, &o, &err), 0) << err.msg;
        ASSERT_EQ(fsdp_convert(back1.data(), FSDP_DT_F32, want.data(), dt, n, &err), 0) << err.msg;
        EXPECT_EQ(0, memcmp(back.data(), back1.data(), n * 4)) << fsdp_dtype_name(dt);
    }
    // a pair fsdp_convert refuses keeps its message
    std::vector<uint8_t> d(n);
    std::vector<float> c64(2 * n);
    ckpt_pio_opts o = {4000, 3, 0, 0};
    err.msg[0] = 0;
    EXPECT_NE(ckpt_convert_par(d.data(), FSDP_DT_F8_E4M3FN, c64.data(), FSDP_DT_C64, n, &o, &err), 0);
    EXPECT_NE(std::string(err.msg).find("cannot convert"), std::string::npos) << err.msg;
}

TEST(CkptPio, ZipEndRecordIsFoundBehindShortAndLongComments) {
    std::string t = make_tmpdir("fsdp-pio");
    float v[300];
    for (int i = 0; i < 300; i++) v[i] = (float)i;
    int64_t shape[1] = {300};
    fsdp_err err;
    FILE *f = fopen((t + "/a.pt").c_str(), "wb");
    ASSERT_TRUE(f);
    uint64_t alen;
    ASSERT_EQ(ts_write_tensor(f, FSDP_DT_F32, 1, shape, v, nullptr, nullptr, &alen, &err), 0) << err.msg;
    fclose(f);
    std::string a = read_file(t + "/a.pt");
    ASSERT_EQ(a.size(), alen);
    for (size_t clen : {0, 100, 5000, 65000}) {
        std::string b = a + std::string(clen, 'c');
        size_t eocd = a.size() - 22;
        ASSERT_EQ(b.substr(eocd, 4), std::string("PK\x05\x06"));
        b[eocd + 20] = (char)(clen & 0xff);
        b[eocd + 21] = (char)(clen >> 8);
        std::string p = t + "/c.pt";
        write_file(p, b);
        int fd = open(p.c_str(), O_RDONLY);
        zip_reader z;
        ASSERT_EQ(zip_open_fd(&z, fd, 0, b.size(), "c.pt", &err), 0) << clen << ": " << err.msg;
        EXPECT_EQ(z.n, 4u);
        zip_entry *e = zip_find(&z, "data/0");
        ASSERT_TRUE(e);
        float back[300];
        ASSERT_EQ(zip_read(&z, e, 0, back, sizeof back, &err), 0) << err.msg;
        EXPECT_EQ(0, memcmp(back, v, sizeof v));
        zip_close(&z);
        close(fd);
    }
    rm_rf(t);
}

// The mapping of /proc/self/smaps that holds address p: its VmFlags line ("" when not found).
static std::string vm_flags_of(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return "";
    char line[512];
    bool in = false;
    std::string flags;
    uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) { /* a mapping's first line */
            if (in) break;
            in = a >= lo && a < hi;
        } else if (in && !strncmp(line, "VmFlags:", 8)) {
            flags = line + 8;
            break;
        }
    }
    fclose(f);
    return flags;
}

TEST(CkptPio, DirectWriteBuffersAreBlockAlignedAndOnHugePagesFromOneMiB) {
    for (size_t n : {(size_t)1, (size_t)4095, (size_t)4096, ((size_t)1 << 20) - 1}) {
        char *p = (char *)ckpt_dio_alloc(n);
        ASSERT_NE(p, nullptr) << n;
        EXPECT_EQ((uintptr_t)p % CKPT_DIRECT_ALIGN, 0u) << n;
        memset(p, 0x5a, n);
        free(p);
    }
    const bool thp = access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0;
    for (size_t n : {(size_t)1 << 20, ((size_t)8 << 20) + 4096, ((size_t)3 << 20) + 5}) {
        char *p = (char *)ckpt_dio_alloc(n);
        ASSERT_NE(p, nullptr) << n;
        EXPECT_EQ((uintptr_t)p % ((size_t)2 << 20), 0u) << n;
        size_t cap = (n + ((size_t)2 << 20) - 1) / ((size_t)2 << 20) * ((size_t)2 << 20);
        memset(p, 0x5a, cap); /* the whole rounded size is the buffer's */
        // the region is advised for huge pages (VmFlags "hg"), whether or not the kernel had one to give
        if (thp) {
            EXPECT_NE(vm_flags_of(p).find(" hg"), std::string::npos) << n << ": " << vm_flags_of(p);
        }
        free(p);
    }
}

TEST(CkptPio, NaNScanFindsEveryNaNAtEveryPlaceAndNothingElse) {
    // the scan is compiled for several instruction sets (the one this CPU runs is the one tested): every lane and
    // tail position, quiet and signalling NaNs of both signs; infinities, the largest finite and -0 are not NaN
    std::vector<float> v(1000);
    for (size_t i = 0; i < v.size(); i++) v[i] = (float)i * 0.5f - 100.0f;
    v[3] = INFINITY, v[4] = -INFINITY, v[5] = 3.4028235e38f, v[6] = -0.0f;
    for (size_t n : {(size_t)1, (size_t)7, (size_t)16, (size_t)33, (size_t)1000})
        EXPECT_FALSE(ckpt_f32_has_nan(v.data(), n)) << n;
    const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu};
    for (uint32_t bits : nans)
        for (size_t at = 0; at < 70; at++) {
            std::vector<float> w(v.begin(), v.begin() + 70);
            memcpy(&w[at], &bits, sizeof bits);
            EXPECT_TRUE(ckpt_f32_has_nan(w.data(), w.size())) << std::hex << bits << " at " << std::dec << at;
            EXPECT_EQ(ckpt_f32_has_nan(w.data(), at), 0) << "the NaN lies past the range, at " << at;
        }
}

TEST(CkptPio, PrefaultMakesFreshPagesResidentAndLeavesTheBytes) {
    const long pg = sysconf(_SC_PAGESIZE);
    const size_t n = (size_t)4 << 20;
    char *p = (char *)mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    std::vector<unsigned char> vec(n / (size_t)pg);
    auto resident = [&](size_t a, size_t b) {  // pages of [a, b) resident
        size_t k = 0;
        EXPECT_EQ(mincore(p, n, vec.data()), 0);
        for (size_t i = a / (size_t)pg; i < b / (size_t)pg; i++) k += vec[i] & 1;
        return k;
    };
    EXPECT_EQ(resident(0, n), 0u);
    mempages_prefault(p, 16 << 10); /* below 64 KiB: nothing */
    EXPECT_EQ(resident(0, n), 0u);
    mempages_prefault(p + 100, ((size_t)1 << 20) - 200); /* the pages under the range, not past them */
#ifdef MADV_POPULATE_WRITE
    // where this kernel has it (Linux 5.14): a page of another mapping asked the same way says
    void *probe = mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(probe, MAP_FAILED);
    const bool kernel_has_it = madvise(probe, (size_t)pg, MADV_POPULATE_WRITE) == 0;
    munmap(probe, (size_t)pg);
    if (kernel_has_it) {
        EXPECT_EQ(resident(0, (size_t)1 << 20), ((size_t)1 << 20) / (size_t)pg);
        EXPECT_EQ(resident((size_t)2 << 20, n), 0u);
    }
#endif
    for (size_t i = 0; i < ((size_t)1 << 20); i++) ASSERT_EQ(p[i], 0) << i;
    for (size_t i = 0; i < n; i++) p[i] = (char)(i * 131u);
    mempages_prefault(p, n); /* written memory keeps its bytes */
    for (size_t i = 0; i < n; i++) ASSERT_EQ(p[i], (char)(i * 131u)) << i;
    munmap(p, n);
}
