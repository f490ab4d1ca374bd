// tools/bundle.sh (make bundle): the bundled binary carries rpath $ORIGIN/lib, finds its libraries
// in the bundle without LD_LIBRARY_PATH, and a bundled Open MPI finds its components through the
// relocation variables of env.sh.
#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <sstream>
#include <string>

#include "test_util.h"

namespace {

bool have(const char *tool) {
    std::string out;
    return fsdp_test::run_cmd(std::string("command -v ") + tool, &out) == 0;
}

std::string dynamic_section(const std::string &file) {
    std::string out;
    EXPECT_EQ(fsdp_test::run_cmd("readelf -d '" + file + "'", &out), 0) << out;
    return out;
}

// Every library ldd resolves outside dir, other than the C runtime and the GPU driver.
std::string libs_outside(const std::string &file, const std::string &dir) {
    std::string out, bad;
    EXPECT_EQ(fsdp_test::run_cmd("env -u LD_LIBRARY_PATH ldd '" + file + "'", &out), 0) << out;
    std::istringstream in(out);
    std::string line;
    const char *system[] = {"linux-vdso", "ld-linux", "libc.so", "libm.so", "libdl.so", "libpthread.so", "librt.so",
                            "libstdc++.so", "libgcc_s.so", "libcuda.so", "libutil.so", "libresolv.so",
                            // the CUDA toolkit's libraries come from the GPU machine (see tools/bundle.sh)
                            "libcudart.so", "libcublas.so", "libcublasLt.so", "libnccl.so", "libcudnn"};
    while (std::getline(in, line)) {
        bool sys = false;
        for (const char *s : system) sys = sys || line.find(s) != std::string::npos;
        if (sys) continue;
        // inside the bundle's lib/ (possibly reached as SUBDIR/../lib/)
        size_t at = line.find(dir + "/");
        if (at == std::string::npos || line.find("lib/", at + dir.size()) == std::string::npos) bad += line + "\n";
    }
    return bad;
}

TEST(CudaBundle, BadUsageIsAnError) {
    std::string out;
    EXPECT_EQ(fsdp_test::run_cmd("sh tools/bundle.sh", &out), 2);
    EXPECT_NE(out.find("usage"), std::string::npos) << out;
    std::string tmp = fsdp_test::make_tmpdir("fsdp-bundle");
    EXPECT_EQ(fsdp_test::run_cmd("sh tools/bundle.sh /nonexistent/prog '" + tmp + "/b'", &out), 1);
    EXPECT_NE(out.find("/nonexistent/prog is not an executable file"), std::string::npos) << out;
    EXPECT_EQ(fsdp_test::run_cmd("FSDP_BUNDLE_PATCHELF= FSDP_BUNDLE_LINK= sh tools/bundle.sh /bin/true '" + tmp + "/b'",
                                 &out),
              1);
    EXPECT_NE(out.find("patchelf is not installed"), std::string::npos) << out;
    fsdp_test::rm_rf(tmp);
}

// The script itself, on an executable that links Open MPI (ompi_info, from openmpi-bin).
TEST(CudaBundle, BundlesAnOpenMpiProgramThatRunsFromTheBundle) {
    // both come with `make setup` (patchelf, openmpi-bin): missing them is a broken setup
    ASSERT_TRUE(have("patchelf")) << "patchelf is not installed (run make setup)";
    std::string info;
    ASSERT_EQ(fsdp_test::run_cmd("command -v ompi_info", &info), 0) << "ompi_info is not installed (run make setup)";
    info.erase(info.find_last_not_of("\n") + 1);
    std::string tmp = fsdp_test::make_tmpdir("fsdp-bundle");
    ASSERT_FALSE(tmp.empty());
    const std::string b = tmp + "/b";
    std::string out;
    ASSERT_EQ(fsdp_test::run_cmd("sh tools/bundle.sh '" + info + "' '" + b + "'", &out), 0) << out;
    std::string dyn = dynamic_section(b + "/ompi_info");
    EXPECT_NE(dyn.find("$ORIGIN/lib"), std::string::npos) << dyn;
    EXPECT_NE(dyn.find("(RPATH)"), std::string::npos) << dyn; // DT_RPATH also covers indirect dependencies
    EXPECT_TRUE(fsdp_test::exists(b + "/lib/libmpi.so.40")) << "no libmpi in the bundle";
    EXPECT_FALSE(fsdp_test::exists(b + "/lib/libc.so.6"));
    std::string mca;
    EXPECT_EQ(fsdp_test::run_cmd("ls '" + b + "/lib/openmpi' | grep -c '^mca_.*\\.so$'", &mca), 0);
    EXPECT_GT(atoi(mca.c_str()), 10) << mca;
    EXPECT_TRUE(fsdp_test::exists(b + "/env.sh"));
    EXPECT_TRUE(fsdp_test::exists(b + "/README"));
    EXPECT_TRUE(fsdp_test::exists(b + "/bin/orted"));
    EXPECT_EQ(libs_outside(b + "/ompi_info", b), "");
    EXPECT_EQ(libs_outside(b + "/lib/openmpi/mca_btl_self.so", b), "");
    // Open MPI looks for its components in the bundle, not where it was installed
    ASSERT_EQ(fsdp_test::run_cmd("cd / && env -u LD_LIBRARY_PATH '" + b + "/ompi_info.sh' --path pkglibdir --parsable",
                                 &out),
              0)
        << out;
    EXPECT_NE(out.find("path:pkglibdir:" + b + "/lib/openmpi"), std::string::npos) << out;
    ASSERT_EQ(fsdp_test::run_cmd("env -u LD_LIBRARY_PATH '" + b + "/ompi_info.sh' --parsable", &out), 0) << out;
    EXPECT_NE(out.find("mca:btl:self"), std::string::npos) << out.substr(0, 2000);
    fsdp_test::rm_rf(tmp);
}

// What `make bundle` does (tools/bundle.sh on the fsdp-run binary under test), into a
// temporary directory: the bundled binary runs without LD_LIBRARY_PATH.
TEST(CudaBundle, MakeBundleRunsWithoutLdLibraryPath) {
    std::string tmp = fsdp_test::make_tmpdir("fsdp-bundle");
    ASSERT_FALSE(tmp.empty());
    char *abs = realpath(tmp.c_str(), nullptr); // ldd prints the libraries' absolute paths
    ASSERT_NE(abs, nullptr);
    const std::string b = std::string(abs) + "/bundle";
    free(abs);
    std::string built;
    ASSERT_EQ(fsdp_test::run_cmd("sh tools/bundle.sh '" + fsdp_test::fsdp_run_bin() + "' '" + b + "'", &built), 0)
        << built;
    std::string dyn = dynamic_section(b + "/fsdp-run");
    EXPECT_NE(dyn.find("$ORIGIN/lib"), std::string::npos) << dyn;
    std::string out;
    ASSERT_EQ(fsdp_test::run_cmd("env -u LD_LIBRARY_PATH '" + b + "/fsdp-run' --version", &out), 0) << out;
    EXPECT_EQ(out.rfind("fsdp-run ", 0), 0u) << out;
    EXPECT_EQ(libs_outside(b + "/fsdp-run", b), "");
    ASSERT_EQ(fsdp_test::run_cmd("env -u LD_LIBRARY_PATH '" + b + "/fsdp-run.sh' --version", &out), 0) << out;
    // the CUDA toolkit stays out of the bundle (every GPU machine has its own; 800 MB otherwise)
    std::string ls;
    fsdp_test::run_cmd("ls '" + b + "/lib'", &ls);
    EXPECT_EQ(ls.find("libcublas"), std::string::npos) << ls;
    EXPECT_EQ(ls.find("libnccl"), std::string::npos) << ls;
    std::string env = fsdp_test::read_file(b + "/env.sh");
    EXPECT_NE(env.find("/usr/local/cuda/lib64"), std::string::npos) << env;
    EXPECT_NE(env.find("nvidia.__path__"), std::string::npos) << env;
    fsdp_test::rm_rf(tmp);
}

// Extra executables (tests, benchmarks) and plugins in subdirectories find the bundle's lib/.
TEST(CudaBundle, ExtraFilesGetAnRpathToTheBundleLibraries) {
    ASSERT_TRUE(have("patchelf")) << "patchelf is not installed (run make setup)";
    std::string tmp = fsdp_test::make_tmpdir("fsdp-bundle");
    char *abs = realpath(tmp.c_str(), nullptr);
    ASSERT_NE(abs, nullptr);
    const std::string b = std::string(abs) + "/bundle";
    free(abs);
    std::string plugin = fsdp_test::plugin_dir() + "/libecho_stage.so";
    std::string mpi = std::string(FSDP_BUILD_DIR) + "/tests/mpi/comm_check";
    std::string out;
    ASSERT_EQ(fsdp_test::run_cmd("FSDP_BUNDLE_STRIP=1 FSDP_BUNDLE_EXTRA='" + mpi + "=tests/mpi " + plugin +
                                     "=plugins' sh tools/bundle.sh '" + fsdp_test::fsdp_run_bin() + "' '" + b + "'",
                                 &out),
              0)
        << out;
    std::string dyn = dynamic_section(b + "/tests/mpi/comm_check");
    EXPECT_NE(dyn.find("$ORIGIN/../../lib"), std::string::npos) << dyn;
    EXPECT_EQ(libs_outside(b + "/tests/mpi/comm_check", b), "");
    dyn = dynamic_section(b + "/plugins/libecho_stage.so");
    EXPECT_NE(dyn.find("$ORIGIN/../lib"), std::string::npos) << dyn;
    // the bundled helper program runs from the bundle (world of 1, no launcher)
    ASSERT_EQ(fsdp_test::run_cmd("cd / && env -u LD_LIBRARY_PATH '" + b + "/tests/mpi/comm_check'", &out), 0) << out;
    EXPECT_NE(out.find("comm_check ok (single, world 1)"), std::string::npos) << out;
    EXPECT_NE(fsdp_test::run_cmd("FSDP_BUNDLE_EXTRA='/no/such/file=x' sh tools/bundle.sh '" +
                                     fsdp_test::fsdp_run_bin() + "' '" + b + "'",
                                 &out),
              0);
    EXPECT_NE(out.find("extra file /no/such/file does not exist"), std::string::npos) << out;
    fsdp_test::rm_rf(tmp);
}

// FSDP_BUNDLE_CUDA=1 bundles the CUDA libraries the program loads itself (NCCL, cuBLAS, cuBLASLt: dlopened,
// so ldd does not list them), found where the program's RUNPATH points; one missing is an error naming it.
// Checked on a small program whose RUNPATH holds small stand-ins of the three.
TEST(CudaBundle, BundleCudaCopiesTheDlopenedLibraries) {
    ASSERT_TRUE(have("patchelf")) << "patchelf is not installed (run make setup)";
    std::string tmp = fsdp_test::make_tmpdir("fsdp-bundle");
    char *abs = realpath(tmp.c_str(), nullptr);
    ASSERT_NE(abs, nullptr);
    const std::string t = abs;
    free(abs);
    std::string out;
    ASSERT_EQ(fsdp_test::run_cmd("mkdir -p '" + t + "/cuda' && echo 'int fake_cuda_lib;' > '" + t + "/l.c' && " +
                                     "for l in libnccl.so.2 libcublas.so.13 libcublasLt.so.13; do "
                                     "cc -shared -fPIC -o '" + t + "/cuda/'$l '" + t + "/l.c' || exit 1; done && " +
                                     "echo 'int main(void) { return 0; }' > '" + t + "/p.c' && cc -o '" + t +
                                     "/prog' '" + t + "/p.c' -Wl,-rpath," + t + "/cuda",
                                 &out),
              0)
        << out;
    const std::string b = t + "/bundle";
    ASSERT_EQ(fsdp_test::run_cmd("FSDP_BUNDLE_CUDA=1 sh tools/bundle.sh '" + t + "/prog' '" + b + "'", &out), 0)
        << out;
    for (const char *l : {"libnccl.so.2", "libcublas.so.13", "libcublasLt.so.13"})
        EXPECT_TRUE(fsdp_test::exists(b + "/lib/" + l)) << l << " is not in the bundle\n" << out;
    // without FSDP_BUNDLE_CUDA none of them
    ASSERT_EQ(fsdp_test::run_cmd("sh tools/bundle.sh '" + t + "/prog' '" + b + "'", &out), 0) << out;
    EXPECT_FALSE(fsdp_test::exists(b + "/lib/libnccl.so.2"));
    ASSERT_EQ(fsdp_test::run_cmd("rm '" + t + "/cuda/libcublasLt.so.13'", &out), 0);
    EXPECT_EQ(fsdp_test::run_cmd("FSDP_BUNDLE_CUDA=1 sh tools/bundle.sh '" + t + "/prog' '" + b + "'", &out), 1);
    EXPECT_NE(out.find("no libcublasLt.so.[0-9]* is in the binary's library path (" + t + "/cuda)"),
              std::string::npos)
        << out;
    fsdp_test::rm_rf(tmp);
}

} // namespace
