// The rooms of the source tree and the order they stand in (README "Layout"): a file includes
// only files of its own room or of rooms below it, and no files of different rooms include each
// other in a circle. Read from the sources themselves, so the layering stays true as code is added.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// Top to bottom. Rooms of one rank stand beside each other and may not include each other.
const std::vector<std::vector<std::string>> kRooms = {
    {"cli"},              // main, argument parsing and the launcher, `fsdp-run ckpt`, `fsdp-run plot`
    {"run"},              // running and validating a recipe: checks, sizes, the DAG run, the report
    {"stages"},           // the built-in stages
    {"api"},              // the plugin API (include/fsdp/params.h ...) over the state, collectives, callbacks
    {"train"},            // the sharded training step: flat groups, collectives, optimizer, schedule
    {"decoder"},          // the trainable decoder family (Llama 3.x, Qwen2, Qwen3 as rows of a table)
    {"model"},            // any model: the table of named tensors, init rules, the sharded state
    {"pipeline"},         // the recipe language: YAML, values, variables, the DAG, the registry
    {"layouts"},          // trainers' checkpoint layouts as data, and views of a checkpoint in another
    {"ckpt", "tokenizer", "kernels"},  // checkpoint formats and I/O; tokenizer.json; CPU and GPU kernels
    {"runtime"},          // errors, files, communicators, devices, RNG, logging
    {"include"},          // the public headers of the stage ABI
};

int rank_of(const std::string &room) {
    for (size_t i = 0; i < kRooms.size(); i++)
        for (const auto &r : kRooms[i])
            if (r == room) return (int)(kRooms.size() - i);
    return -1;
}

std::string room_of(const std::string &path) { return path.substr(0, path.find('/')); }

bool is_source(const fs::path &p) {
    static const std::set<std::string> ext = {".c", ".h", ".cu", ".cuh"};
    return ext.count(p.extension().string()) > 0;
}

// The file of `#include "FILE"` on this line (spaces allowed around '#'); false for any other line.
// (No std::regex: GCC 12's <regex> trips -Werror=maybe-uninitialized in the sanitizer build.)
bool quoted_include(const std::string &line, std::string *to) {
    size_t i = line.find_first_not_of(" \t");
    if (i == std::string::npos || line[i] != '#') return false;
    i = line.find_first_not_of(" \t", i + 1);
    if (i == std::string::npos || line.compare(i, 7, "include") != 0) return false;
    i = line.find_first_not_of(" \t", i + 7);
    if (i == std::string::npos || line[i] != '"') return false;
    size_t end = line.find('"', i + 1);
    if (end == std::string::npos) return false;
    *to = line.substr(i + 1, end - i - 1);
    return true;
}

// Every source file of every room, relative to the project root, with the project files it includes.
std::map<std::string, std::vector<std::string>> read_includes() {
    std::map<std::string, std::vector<std::string>> g;

    for (const auto &rooms : kRooms)
        for (const auto &room : rooms) {
            if (!fs::exists(room)) continue;
            for (const auto &e : fs::recursive_directory_iterator(room)) {
                if (!e.is_regular_file() || !is_source(e.path())) continue;
                std::string file = e.path().generic_string();
                std::ifstream in(file);
                std::string line;
                auto &v = g[file];
                while (std::getline(in, line)) {
                    std::string to;
                    if (!quoted_include(line, &to)) continue;
                    // "fsdp/x.h" is include/fsdp/x.h; "x.h" is a file of the same folder
                    if (to.rfind("fsdp/", 0) == 0) to = "include/" + to;
                    else if (to.find('/') == std::string::npos) to = e.path().parent_path().generic_string() + "/" + to;
                    if (rank_of(room_of(to)) >= 0) v.push_back(to);
                }
            }
        }
    return g;
}

TEST(Layers, EveryRoomExistsAndHoldsSources) {
    auto g = read_includes();
    for (const auto &rooms : kRooms)
        for (const auto &room : rooms) {
            size_t n = std::count_if(g.begin(), g.end(), [&](const auto &kv) { return room_of(kv.first) == room; });
            EXPECT_GT(n, 0u) << "room " << room << "/ holds no source file (run the tests from the project root)";
        }
}

TEST(Layers, NoRoomIncludesARoomAboveIt) {
    auto g = read_includes();
    std::string bad;
    for (const auto &kv : g) {
        const std::string room = room_of(kv.first);
        for (const auto &to : kv.second) {
            const std::string r2 = room_of(to);
            if (r2 == room) continue;
            if (rank_of(r2) >= rank_of(room))
                bad += kv.first + " includes " + to + " (" + r2 + "/ is " +
                       (rank_of(r2) == rank_of(room) ? "beside " : "above ") + room + "/)\n";
        }
    }
    EXPECT_EQ(bad, "");
}

// A module is a file without its extension (decoder_config.c and decoder_config.h are one), with its
// private header (X_internal.h, X_impl.h) and its variants (X_avx2.c, X_files.c: X_<anything> beside an X)
// counted as part of it. A circle is a set of modules each reaching the next through includes.
TEST(Layers, NoIncludeCircleBetweenModules) {
    auto g = read_includes();
    auto module = [](std::string f) {
        f = f.substr(0, f.rfind('.'));
        const std::string suf = "_internal";
        if (f.size() > suf.size() && f.compare(f.size() - suf.size(), suf.size(), suf) == 0)
            f.resize(f.size() - suf.size());
        return f;
    };
    std::set<std::string> stems;
    for (const auto &kv : g) stems.insert(kv.first.substr(0, kv.first.rfind('.')));
    auto owner = [&](const std::string &f) {
        std::string m = module(f); // the shortest X of m = X_... that is a file of the folder
        for (size_t at = m.find('_', m.rfind('/') + 1); at != std::string::npos; at = m.find('_', at + 1))
            if (stems.count(m.substr(0, at))) return m.substr(0, at);
        return m;
    };
    std::map<std::string, std::set<std::string>> edges;
    for (const auto &kv : g)
        for (const auto &to : kv.second)
            if (owner(to) != owner(kv.first)) edges[owner(kv.first)].insert(owner(to));
    // Tarjan's strongly connected components
    std::map<std::string, int> index, low;
    std::map<std::string, bool> on;
    std::vector<std::string> stack;
    std::vector<std::vector<std::string>> circles;
    int next = 0;
    std::function<void(const std::string &)> visit = [&](const std::string &v) {
        index[v] = low[v] = next++;
        stack.push_back(v);
        on[v] = true;
        for (const auto &w : edges[v]) {
            if (!index.count(w)) {
                visit(w);
                low[v] = std::min(low[v], low[w]);
            } else if (on[w]) {
                low[v] = std::min(low[v], index[w]);
            }
        }
        if (low[v] != index[v]) return;
        std::vector<std::string> scc;
        std::string w;
        do {
            w = stack.back();
            stack.pop_back();
            on[w] = false;
            scc.push_back(w);
        } while (w != v);
        if (scc.size() > 1) circles.push_back(scc);
    };
    std::vector<std::string> all;
    for (const auto &kv : edges) all.push_back(kv.first);
    for (const auto &v : all)
        if (!index.count(v)) visit(v);
    std::string msg;
    for (auto &c : circles) {
        std::sort(c.begin(), c.end());
        for (const auto &m : c) msg += m + " ";
        msg += "\n";
    }
    EXPECT_EQ(msg, "") << "modules that include each other in a circle";
}

} // namespace
