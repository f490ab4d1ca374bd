// Shared helpers for the GoogleTest suite. Tests run from the project root.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace fsdp_test {

// ../shared/fixtures relative to the project root (FSDP_FIXTURES overrides).
inline std::string fixtures_dir() {
    const char *e = getenv("FSDP_FIXTURES");
    return e && *e ? std::string(e) : std::string("../shared/fixtures");
}
inline std::string tiny(const std::string &name) {
    return fixtures_dir() + "/torch-2.11/tiny/" + name;
}
inline bool exists(const std::string &p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0;
}
// A fresh, empty temporary directory (removed by the caller with rm_rf when wanted).
inline std::string make_tmpdir(const char *tag = "fsdp") {
    const char *base = getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + tag + "-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) return "";
    return std::string(buf.data());
}
// The same under dir (another file system, e.g. /dev/shm); "" when dir is not there or not writable.
inline std::string make_tmpdir_in(const std::string &dir, const char *tag) {
    std::string tmpl = dir + "/" + tag + "-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) return "";
    return std::string(buf.data());
}
inline void rm_rf(const std::string &p) {
    if (p.empty() || p == "/") return;
    std::string cmd = "rm -rf '" + p + "'";
    if (system(cmd.c_str()) != 0) perror("rm -rf");
}
inline std::string read_file(const std::string &p) {
    std::string out;
    FILE *f = fopen(p.c_str(), "rb");
    if (!f) return out;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    fclose(f);
    return out;
}
inline void write_file(const std::string &p, const std::string &data) {
    FILE *f = fopen(p.c_str(), "wb");
    if (!f) return;
    fwrite(data.data(), 1, data.size(), f);
    fclose(f);
}
// Runs a shell command, captures stdout+stderr, returns the exit status (or -1).
inline int run_cmd(const std::string &cmd, std::string *output) {
    std::string full = cmd + " 2>&1";
    FILE *p = popen(full.c_str(), "r");
    if (!p) return -1;
    char buf[4096];
    size_t n;
    if (output) output->clear();
    while ((n = fread(buf, 1, sizeof buf, p)) > 0)
        if (output) output->append(buf, n);
    int st = pclose(p);
    if (st == -1) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
// Path of the fsdp-run binary under test (make test sets FSDP_RUN_BIN).
inline std::string fsdp_run_bin() {
    const char *e = getenv("FSDP_RUN_BIN");
    return e && *e ? std::string(e) : std::string(FSDP_BUILD_DIR "/fsdp-run");
}
inline std::string plugin_dir() {
    const char *e = getenv("FSDP_PLUGIN_DIR");
    return e && *e ? std::string(e) : std::string(FSDP_BUILD_DIR "/plugins");
}

// "mpirun ... -np N" for the tests (root needs --allow-run-as-root). Open MPI keeps
// allocations until exit in components it unloads, which LeakSanitizer cannot attribute;
// leak checks of the same code run in the single-process tests. Every test runs it under
// `timeout -k 10 N`: Debian 12's Open MPI 4.1 mpirun was seen to deadlock after an MPI_Abort (every
// rank already exited, "ORTE_ERROR_LOG: Out of resource in file orte/util/show_help.c", its threads
// waiting on each other) and then to ignore timeout's SIGTERM, which hung the whole suite; the KILL
// 10 s later makes that a failed test instead.
inline std::string mpirun_prefix(int np) {
    std::string p = "mpirun --oversubscribe -np " + std::to_string(np) + " -x ASAN_OPTIONS=detect_leaks=0";
    if (geteuid() == 0) p += " --allow-run-as-root";
    return p;
}

// Runs `fsdp-run -q ARGS` on np ranks (mpirun when np > 1) under a 300 s timeout; the output and *rc.
inline std::string run_np(int np, const std::string &args, int *rc) {
    std::string out;
    std::string cmd = "timeout -k 10 300 " + (np > 1 ? mpirun_prefix(np) + " " : std::string()) + fsdp_run_bin() + " -q " + args;
    *rc = run_cmd(cmd, &out);
    return out;
}

// A Hugging Face fixture directory of ../shared/fixtures/hf-5.24 (or a file in it).
inline std::string hf_fixture(const std::string &model, const std::string &file = "") {
    return fixtures_dir() + "/hf-5.24/" + model + (file.empty() ? "" : "/" + file);
}

// n pseudo-random bytes (a linear congruential sequence from seed * 2654435761 + salt): test data
// that every run writes the same.
inline std::string lcg_bytes(size_t n, uint32_t seed, uint32_t salt) {
    std::string s(n, '\0');
    uint32_t x = seed * 2654435761u + salt;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        s[i] = (char)(x >> 24);
    }
    return s;
}

// A uuid (8-4-4-4-12 lower-case hex digits) starting at m[p].
inline bool is_uuid_at(const std::string &m, size_t p) {
    if (p + 36 > m.size()) return false;
    for (size_t i = 0; i < 36; i++) {
        char c = m[p + i];
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
        if (dash ? c != '-' : !hex) return false;
    }
    return true;
}

// 32 lower-case hex digits starting at m[p] (a save identity, ckpt/dcp_gen.h).
inline bool is_save_id_at(const std::string &m, size_t p) {
    if (p + 32 > m.size()) return false;
    for (size_t i = 0; i < 32; i++) {
        char c = m[p + i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return true;
}

// A DCP directory's .metadata with what differs between two saves of one state blanked: the save's
// random uuid or fsdp-run save identity, and the directory itself (the checkpoint_id). Compare
// directories whose names have one length.
inline std::string dcp_metadata_blanked(const std::string &dir) {
    std::string m = read_file(dir + "/.metadata");
    for (size_t p; (p = m.find(dir)) != std::string::npos;) m.replace(p, dir.size(), std::string(dir.size(), '#'));
    for (size_t p = 0; p < m.size(); p++)
        if (is_uuid_at(m, p)) m.replace(p, 36, std::string(36, 'U'));
    const std::string tag = "fsdp-run:";
    for (size_t p = 0; (p = m.find(tag, p)) != std::string::npos; p += tag.size())
        if (is_save_id_at(m, p + tag.size())) m.replace(p + tag.size(), 32, std::string(32, 'I'));
    return m;
}

// A DCP data file's bytes with its trailer's save identity blanked (ckpt/dcp_gen.h: the last 64
// bytes "fsdp-run save id<32 hex> rank NNNNNNNNN\n"): equal for two saves of one state.
inline std::string dcp_data_blanked(const std::string &path) {
    std::string d = read_file(path);
    const std::string magic = "fsdp-run save id";
    if (d.size() >= 64 && d.compare(d.size() - 64, magic.size(), magic) == 0 && is_save_id_at(d, d.size() - 48))
        d.replace(d.size() - 48, 32, std::string(32, 'I'));
    return d;
}

}  // namespace fsdp_test
