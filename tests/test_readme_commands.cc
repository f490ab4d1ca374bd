// The README's commands as a newcomer types them (issue 42): every shell command of README.md that runs
// fsdp-run (`fsdp-run ...`, `mpirun ... fsdp-run ...`) and the setup lines of its blocks (`mkdir`,
// `python3`), in the order written, from a fresh temporary directory (so a fresh `runs/`) with the build
// on PATH, as "Where commands run" says; each must exit 0, or the code its trailing comment states
// ("exit 2"). Commands that need what a clone lacks are left out by what they contain: the synopsis
// lines' symbolic arguments (`...`, `PATH`, `SRC`, `RECIPE`, `[--`), external checkpoints (`/ckpt/`), a GPU
// or Slurm. And every
// YAML block that starts `# recipes/NAME.yaml` is that file, byte for byte.
#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <unistd.h>
#include <vector>

#include "test_util.h"

using namespace fsdp_test;

namespace {

struct Cmd {
    std::string text;
    int line = 0;
    int expect = 0;
};

bool starts(const std::string &s, const char *p) { return s.rfind(p, 0) == 0; }

// s in single quotes for bash -c.
std::string shell_quote(const std::string &s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

std::string trim(const std::string &s) {
    size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

bool runs_fsdp(const std::string &c) {
    return starts(c, "fsdp-run ") || (starts(c, "mpirun ") && c.find(" fsdp-run ") != std::string::npos);
}

bool setup_line(const std::string &c) { return starts(c, "mkdir ") || starts(c, "python3 "); }

bool needs_more_than_a_clone(const std::string &line) {
    std::string c = line.substr(0, line.find(" # ")); /* the command, not its comment */
    for (const char *w : {"...", " PATH", "SRC", "RECIPE", "[--", "/ckpt/", "METRICS.jsonl", "OUT.", "LIB.so", "srun ",
                          "sbatch", "device=cuda", " A B", "--help |"})
        if (c.find(w) != std::string::npos) return true;
    return false;
}

// The README's shell lines: indented code (4 spaces) outside fences and ```sh fences; a line continued
// by `\` or inside an open double quote is joined with the next.
std::vector<Cmd> readme_commands(const std::string &readme) {
    std::vector<Cmd> out;
    std::vector<std::string> lines;
    size_t p = 0;
    while (p <= readme.size()) {
        size_t e = readme.find('\n', p);
        lines.push_back(readme.substr(p, e == std::string::npos ? std::string::npos : e - p));
        if (e == std::string::npos) break;
        p = e + 1;
    }
    std::string fence;  // "" outside a fence, else its language
    for (size_t i = 0; i < lines.size(); i++) {
        const std::string &l = lines[i];
        if (starts(trim(l), "```")) {
            fence = fence.empty() ? (trim(l).size() > 3 ? trim(l).substr(3) : "plain") : "";
            continue;
        }
        bool shell = fence == "sh" || (fence.empty() && starts(l, "    "));
        if (!shell) continue;
        std::string c = trim(l);
        int first = (int)i + 1;
        auto quotes = [](const std::string &s) {
            size_t n = 0;
            for (char ch : s) n += ch == '"';
            return n;
        };
        while (i + 1 < lines.size() && (c.back() == '\\' || quotes(c) % 2)) {
            if (c.back() == '\\') c.pop_back();
            c += (quotes(c) % 2 ? "\n" : " ") + (quotes(c) % 2 ? lines[++i].substr(4) : trim(lines[++i]));
        }
        if (!runs_fsdp(c) && !setup_line(c)) continue;
        Cmd cmd;
        cmd.text = c;
        cmd.line = first;
        size_t x = c.rfind("exit ");
        size_t hash = c.rfind(" # ");
        if (x != std::string::npos && hash != std::string::npos && x > hash) cmd.expect = atoi(c.c_str() + x + 5);
        out.push_back(cmd);
    }
    return out;
}

}  // namespace

TEST(ReadmeCommands, EveryCommandRunsFromAFreshDirectory) {
    std::string readme = read_file("README.md");
    ASSERT_FALSE(readme.empty());
    std::vector<Cmd> all = readme_commands(readme);
    char cwd[PATH_MAX];
    ASSERT_TRUE(getcwd(cwd, sizeof cwd));
    std::string bin = fsdp_run_bin(), dir = bin.substr(0, bin.rfind('/'));
    if (dir[0] != '/') dir = std::string(cwd) + "/" + dir;
    std::string tmp = make_tmpdir("fsdp-readme");
    std::string env = "cd '" + tmp + "' && export PATH='" + dir + "':\"$PATH\" OMPI_MCA_rmaps_base_oversubscribe=1 "
                      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 && ";
    size_t ran = 0, fsdp = 0;
    for (const Cmd &c : all) {
        if (runs_fsdp(c.text) && needs_more_than_a_clone(c.text)) continue;
        std::string out;
        int rc = run_cmd("timeout -k 10 600 bash -c " + shell_quote(env + c.text), &out);
        EXPECT_EQ(rc, c.expect) << "README.md:" << c.line << ": " << c.text << "\n" << out;
        ran++;
        fsdp += runs_fsdp(c.text);
    }
    EXPECT_GE(fsdp, 15u) << "the README's runnable fsdp-run commands";
    printf("[ readme   ] %zu commands run (%zu of fsdp-run) of %zu found\n", ran, fsdp, all.size());
    rm_rf(tmp);
}

TEST(ReadmeCommands, RecipeBlocksAreTheRecipesFiles) {
    std::string readme = read_file("README.md");
    size_t n = 0;
    for (size_t p = readme.find("```yaml\n# recipes/"); p != std::string::npos; p = readme.find("```yaml\n# recipes/", p + 1)) {
        size_t a = p + 10, e = readme.find('\n', a);
        std::string file = readme.substr(a, e - a);
        size_t b = readme.find("```", e);
        ASSERT_NE(b, std::string::npos);
        EXPECT_EQ(readme.substr(e + 1, b - e - 1), read_file(file)) << file << " differs from its README block";
        n++;
    }
    EXPECT_GE(n, 4u);
}
