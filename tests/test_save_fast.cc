// Issue 18, item 1: the save's payloads go through ckpt_pwrite_conv (ckpt/ckpt_pwrite.h): pieces
// converted and CRC'd by several threads, written in file order. The files must be the bytes of
// the one-thread path (FSDP_SAVE_THREADS=1) for f32 and bf16 saves on 1, 2 and 3 ranks, hold
// PyTorch's values (the fixture they were loaded from), and a write that fails part-way (a
// short write, then EFBIG / ENOSPC) must leave the old checkpoint and a clear error.
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <set>
#include <vector>

#include "test_util.h"

extern "C" {
#include <zlib.h>

#include "ckpt/ckpt_pwrite.h"
}

using namespace fsdp_test;

namespace {

const char *const kIgnore = " --ignore 'train_state.**,lr_scheduler.**,dataloader.**,optimizer.param_groups.**'";

std::string fixture() { return tiny("dcp_full_ws3"); }

// load PyTorch's 3-rank checkpoint, optionally cast every parameter to bf16, save to ${ck}
std::string write_recipe(const std::string &dir, bool bf16) {
    std::string y = "model: {preset: tiny}\nvars: {ck: x}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                    fixture() + "}}\n";
    if (bf16) y += "  - {id: c, uses: transform, with: {ops: [{cast: {keys: \"**\", dtype: bf16}}]}}\n";
    y += "  - {id: s, uses: save-dcp, with: {path: \"${ck}\", overwrite: true}}\n";
    std::string p = dir + (bf16 ? "/bf16.yaml" : "/f32.yaml");
    write_file(p, y);
    return p;
}

int save(int np, const std::string &env, const std::string &yaml, const std::string &ck, std::string *out) {
    std::string cmd = env + " timeout 300 " + (np > 1 ? mpirun_prefix(np) + " " : std::string()) + fsdp_run_bin() +
                      " -q " + yaml + " --set vars.ck=" + ck;
    return run_cmd(cmd, out);
}

std::vector<std::string> names(const std::string &dir) {
    std::vector<std::string> v;
    DIR *d = opendir(dir.c_str());
    if (!d) return v;
    while (struct dirent *e = readdir(d))
        if (e->d_name[0] != '.' || !strcmp(e->d_name, ".metadata")) v.push_back(e->d_name);
    closedir(d);
    std::sort(v.begin(), v.end());
    return v;
}

void expect_same_files(const std::string &a, const std::string &b) {
    auto na = names(a), nb = names(b);
    ASSERT_EQ(na, nb);
    ASSERT_GT(na.size(), 1u);
    for (auto &n : na) {
        if (n == ".metadata") continue;
        std::string x = dcp_data_blanked(a + "/" + n), y = dcp_data_blanked(b + "/" + n);
        EXPECT_GT(x.size(), 0u) << n;
        EXPECT_TRUE(x == y) << n << " differs between " << a << " and " << b;
    }
    EXPECT_TRUE(dcp_metadata_blanked(a) == dcp_metadata_blanked(b)) << ".metadata differs: " << a << " " << b;
}

// fast (3 threads, 4 KiB pieces: every tensor in many pieces), default and one-thread saves
void same_bytes_fast_and_fallback(int np, bool bf16) {
    std::string t = make_tmpdir("fsdp-savefast"), out;
    std::string yaml = write_recipe(t, bf16);
    ASSERT_EQ(save(np, "FSDP_SAVE_THREADS=3 FSDP_SAVE_PIECE_KB=4", yaml, t + "/fast", &out), 0) << out;
    ASSERT_EQ(save(np, "FSDP_SAVE_THREADS=1", yaml, t + "/slow", &out), 0) << out;
    ASSERT_EQ(save(np, "", yaml, t + "/dflt", &out), 0) << out;
    expect_same_files(t + "/fast", t + "/slow");
    expect_same_files(t + "/dflt", t + "/slow");
    // every record's CRC as our reader checks it, and PyTorch's values (rounded for bf16)
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " ckpt inspect " + t + "/fast --verify", &out), 0) << out;
    std::string diff = fsdp_run_bin() + " ckpt diff " + (bf16 ? "--round " : "") + t + "/fast " + fixture() + kIgnore;
    EXPECT_EQ(run_cmd(diff, &out), 0) << out;
    EXPECT_NE(out.find("equal:"), std::string::npos) << out;
    if (bf16) {
        EXPECT_NE(out.find("dtype bf16 vs f32"), std::string::npos) << out;
    }
    rm_rf(t);
}

}  // namespace

TEST(SaveFast, F32OneRankSameBytesFastAndFallback) { same_bytes_fast_and_fallback(1, false); }
TEST(SaveFast, F32TwoRanksSameBytesFastAndFallback) { same_bytes_fast_and_fallback(2, false); }
TEST(SaveFast, F32ThreeRanksSameBytesFastAndFallback) { same_bytes_fast_and_fallback(3, false); }
TEST(SaveFast, Bf16OneRankSameBytesFastAndFallback) { same_bytes_fast_and_fallback(1, true); }
TEST(SaveFast, Bf16TwoRanksSameBytesFastAndFallback) { same_bytes_fast_and_fallback(2, true); }
TEST(SaveFast, Bf16ThreeRanksSameBytesFastAndFallback) { same_bytes_fast_and_fallback(3, true); }

// A save over a checkpoint whose data file cannot grow past 600 KiB (RLIMIT_FSIZE, SIGXFSZ
// ignored: the write crossing the limit is short, the next one fails with EFBIG) in the middle
// of the threaded write: exit 1, the error names the file and the reason, the old checkpoint
// is still there and whole, no temporary is left.
static void failed_write_keeps_old(int np) {
    std::string t = make_tmpdir("fsdp-savefast"), out;
    std::string yaml = write_recipe(t, false);
    ASSERT_EQ(save(np, "", yaml, t + "/ck", &out), 0) << out;
    ASSERT_EQ(save(np, "", yaml, t + "/ref", &out), 0) << out;
    // the limit inside each rank (mpirun's own files must not meet it)
    std::string cmd = "FSDP_SAVE_THREADS=3 FSDP_SAVE_PIECE_KB=16 timeout 300 " +
                      (np > 1 ? mpirun_prefix(np) + " " : std::string()) + "bash -c \"trap '' XFSZ; ulimit -f 600; exec " +
                      fsdp_run_bin() + " -q " + yaml + " --set vars.ck=" + t + "/ck\"";
    int rc = run_cmd(cmd, &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("File too large"), std::string::npos) << out;
    EXPECT_NE(out.find(".distcp.tmp"), std::string::npos) << out;
    for (auto &n : names(t + "/ck")) EXPECT_EQ(n.find(".tmp"), std::string::npos) << n;
    EXPECT_EQ(names(t + "/ck"), names(t + "/ref"));
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " ckpt diff " + t + "/ck " + t + "/ref", &out), 0) << out;
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " ckpt inspect " + t + "/ck --verify", &out), 0) << out;
    rm_rf(t);
}

TEST(SaveFastFault, ShortWriteThenEfbigKeepsOldCheckpointOneRank) { failed_write_keeps_old(1); }
TEST(SaveFastFault, ShortWriteThenEfbigKeepsOldCheckpointTwoRanks) { failed_write_keeps_old(2); }

// ---- ckpt_pwrite_conv itself ------------------------------------------------------------------

namespace {
std::vector<float> values(size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = (float)((double)(i % 977) * 0.37 - 150.0) / (1.0f + (float)(i % 13));
    return v;
}
std::string file_bytes(int fd) {
    off_t n = lseek(fd, 0, SEEK_END);
    std::string s((size_t)n, '\0');
    EXPECT_EQ(pread(fd, &s[0], s.size(), 0), (ssize_t)n);
    return s;
}
}  // namespace

// f32 -> bf16 and f32 -> f32 at an unaligned offset: the bytes are fsdp_convert's of the whole
// array and the CRC is zlib's of them, for one thread and for several threads and piece sizes
TEST(SaveFastPwrite, ConvertedBytesAndCrcAreThoseOfOneThread) {
    std::string t = make_tmpdir("fsdp-savefast");
    const size_t n = 300001;
    auto v = values(n);
    for (fsdp_dtype dt : {FSDP_DT_BF16, FSDP_DT_F32, FSDP_DT_F16}) {
        size_t esz = fsdp_dtype_size(dt);
        std::string want(n * esz, '\0');
        fsdp_err err;
        ASSERT_EQ(fsdp_convert(&want[0], dt, v.data(), FSDP_DT_F32, n, &err), 0) << err.msg;
        uint32_t want_crc = (uint32_t)crc32(0L, (const Bytef *)want.data(), (uInt)want.size());
        for (int threads : {1, 2, 3, 7}) {
            for (size_t piece : {(size_t)0, (size_t)4096, (size_t)12345, (size_t)1 << 20}) {
                std::string p = t + "/f";
                int fd = open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
                ASSERT_GE(fd, 0);
                ASSERT_EQ(pwrite(fd, "hdr", 3, 0), 3);
                ckpt_pio_opts o = {piece, threads, 1, 0};
                uint32_t crc = 0;
                ASSERT_EQ(ckpt_pwrite_conv(fd, v.data(), FSDP_DT_F32, dt, n, 3, &crc, "t", &o, &err), 0) << err.msg;
                std::string got = file_bytes(fd);
                close(fd);
                EXPECT_EQ(got.substr(0, 3), "hdr");
                EXPECT_TRUE(got.substr(3) == want) << fsdp_dtype_name(dt) << " threads " << threads << " piece " << piece;
                EXPECT_EQ(crc, want_crc) << fsdp_dtype_name(dt) << " threads " << threads << " piece " << piece;
            }
        }
    }
    rm_rf(t);
}

// every piece fails (/dev/full: ENOSPC): whichever thread meets it, the caller gets the error,
// naming what and the first byte not written; nothing is reported as written
TEST(SaveFastPwrite, EveryThreadsErrorReachesTheCaller) {
    int fd = open("/dev/full", O_WRONLY);
    if (fd < 0) GTEST_SKIP() << "no /dev/full";
    auto v = values(1 << 16);
    for (int threads : {1, 2, 4}) {
        ckpt_pio_opts o = {4096, threads, 0, 0};
        fsdp_err err;
        uint32_t crc = 0;
        EXPECT_EQ(ckpt_pwrite_conv(fd, v.data(), FSDP_DT_F32, FSDP_DT_BF16, v.size(), 4096, &crc, "layer.w in x.distcp",
                                   &o, &err),
                  FSDP_E_IO);
        EXPECT_NE(strstr(err.msg, "layer.w in x.distcp: write error at byte 4096: No space left on device"), nullptr)
            << err.msg;
    }
    close(fd);
    // a descriptor that cannot write at all (a pipe: no positional writes)
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    ckpt_pio_opts o = {4096, 3, 0, 0};
    fsdp_err err;
    EXPECT_EQ(ckpt_pwrite_all(p[1], v.data(), v.size() * 4, 0, nullptr, "piped", &o, &err), FSDP_E_IO);
    EXPECT_NE(strstr(err.msg, "piped: write error at byte 0: Illegal seek"), nullptr) << err.msg;
    close(p[0]);
    close(p[1]);
}

// a dtype pair fsdp_convert refuses is refused before anything is written
TEST(SaveFastPwrite, RefusedConversionWritesNothing) {
    std::string t = make_tmpdir("fsdp-savefast"), p = t + "/f";
    int fd = open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    auto v = values(1000);
    ckpt_pio_opts o = {256, 2, 0, 0};
    fsdp_err err;
    EXPECT_NE(ckpt_pwrite_conv(fd, v.data(), FSDP_DT_F32, FSDP_DT_C64, v.size(), 0, nullptr, "odd", &o, &err), 0);
    EXPECT_NE(strstr(err.msg, "odd"), nullptr) << err.msg;
    EXPECT_EQ(lseek(fd, 0, SEEK_END), 0);
    close(fd);
    rm_rf(t);
}

// the environment's options: FSDP_SAVE_THREADS=1 selects the one-thread path
TEST(SaveFastPwrite, OptionsFromTheEnvironment) {
    ckpt_pio_opts o;
    setenv("FSDP_SAVE_THREADS", "1", 1);
    setenv("FSDP_SAVE_PIECE_KB", "64", 1);
    ckpt_pwrite_opts_env(&o);
    EXPECT_EQ(o.threads, 1);
    EXPECT_EQ(o.piece, (size_t)64 << 10);
    EXPECT_EQ(o.writeback, 1);
    setenv("FSDP_SAVE_THREADS", "x", 1);
    unsetenv("FSDP_SAVE_PIECE_KB");
    ckpt_pwrite_opts_env(&o);
    EXPECT_EQ(o.threads, 0);
    EXPECT_EQ(o.piece, 0u);
    unsetenv("FSDP_SAVE_THREADS");
}

namespace {
// pages of a file in the page cache (mincore of a mapping): direct writes leave none behind
std::vector<unsigned char> resident(const std::string &p, size_t bytes) {
    int fd = open(p.c_str(), O_RDONLY);
    void *m = fd >= 0 ? mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    std::vector<unsigned char> v((bytes + 4095) / 4096);
    if (m != MAP_FAILED) {
        if (mincore(m, bytes, v.data()) != 0) v.clear();
        munmap(m, bytes);
    } else {
        v.clear();
    }
    if (fd >= 0) close(fd);
    return v;
}

// whether the directory's file system takes O_DIRECT (tmpfs does not)
bool takes_direct(const std::string &dir) {
    std::string p = dir + "/probe";
    int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
    if (fd >= 0) close(fd);
    unlink(p.c_str());
    return fd >= 0;
}
}  // namespace

// O_DIRECT payloads (the default of a save): the same bytes and CRC as a buffered write, at any piece
// and thread count, with or without a conversion; the whole blocks are written past the page cache and
// only the last partial block goes through it; an offset that is not a block boundary, or a file system
// without O_DIRECT, writes through the page cache with the same result
TEST(SaveFastPwrite, DirectWritesGiveTheBytesOfABufferedWriteAndBypassThePageCache) {
    std::string t = make_tmpdir("fsdp-direct");
    const size_t n = (3u << 18) + 17; /* 3 MiB of f32 + 17 values: a partial last block */
    auto v = values(n);
    bool direct_fs = takes_direct(t);
    for (fsdp_dtype dt : {FSDP_DT_F32, FSDP_DT_BF16}) {
        size_t esz = fsdp_dtype_size(dt);
        std::string want(n * esz, '\0');
        fsdp_err err;
        ASSERT_EQ(fsdp_convert(&want[0], dt, v.data(), FSDP_DT_F32, n, &err), 0) << err.msg;
        uint32_t want_crc = (uint32_t)crc32(0L, (const Bytef *)want.data(), (uInt)want.size());
        for (uint64_t off : {(uint64_t)8192, (uint64_t)100}) {
            for (int threads : {1, 3}) {
                std::string p = t + "/f";
                int fd = open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
                ASSERT_GE(fd, 0);
                ASSERT_EQ(pwrite(fd, "hdr", 3, 0), 3);
                ckpt_pio_opts o = {(size_t)1 << 20, threads, 1, 1};
                uint32_t crc = 0;
                ASSERT_EQ(ckpt_pwrite_conv(fd, v.data(), FSDP_DT_F32, dt, n, off, &crc, "t", &o, &err), 0) << err.msg;
                EXPECT_EQ(fcntl(fd, F_GETFL) & O_DIRECT, 0) << "the descriptor is back to buffered writes";
                ASSERT_EQ(pwrite(fd, "end", 3, (off_t)(off + n * esz)), 3) << "a buffered write after it";
                close(fd);
                std::string what = std::string(fsdp_dtype_name(dt)) + " offset " + std::to_string(off) + " threads " +
                                   std::to_string(threads);
                /* before anything reads the file back */
                std::vector<unsigned char> r = resident(p, (size_t)(off + n * esz + 3));
                std::string got = read_file(p);
                ASSERT_EQ(got.size(), off + n * esz + 3) << what;
                EXPECT_EQ(got.substr(0, 3), "hdr") << what;
                EXPECT_TRUE(got.substr(off, n * esz) == want) << what;
                EXPECT_EQ(got.substr(off + n * esz), "end") << what;
                EXPECT_EQ(crc, want_crc) << what;
                if (!direct_fs) continue;
                ASSERT_FALSE(r.empty());
                /* a payload inside a block: up to the next boundary through the page cache, then direct */
                size_t first = (size_t)((off + 4095) / 4096), last = (size_t)((off + n * esz) / 4096);
                size_t cached = 0;
                for (size_t k = first; k < last; k++) cached += r[k] & 1;
                EXPECT_EQ(cached, 0u) << what << ": the whole blocks were written past the page cache";
            }
        }
    }
    rm_rf(t);
}
