// `fsdp-run ckpt convert` streamed through a small ring of buffers (ckpt/ckpt_stream.h): the same
// bytes as the whole-tensor path (FSDP_CONVERT_STREAM=0), memory bounded by the ring, errors named
// and no half-written destination; the N -> M reshard (--world M) equal to load-ckpt + save-dcp.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

extern "C" {
#include "ckpt/ckpt_stream.h"
#include "ckpt/reader.h"
}

using namespace fsdp_test;

namespace {

const char *STREAM_OFF = "FSDP_CONVERT_STREAM=0 ";
// pieces of 4 KiB: every tensor of the tiny fixtures larger than the ring of 4 of them
const char *SMALL_RING = "FSDP_CONVERT_PIECE=4096 ";
// the same with the kernel copying the pieces no CRC-32 needs (copy_file_range; the reader reads none of them)
const char *SMALL_RING_CFR = "FSDP_CONVERT_PIECE=4096 FSDP_CONVERT_CFR=1 ";

std::string ckpt_bin() { return fsdp_run_bin() + " ckpt "; }


// Every file of two DCP directories equal (the .metadata up to its uuid); "" or what differs.
std::string dcp_diff(const std::string &a, const std::string &b) {
    std::string la, lb;
    run_cmd("cd '" + a + "' && ls -A", &la);
    run_cmd("cd '" + b + "' && ls -A", &lb);
    if (la != lb) return "files: [" + la + "] vs [" + lb + "]";
    if (dcp_metadata_blanked(a) != dcp_metadata_blanked(b)) return ".metadata differs";
    size_t p = 0;
    while (p < la.size()) {
        size_t e = la.find('\n', p);
        std::string f = la.substr(p, e - p);
        p = e == std::string::npos ? la.size() : e + 1;
        if (f.empty() || f == ".metadata") continue;
        if (dcp_data_blanked(a + "/" + f) != dcp_data_blanked(b + "/" + f)) return f + " differs";
    }
    return "";
}

// Runs a shell command: its exit status, output and peak RSS (KiB): the VmHWM of the command's own
// address space, polled until it exits. Not getrusage: a child's ru_maxrss starts from the RSS of the
// process it was forked from (fork copies the high-water mark and exec keeps it), which under
// AddressSanitizer is the test binary's hundreds of MB, more than the converts measured here.
struct MRun {
    int rc = -1;
    long rss_kib = -1;
    std::string out;
};
// VmHWM of pid once it runs another program than this one (before its exec it is our copy), else -1
long exec_hwm_kib(pid_t pid, const std::string &self_exe) {
    std::string p = "/proc/" + std::to_string(pid);
    char exe[4096];
    ssize_t n = readlink((p + "/exe").c_str(), exe, sizeof exe - 1);
    if (n <= 0 || std::string(exe, (size_t)n) == self_exe) return -1;
    std::string st = read_file(p + "/status");
    size_t at = st.find("VmHWM:");
    return at == std::string::npos ? -1 : std::atol(st.c_str() + at + 6);
}
MRun run_measured(const std::string &cmd, const std::string &outp) {
    MRun r;
    char self[4096];
    ssize_t sn = readlink("/proc/self/exe", self, sizeof self - 1);
    std::string self_exe = sn > 0 ? std::string(self, (size_t)sn) : std::string();
    // "exec": the shell becomes the command (the same pid) rather than its parent
    std::string line = "exec env " + cmd;
    pid_t g = fork();
    if (g < 0) return r;
    if (g == 0) {
        int fd = open(outp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execl("/bin/sh", "sh", "-c", line.c_str(), (char *)nullptr);
        _exit(127);
    }
    int st = 0;
    for (;;) {
        long h = exec_hwm_kib(g, self_exe);
        if (h > r.rss_kib) r.rss_kib = h;
        pid_t w = waitpid(g, &st, WNOHANG);
        if (w == g) break;
        if (w < 0) return r;
        usleep(500);
    }
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = read_file(outp);
    return r;
}

// A safetensors file with one f32 tensor "w" of rows x cols (values i * 0.25 mod 1000).
void write_big_st(const std::string &path, int rows, int cols) {
    size_t n = (size_t)rows * cols;
    std::string hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(rows) + "," + std::to_string(cols) +
                      "],\"data_offsets\":[0," + std::to_string(n * 4) + "]}}";
    while (hdr.size() % 8) hdr += ' ';
    std::string data(n * 4, '\0');
    for (size_t i = 0; i < n; i++) {
        float f = (float)(i % 4000) * 0.25f;
        memcpy(&data[i * 4], &f, 4);
    }
    std::string len(8, '\0');
    for (int i = 0; i < 8; i++) len[i] = (char)((hdr.size() >> (8 * i)) & 0xff);
    write_file(path, len + hdr + data);
}

// A safetensors file of f32 tensors of the given shapes, in order (values from the tensor's index and the
// element's), its header padded to 8 bytes as safetensors writes: payloads at offsets inside 4 KiB blocks.
void write_multi_st(const std::string &path, const std::vector<std::pair<int, int>> &shapes) {
    std::string hdr = "{", data;
    for (size_t t = 0; t < shapes.size(); t++) {
        size_t n = (size_t)shapes[t].first * shapes[t].second, at = data.size();
        data.resize(at + n * 4);
        for (size_t i = 0; i < n; i++) {
            float f = (float)((i * 7 + t * 131) % 5003) * 0.125f - 300.0f;
            memcpy(&data[at + i * 4], &f, 4);
        }
        hdr += std::string(t ? "," : "") + "\"t" + std::to_string(t) + "\":{\"dtype\":\"F32\",\"shape\":[" +
               std::to_string(shapes[t].first) + "," + std::to_string(shapes[t].second) + "],\"data_offsets\":[" +
               std::to_string(at) + "," + std::to_string(data.size()) + "]}";
    }
    hdr += "}";
    while (hdr.size() % 8) hdr += ' ';
    std::string len(8, '\0');
    for (int i = 0; i < 8; i++) len[i] = (char)((hdr.size() >> (8 * i)) & 0xff);
    write_file(path, len + hdr + data);
}

}  // namespace

// DCP -> safetensors, streamed (with copy_file_range and without, pieces far smaller than the
// tensors) and through the whole-tensor path: the same file, f32 and --dtype bf16; every fixture
// (one rank, two ranks' chunks, the dtypes checkpoint with views and empty tensors, HF shards).
TEST(ConvertStream, ToSafetensorsEqualsWholeTensorPath) {
    std::string t = make_tmpdir("fsdp-cvst"), out;
    int k = 0;
    for (const char *src : {"dcp_seed_ws1", "dcp_model_ws2", "dcp_dtypes", "model.safetensors.index.json"}) {
        for (const char *dt : {"", " --dtype bf16"}) {
            if (std::string(src) == "dcp_dtypes" && *dt) continue; // (ints and bools do not convert)
            std::string base = t + "/w" + std::to_string(k++), whole = base + "-whole.safetensors";
            ASSERT_EQ(run_cmd(std::string(STREAM_OFF) + ckpt_bin() + "convert " + tiny(src) + " " + whole + dt, &out), 0)
                << src << dt << ": " << out;
            for (const char *env : {"", SMALL_RING, SMALL_RING_CFR}) {
                std::string s = base + "-s" + std::to_string(strlen(env)) + ".safetensors";
                ASSERT_EQ(run_cmd(std::string(env) + ckpt_bin() + "convert " + tiny(src) + " " + s + dt, &out), 0)
                    << src << dt << " " << env << ": " << out;
                EXPECT_TRUE(read_file(s) == read_file(whole)) << src << dt << " " << env << ": streamed output differs";
            }
            // onto another file system (tmpfs): the kernel refuses to copy across (EXDEV) and the pieces the
            // reader left in the file go through the ring after all
            std::string shm = make_tmpdir_in("/dev/shm", "fsdp-cvst");
            if (!shm.empty()) {
                std::string s = shm + "/x.safetensors";
                ASSERT_EQ(run_cmd(std::string(SMALL_RING_CFR) + ckpt_bin() + "convert " + tiny(src) + " " + s + dt, &out), 0)
                    << src << dt << " (tmpfs): " << out;
                EXPECT_TRUE(read_file(s) == read_file(whole)) << src << dt << " (tmpfs): streamed output differs";
                rm_rf(shm);
            }
        }
    }
    rm_rf(t);
}

// safetensors (and DCP) -> DCP the same way: every data file byte for byte, .metadata up to its uuid.
TEST(ConvertStream, ToDcpEqualsWholeTensorPath) {
    std::string t = make_tmpdir("fsdp-cvdc"), out;
    int k = 0;
    for (const char *src : {"model_step5.safetensors", "model.safetensors.index.json", "dcp_model_ws2", "dcp_full_ws3",
                            "dcp_dtypes"}) {
        for (const char *dt : {"", " --dtype bf16"}) {
            if (std::string(src) == "dcp_dtypes" && *dt) continue;
            std::string base = t + "/d" + std::to_string(k++), whole = base + "-w";
            ASSERT_EQ(run_cmd(std::string(STREAM_OFF) + ckpt_bin() + "convert " + tiny(src) + " " + whole + " --to dcp" + dt,
                              &out), 0) << src << dt << ": " << out;
            for (const char *env : {"", SMALL_RING, SMALL_RING_CFR}) {
                std::string s = base + "-" + std::to_string(strlen(env) % 10);
                ASSERT_EQ(run_cmd(std::string(env) + ckpt_bin() + "convert " + tiny(src) + " " + s + " --to dcp" + dt, &out), 0)
                    << src << dt << " " << env << ": " << out;
                EXPECT_EQ(dcp_diff(whole, s), "") << src << dt << " " << env;
            }
            // and it reads back as the source (CRCs included)
            ASSERT_EQ(run_cmd(ckpt_bin() + "inspect --verify " + base + "-0", &out), 0) << out;
        }
    }
    rm_rf(t);
}

// Tensors of several pieces at the default ring (8 MiB pieces, direct writes by two threads, each piece read at
// its output offset's place within a block) whose payloads start and end inside blocks, both ways and with a
// conversion: byte for byte what the whole-tensor path writes. A piece read at the wrong place, or halves
// written at each other's offsets, changes the bytes.
TEST(ConvertStream, DirectPiecesAtOddOffsetsEqualWholeTensorPath) {
    std::string t = make_tmpdir("fsdp-cvodd"), out;
    write_multi_st(t + "/src.safetensors", {{1031, 1025}, {7, 3}, {3001, 1999}, {513, 4097}, {2, 1}});
    const std::string c = ckpt_bin() + "convert ";
    ASSERT_EQ(run_cmd(std::string(STREAM_OFF) + c + t + "/src.safetensors " + t + "/w --to dcp", &out), 0) << out;
    ASSERT_EQ(run_cmd(c + t + "/src.safetensors " + t + "/s --to dcp", &out), 0) << out;
    EXPECT_EQ(dcp_diff(t + "/w", t + "/s"), "");
    for (const char *dt : {"", " --dtype bf16"}) {
        std::string w = t + "/w" + (*dt ? "bf" : "") + ".safetensors", s = t + "/s" + (*dt ? "bf" : "") + ".safetensors";
        ASSERT_EQ(run_cmd(std::string(STREAM_OFF) + c + t + "/w " + w + dt, &out), 0) << out;
        ASSERT_EQ(run_cmd(c + t + "/s " + s + dt, &out), 0) << out;
        EXPECT_TRUE(read_file(w) == read_file(s)) << "DCP -> safetensors" << dt << ": streamed output differs";
    }
    EXPECT_EQ(run_cmd(ckpt_bin() + "diff " + t + "/s.safetensors " + t + "/src.safetensors", &out), 0) << out;
    rm_rf(t);
}

// DCP -> safetensors writes neighbouring tensors of the file as one run; a record damaged inside the third of
// them still fails the convert on its CRC naming that tensor (not the run's first) and its file, a source cut
// inside it names the file, and no safetensors file is left.
TEST(ConvertStream, DamageInsideARunOfTensorsIsNamed) {
    std::string t = make_tmpdir("fsdp-cvrun"), out;
    write_multi_st(t + "/src.safetensors", {{64, 64}, {8, 8}, {3001, 1999}, {5, 5}});
    ASSERT_EQ(run_cmd(ckpt_bin() + "convert " + t + "/src.safetensors " + t + "/d --to dcp", &out), 0) << out;
    std::string f = t + "/d/__0_0.distcp", bytes = read_file(f);
    ASSERT_GT(bytes.size(), (size_t)20000000);
    bytes[bytes.size() / 2] ^= 0x5a; // inside t2's 24 MB record (t0, t1 and t3 are small)
    write_file(f, bytes);
    for (const char *env : {"", SMALL_RING, STREAM_OFF}) {
        EXPECT_EQ(run_cmd(std::string(env) + ckpt_bin() + "convert " + t + "/d " + t + "/x.safetensors", &out), 1) << env << out;
        EXPECT_NE(out.find("CRC"), std::string::npos) << env << out;
        EXPECT_NE(out.find("tensor t2"), std::string::npos) << env << out;
        EXPECT_EQ(out.find("tensor t0"), std::string::npos) << env << out;
        EXPECT_NE(out.find("__0_0.distcp"), std::string::npos) << env << out;
        EXPECT_FALSE(exists(t + "/x.safetensors")) << env;
        EXPECT_FALSE(exists(t + "/x.safetensors.tmp")) << env;
    }
    ASSERT_EQ(truncate(f.c_str(), (off_t)(bytes.size() / 2)), 0);
    for (const char *env : {"", SMALL_RING}) {
        EXPECT_EQ(run_cmd(std::string(env) + ckpt_bin() + "convert " + t + "/d " + t + "/x.safetensors", &out), 1) << env << out;
        EXPECT_NE(out.find("__0_0.distcp"), std::string::npos) << env << out;
        EXPECT_FALSE(exists(t + "/x.safetensors")) << env;
        EXPECT_FALSE(exists(t + "/x.safetensors.tmp")) << env;
    }
    rm_rf(t);
}

// The rows of one stored record taken out of order (a stack's experts in the output file's order, which sorts
// expert 10 before expert 2): the bytes come out in the order asked for, and the record's CRC is still checked
// once every row of it has been read; a damaged byte fails it.
TEST(ConvertStream, RecordReadOutOfOrderIsStillChecked) {
    std::string t = make_tmpdir("fsdp-cvooo"), out;
    write_big_st(t + "/w.safetensors", 12, 4096); // 12 rows of 16 KiB: one zip record in the DCP
    ASSERT_EQ(run_cmd(ckpt_bin() + "convert " + t + "/w.safetensors " + t + "/d --to dcp", &out), 0) << out;
    const std::vector<int> order = {0, 1, 10, 11, 2, 3, 4, 5, 6, 7, 8, 9};
    std::string src = read_file(t + "/w.safetensors");
    size_t hdr = 8 + (size_t)(unsigned char)src[0] + 256 * (size_t)(unsigned char)src[1];
    for (int damaged = 0; damaged < 2; damaged++) {
        if (damaged) {
            std::string f = t + "/d/__0_0.distcp", bytes = read_file(f);
            size_t at = bytes.find(src.substr(hdr + 11 * 16384, 16384)); // row 11, read third
            ASSERT_NE(at, std::string::npos);
            bytes[at + 100] ^= 0x44;
            write_file(f, bytes);
        }
        ckpt_reader *r = nullptr;
        fsdp_err err{};
        ASSERT_EQ(ckpt_open((t + "/d").c_str(), CKPT_AUTO, &r, &err), 0) << err.msg;
        cks_files fc{};
        cks_src s{}, v{};
        int ok = 0;
        ASSERT_EQ(cks_src_resolve(r, 0, &fc, &s, &ok, &err), 0) << err.msg;
        ASSERT_TRUE(ok);
        ASSERT_TRUE(s.n == 1 && s.seg[0].check) << "one record with a stored CRC";
        for (int q : order) ASSERT_EQ(cks_src_append(&v, &s, q, q + 1, "w"), 0);
        cks_opts o;
        cks_opts_default(&o);
        o.piece = 3 * 16384; // several rows a piece, and several pieces
        std::string dst = t + "/out" + std::to_string(damaged);
        int fd = open(dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ASSERT_GE(fd, 0);
        int rc = cks_copy_rows(&v, 0, v.rows, FSDP_DT_F32, fd, 0, nullptr, &o, dst.c_str(), &err);
        close(fd);
        if (!damaged) {
            ASSERT_EQ(rc, 0) << err.msg;
            std::string want, got = read_file(dst);
            for (int q : order) want += src.substr(hdr + (size_t)q * 16384, 16384);
            EXPECT_TRUE(got == want) << "rows out of the asked order";
        } else {
            EXPECT_NE(rc, 0);
            EXPECT_NE(std::string(err.msg).find("CRC"), std::string::npos) << err.msg;
            EXPECT_NE(std::string(err.msg).find("tensor w"), std::string::npos) << err.msg;
        }
        cks_src_free(&v);
        cks_src_free(&s);
        cks_files_free(&fc);
        ckpt_close(r);
    }
    rm_rf(t);
}

// A tensor of 96 MiB converted both ways in a bounded ring: peak RSS grows well under the tensor
// (the whole-tensor path holds all of it, and more). Measured as the growth over the same converts
// of a 1 MiB tensor.
TEST(ConvertStream, MemoryBoundedByTheRingNotTheTensor) {
    std::string t = make_tmpdir("fsdp-cvmem");
    const long tensor_kib = 96 * 1024;
    std::string env = "FSDP_CONVERT_PIECE=1048576 ";
    struct Peaks {
        long to_dcp, to_st, to_bf16;
    };
    auto converts = [&](const std::string &name) {
        std::string d = t + "/" + name;
        MRun a = run_measured(env + ckpt_bin() + "convert " + d + ".safetensors " + d + "-dcp --to dcp", d + ".o1");
        EXPECT_EQ(a.rc, 0) << a.out;
        MRun b = run_measured(env + ckpt_bin() + "convert " + d + "-dcp " + d + "-back.safetensors", d + ".o2");
        EXPECT_EQ(b.rc, 0) << b.out;
        MRun c = run_measured(env + ckpt_bin() + "convert " + d + "-dcp " + d + "-bf.safetensors --dtype bf16", d + ".o3");
        EXPECT_EQ(c.rc, 0) << c.out;
        return Peaks{a.rss_kib, b.rss_kib, c.rss_kib};
    };
    write_big_st(t + "/small.safetensors", 256, 1024); // 1 MiB
    write_big_st(t + "/big.safetensors", 6144, 4096);  // 96 MiB
    Peaks base = converts("small"), big = converts("big");
    ASSERT_FALSE(HasFailure());
    EXPECT_LT(big.to_dcp - base.to_dcp, tensor_kib / 2) << "safetensors -> DCP";
    EXPECT_LT(big.to_st - base.to_st, tensor_kib / 2) << "DCP -> safetensors";
    EXPECT_LT(big.to_bf16 - base.to_bf16, tensor_kib / 2) << "DCP -> safetensors bf16";
    std::string out;
    EXPECT_EQ(run_cmd(ckpt_bin() + "diff " + t + "/big-back.safetensors " + t + "/big.safetensors", &out), 0) << out;
    // the fallback path holds the whole tensor (what this test would see without the ring)
    MRun w = run_measured(std::string(STREAM_OFF) + ckpt_bin() + "convert " + t + "/big-dcp " + t + "/w.safetensors",
                          t + "/o4");
    ASSERT_EQ(w.rc, 0) << w.out;
    EXPECT_GT(w.rss_kib - base.to_st, tensor_kib * 3 / 4);
    rm_rf(t);
}

// A record whose bytes were damaged in the middle of a tensor: the streamed copy checks the
// record's CRC-32 as it goes and fails naming the file and the tensor; nothing is left at DST.
TEST(ConvertStream, CorruptRecordMidTensorIsNamedAndLeavesNoDst) {
    std::string t = make_tmpdir("fsdp-cvcrc"), out;
    write_big_st(t + "/big.safetensors", 256, 1024); // 1 MiB
    ASSERT_EQ(run_cmd(ckpt_bin() + "convert " + t + "/big.safetensors " + t + "/d --to dcp", &out), 0) << out;
    // flip a byte half-way through the data file (inside tensor w's record)
    std::string f = t + "/d/__0_0.distcp", bytes = read_file(f);
    ASSERT_GT(bytes.size(), (size_t)600000);
    bytes[bytes.size() / 2] ^= 0x5a;
    write_file(f, bytes);
    for (const char *env : {"", SMALL_RING, SMALL_RING_CFR, STREAM_OFF}) {
        EXPECT_EQ(run_cmd(std::string(env) + ckpt_bin() + "convert " + t + "/d " + t + "/x.safetensors", &out), 1) << env << out;
        EXPECT_NE(out.find("CRC"), std::string::npos) << env << out;
        EXPECT_NE(out.find("tensor w"), std::string::npos) << env << out;
        EXPECT_NE(out.find("__0_0.distcp"), std::string::npos) << env << out;
        EXPECT_FALSE(exists(t + "/x.safetensors")) << env;
        EXPECT_FALSE(exists(t + "/x.safetensors.tmp")) << env;
        // into DCP over an existing checkpoint: the old one stays
        ASSERT_EQ(run_cmd(ckpt_bin() + "convert " + t + "/big.safetensors " + t + "/old --to dcp --overwrite", &out), 0);
        std::string before_ls, ls;
        run_cmd("ls -A " + t + "/old", &before_ls);
        std::string data = before_ls.substr(before_ls.find('\n') + 1);
        data.pop_back();
        std::string before = read_file(t + "/old/" + data) + dcp_metadata_blanked(t + "/old");
        EXPECT_EQ(run_cmd(std::string(env) + ckpt_bin() + "convert " + t + "/d " + t + "/old --to dcp --overwrite", &out), 1)
            << env << out;
        EXPECT_NE(out.find("tensor w"), std::string::npos) << env << out;
        run_cmd("ls -A " + t + "/old", &ls);
        EXPECT_EQ(ls, before_ls) << env;
        EXPECT_TRUE(read_file(t + "/old/" + data) + dcp_metadata_blanked(t + "/old") == before) << env;
    }
    rm_rf(t);
}

// A source cut short inside a tensor is refused before anything is written (the tensor named).
TEST(ConvertStream, TruncatedSourceIsNamedAndLeavesNoDst) {
    std::string t = make_tmpdir("fsdp-cvtr"), out;
    write_big_st(t + "/big.safetensors", 256, 1024);
    ASSERT_EQ(run_cmd(ckpt_bin() + "convert " + t + "/big.safetensors " + t + "/d --to dcp", &out), 0) << out;
    ASSERT_EQ(truncate((t + "/d/__0_0.distcp").c_str(), 300000), 0);
    ASSERT_EQ(truncate((t + "/big.safetensors").c_str(), 300000), 0);
    for (const char *env : {"", SMALL_RING}) {
        EXPECT_EQ(run_cmd(std::string(env) + ckpt_bin() + "convert " + t + "/d " + t + "/x.safetensors", &out), 1) << out;
        EXPECT_NE(out.find("__0_0.distcp"), std::string::npos) << out;
        EXPECT_FALSE(exists(t + "/x.safetensors"));
        EXPECT_FALSE(exists(t + "/x.safetensors.tmp"));
        EXPECT_EQ(run_cmd(std::string(env) + ckpt_bin() + "convert " + t + "/big.safetensors " + t + "/y --to dcp", &out), 1)
            << out;
        EXPECT_NE(out.find("big.safetensors"), std::string::npos) << out;
        EXPECT_FALSE(exists(t + "/y/.metadata"));
    }
    rm_rf(t);
}

// A write that fails mid-tensor (the file size limit: EFBIG) fails naming the tensor and the
// output file; no DST is left (and an --overwrite keeps the old checkpoint).
TEST(ConvertStream, FailedWriteIsNamedAndLeavesNoDst) {
    std::string t = make_tmpdir("fsdp-cvwr"), out;
    write_big_st(t + "/big.safetensors", 1024, 1024); // 4 MiB
    ASSERT_EQ(run_cmd(ckpt_bin() + "convert " + t + "/big.safetensors " + t + "/d --to dcp", &out), 0) << out;
    std::string lim = "bash -c 'trap \"\" XFSZ; ulimit -f 2048; exec env ";
    for (const char *env : {"FSDP_CONVERT_STREAM=1 ", SMALL_RING, SMALL_RING_CFR}) {
        EXPECT_EQ(run_cmd(lim + env + ckpt_bin() + "convert " + t + "/d " + t + "/x.safetensors'", &out), 1) << out;
        EXPECT_NE(out.find("tensor w"), std::string::npos) << env << out;
        EXPECT_NE(out.find("x.safetensors"), std::string::npos) << env << out;
        EXPECT_FALSE(exists(t + "/x.safetensors")) << env;
        EXPECT_FALSE(exists(t + "/x.safetensors.tmp")) << env;
        EXPECT_EQ(run_cmd(lim + env + ckpt_bin() + "convert " + t + "/big.safetensors " + t + "/y --to dcp'", &out), 1) << out;
        EXPECT_NE(out.find("tensor w"), std::string::npos) << env << out;
        EXPECT_FALSE(exists(t + "/y/.metadata")) << env;
        std::string ls;
        run_cmd("ls -A " + t + "/y 2>/dev/null", &ls);
        EXPECT_EQ(ls.find("distcp"), std::string::npos) << env << ls;
        // over an existing checkpoint: the old one stays whole
        std::string before = read_file(t + "/d/__0_0.distcp") + dcp_metadata_blanked(t + "/d");
        EXPECT_EQ(run_cmd(lim + env + ckpt_bin() + "convert " + t + "/big.safetensors " + t + "/d --to dcp --overwrite'", &out),
                  1) << out;
        EXPECT_TRUE(read_file(t + "/d/__0_0.distcp") + dcp_metadata_blanked(t + "/d") == before) << env;
        ASSERT_EQ(run_cmd(ckpt_bin() + "inspect --verify " + t + "/d", &out), 0) << out;
    }
    rm_rf(t);
}

namespace {

// A recipe file under dir: the tiny model (synthetic data), then the stages given.
std::string recipe(const std::string &dir, const std::string &name, const std::string &stages) {
    std::string p = dir + "/" + name + ".yaml";
    write_file(p, "model: {preset: tiny}\ndata: {kind: synthetic, batch_size: 6, seq_len: 8}\nstages:\n" + stages);
    return p;
}

}  // namespace

// N -> M with `ckpt convert --world M` (one process) and with the reshard-dcp stage (on M ranks, each
// its own file; and on one rank writing all M): the same bytes as load-ckpt + save-dcp on M ranks
// (data files byte for byte, .metadata up to its uuid and directory), loadable by load-ckpt.
TEST(ConvertStreamReshard, EqualsLoadAndSaveDcpOnMRanks) {
    std::string t = make_tmpdir("fsdp-rsh"), out;
    int rc;
    // a 2-rank checkpoint with optimizer state (step, param groups, dataloader entries per rank)
    std::string mk = recipe(t, "mk", "  - {id: init, uses: init-cpu}\n  - {id: shard, uses: shard}\n"
                                     "  - {id: train, uses: train-steps, with: {steps: 1}}\n"
                                     "  - {id: save, uses: save-dcp, with: {path: " + t + "/s2}}\n");
    out = run_np(2, mk, &rc);
    ASSERT_EQ(rc, 0) << out;
    out = run_np(1, mk + " --set stages.save.with.path=" + t + "/s1", &rc);
    ASSERT_EQ(rc, 0) << out;
    std::string ref = recipe(t, "ref", "  - {id: load, uses: load-ckpt, with: {path: \"${src}\"}}\n"
                                       "  - {id: save, uses: save-dcp, with: {path: \"${dst}\"}}\n");
    std::string stage = recipe(t, "stage", "  - {id: rs, uses: reshard-dcp, with: {src: \"${src}\", dst: \"${dst}\", "
                                           "world: \"${world}\"}}\n");
    std::string load = recipe(t, "load", "  - {id: load, uses: load-ckpt, with: {path: \"${dst}\"}}\n"
                                         "  - {id: check, uses: verify, with: {against: \"${src}\", digest: false}}\n");
    auto vars = [](const std::string &src, const std::string &dst, int world) {
        return " --set vars.src=" + src + " --set vars.dst=" + dst + " --set vars.world=" + std::to_string(world);
    };
    struct Case { int n, m; } cases[] = {{1, 2}, {2, 3}, {3, 2}, {2, 1}};
    for (const Case &c : cases) {
        std::string tag = std::to_string(c.n) + std::to_string(c.m), src = t + "/s" + std::to_string(c.n);
        if (c.n == 3) src = t + "/r23"; // the 2 -> 3 case's reference output
        std::string r = t + "/r" + tag, a = t + "/a" + tag, b = t + "/b" + tag, d = t + "/d" + tag;
        out = run_np(c.m, ref + vars(src, r, c.m), &rc);
        ASSERT_EQ(rc, 0) << tag << ": " << out;
        ASSERT_EQ(run_cmd(ckpt_bin() + "convert " + src + " " + a + " --to dcp --world " + std::to_string(c.m), &out), 0)
            << tag << ": " << out;
        EXPECT_EQ(dcp_diff(r, a), "") << tag << " ckpt convert --world";
        out = run_np(c.m, stage + vars(src, b, 0), &rc); // each rank its own file
        ASSERT_EQ(rc, 0) << tag << ": " << out;
        EXPECT_EQ(dcp_diff(r, b), "") << tag << " reshard-dcp on " << c.m << " ranks";
        out = run_np(1, stage + vars(src, d, c.m), &rc); // one rank writes all
        ASSERT_EQ(rc, 0) << tag << ": " << out;
        EXPECT_EQ(dcp_diff(r, d), "") << tag << " reshard-dcp on 1 rank";
        out = run_np(c.m, load + vars(src, a, 0), &rc);
        EXPECT_EQ(rc, 0) << tag << ": " << out;
        ASSERT_EQ(run_cmd(ckpt_bin() + "inspect --verify " + a, &out), 0) << out;
    }
    // the shipped recipe (reshard-dcp, load-ckpt, verify) on 3 ranks
    out = run_np(3, "recipes/reshard.yaml --set model.preset=tiny --set vars.src=" + t + "/s2 --set vars.dst=" + t +
                        "/q23", &rc);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_EQ(dcp_diff(t + "/r23", t + "/q23"), "") << "recipes/reshard.yaml";
    rm_rf(t);
}

// validate rejects bad reshard-dcp keys before anything runs, naming the key.
TEST(ConvertStreamReshard, ValidateRejectsBadStageKeys) {
    std::string t = make_tmpdir("fsdp-rshv"), out;
    struct Bad { const char *with, *want; } bad[] = {
        {"{src: a, dst: b, world: -1}", "world is -1"},
        {"{src: a, dst: a}", "dst is src"},
        {"{src: a}", "dst"},
        {"{dst: b}", "src"},
        {"{src: a, dst: b, dtype: f64}", "dtype"},
        {"{src: a, dst: b, worlds: 2}", "worlds"},
        {"{src: a, dst: b, overwrite: maybe}", "overwrite"},
    };
    for (const Bad &b : bad) {
        std::string p = recipe(t, "v", std::string("  - {id: rs, uses: reshard-dcp, with: ") + b.with + "}\n");
        EXPECT_EQ(run_cmd(fsdp_run_bin() + " validate " + p, &out), 2) << b.with << ": " << out;
        EXPECT_NE(out.find(b.want), std::string::npos) << b.with << ": " << out;
        EXPECT_NE(out.find("v.yaml"), std::string::npos) << b.with << ": " << out;
    }
    std::string ok = recipe(t, "ok", "  - {id: rs, uses: reshard-dcp, with: {src: a, dst: b, world: 4, dtype: bf16}}\n");
    EXPECT_EQ(run_cmd(fsdp_run_bin() + " validate " + ok, &out), 0) << out;
    // and the CLI's --world
    EXPECT_EQ(run_cmd(ckpt_bin() + "convert a b.safetensors --world 2", &out), 2) << out;
    EXPECT_NE(out.find("--world writes a DCP checkpoint"), std::string::npos) << out;
    EXPECT_EQ(run_cmd(ckpt_bin() + "convert a b --world 0", &out), 2) << out;
    EXPECT_NE(out.find("--world 0"), std::string::npos) << out;
    rm_rf(t);
}

// reshard-dcp over an existing checkpoint from a source that fails (a data file cut short, a record
// damaged mid-tensor: rank 0 of a one-rank run reads every record whole and checks its CRC): the
// error names the file, no rank leaves a data file, and the old checkpoint stays whole.
TEST(ConvertStreamReshard, FailedSourceLeavesTheOldCheckpoint) {
    std::string t = make_tmpdir("fsdp-rshf"), out;
    int rc;
    std::string mk = recipe(t, "mk", "  - {id: init, uses: init-cpu}\n  - {id: shard, uses: shard}\n"
                                     "  - {id: save, uses: save-dcp, with: {path: \"${ck}\"}}\n");
    out = run_np(2, mk + " --set vars.ck=" + t + "/s2", &rc);
    ASSERT_EQ(rc, 0) << out;
    std::string stage = recipe(t, "stage", "  - {id: rs, uses: reshard-dcp, with: {src: \"${src}\", dst: \"${dst}\", "
                                           "world: 3, overwrite: true}}\n");
    out = run_np(2, stage + " --set vars.src=" + t + "/s2 --set vars.dst=" + t + "/old", &rc);
    ASSERT_EQ(rc, 0) << out;
    std::string before_ls;
    run_cmd("ls -A " + t + "/old", &before_ls);
    std::string before = dcp_metadata_blanked(t + "/old") + read_file(t + "/old/__1_0.distcp");
    ASSERT_EQ(system(("cp -r " + t + "/s2 " + t + "/bad && cp -r " + t + "/s2 " + t + "/flip").c_str()), 0);
    std::string f = t + "/bad/__1_0.distcp";
    ASSERT_EQ(truncate(f.c_str(), (off_t)(read_file(f).size() / 2)), 0);
    // the middle of the largest payload: the longest run between two zip signatures ("PK")
    std::string g = t + "/flip/__0_0.distcp", z = read_file(g);
    size_t prev = 0, best = 0, best_len = 0;
    for (size_t p = z.find("PK"); p != std::string::npos; p = z.find("PK", p + 2)) {
        if (p - prev > best_len) best = prev, best_len = p - prev;
        prev = p;
    }
    ASSERT_GT(best_len, (size_t)4096);
    z[best + best_len / 2] ^= 0x41;
    write_file(g, z);
    struct Case { int np; std::string src, want; } cases[] = {
        {2, t + "/bad", "__1_0.distcp"}, {1, t + "/bad", "__1_0.distcp"}, {1, t + "/flip", "CRC-32 mismatch"}};
    for (const Case &c : cases) {
        out = run_np(c.np, stage + " --set vars.src=" + c.src + " --set vars.dst=" + t + "/old", &rc);
        EXPECT_NE(rc, 0) << out;
        EXPECT_NE(out.find(c.want), std::string::npos) << out;
        EXPECT_NE(out.find("reshard-dcp"), std::string::npos) << out;
        std::string ls;
        run_cmd("ls -A " + t + "/old", &ls);
        EXPECT_EQ(ls, before_ls) << c.src << " on " << c.np;
        EXPECT_TRUE(dcp_metadata_blanked(t + "/old") + read_file(t + "/old/__1_0.distcp") == before) << c.src;
    }
    ASSERT_EQ(run_cmd(ckpt_bin() + "inspect --verify " + t + "/old", &out), 0) << out;
    rm_rf(t);
}
