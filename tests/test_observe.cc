// Issue 16 item 8: every metrics line names its run (run_id, run_start), the --report carries every
// rank's metrics (min / max / mean) and the error of a validation failure, and `fsdp-run plot`
// draws loss, lr, grad norm and tokens/s against step for one or several runs (PNG or SVG, cairo).
#include <gtest/gtest.h>
#include <jansson.h>

#include <cairo.h>

#include <set>
#include <string>
#include <vector>

#include "test_util.h"
#include "jsonl_util.h"

using namespace fsdp_test;

namespace {

struct Dir {
    std::string d = make_tmpdir("fsdp-observe");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

int run(const std::string &args, std::string *out) {
    return run_cmd("env -u SLURM_NTASKS timeout 300 " + fsdp_run_bin() + " " + args, out);
}

std::string recipe(const Dir &d, const std::string &metrics, int steps = 4, int batch = 6) {
    std::string p = d / ("r" + std::to_string(steps) + ".yaml");
    write_file(p, "runtime: {device: cpu}\nmodel: {preset: tiny}\n"
                  "data: {kind: text, path: data/quickstart.txt, batch_size: " + std::to_string(batch) + ", seq_len: 16}\n"
                  "stages:\n  - {id: i, uses: init-meta}\n"
                  "  - {id: t, uses: train-steps, with: {steps: " + std::to_string(steps) + ", warmup_steps: 2, metrics: " +
                      metrics + "}}\n");
    return p;
}

std::vector<json_t *> json_lines(const std::string &path) { return jsonl_objects(path); }

// Pixels of the PNG whose colour is within 8 of (r, g, b).
long count_colour(const std::string &png, int r, int g, int b, int *w = nullptr, int *h = nullptr) {
    cairo_surface_t *s = cairo_image_surface_create_from_png(png.c_str());
    if (cairo_surface_status(s) != CAIRO_STATUS_SUCCESS) {
        cairo_surface_destroy(s);
        return -1;
    }
    int W = cairo_image_surface_get_width(s), H = cairo_image_surface_get_height(s),
        stride = cairo_image_surface_get_stride(s);
    const unsigned char *data = cairo_image_surface_get_data(s);
    long n = 0;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            uint32_t px;
            memcpy(&px, data + y * stride + x * 4, 4);
            int pr = (px >> 16) & 255, pg = (px >> 8) & 255, pb = px & 255;
            if (abs(pr - r) <= 8 && abs(pg - g) <= 8 && abs(pb - b) <= 8) n++;
        }
    if (w) *w = W;
    if (h) *h = H;
    cairo_surface_destroy(s);
    return n;
}

}  // namespace

TEST(Observe, EveryMetricsLineNamesItsRun) {
    // two runs appending to one metrics file: before, their lines could not be told apart
    Dir d;
    std::string m = d / "m.jsonl", p = recipe(d, m), out;
    ASSERT_EQ(run("-q " + p, &out), 0) << out;
    ASSERT_EQ(run("-q " + p, &out), 0) << out;
    std::vector<json_t *> lines = json_lines(m);
    ASSERT_EQ(lines.size(), 8u);
    std::set<std::string> ids, starts;
    for (json_t *j : lines) {
        const char *id = json_string_value(json_object_get(j, "run_id"));
        const char *st = json_string_value(json_object_get(j, "run_start"));
        ASSERT_TRUE(id && st) << json_dumps(j, 0);
        ids.insert(id);
        starts.insert(st);
        EXPECT_EQ(strlen(st), 24u) << st;  // 2026-11-25T04:39:34.865Z
        EXPECT_EQ(std::string(st).back(), 'Z');
        json_decref(j);
    }
    EXPECT_EQ(ids.size(), 2u);
    // the first four lines are one run, the last four the other
    std::vector<json_t *> again = json_lines(m);
    std::string a = json_string_value(json_object_get(again[0], "run_id")),
                b = json_string_value(json_object_get(again[4], "run_id"));
    EXPECT_NE(a, b);
    for (int i = 0; i < 8; i++) {
        EXPECT_EQ(json_string_value(json_object_get(again[(size_t)i], "run_id")), i < 4 ? a : b);
        json_decref(again[(size_t)i]);
    }
}

TEST(Observe, ReportCarriesTheRunIdAndTheValidationError) {
    Dir d;
    std::string m = d / "m.jsonl", p = recipe(d, m), out;
    ASSERT_EQ(run("-q --report " + d / "ok.json " + p, &out), 0) << out;
    json_error_t je;
    json_t *ok = json_load_file((d / "ok.json").c_str(), 0, &je);
    ASSERT_TRUE(ok) << je.text;
    std::vector<json_t *> lines = json_lines(m);
    ASSERT_FALSE(lines.empty());
    EXPECT_STREQ(json_string_value(json_object_get(ok, "run_id")),
                 json_string_value(json_object_get(lines[0], "run_id")));
    for (json_t *j : lines) json_decref(j);
    json_decref(ok);
    // a recipe refused by validation: the report says why (before: status failed, no error)
    write_file(d / "bad.yaml", "model: {preset: tiny}\ndata: {kind: synthetic, batch_size: 2, seq_len: 8}\n"
                               "stages:\n  - {id: t, uses: train-steps, with: {steps: 2, lr: fast, warmup_steps: 9}}\n");
    EXPECT_EQ(run("-q --report " + d / "bad.json " + d / "bad.yaml", &out), 2) << out;
    json_t *bad = json_load_file((d / "bad.json").c_str(), 0, &je);
    ASSERT_TRUE(bad) << je.text;
    EXPECT_STREQ(json_string_value(json_object_get(bad, "status")), "invalid");
    const char *e = json_string_value(json_object_get(bad, "error"));
    ASSERT_TRUE(e);
    EXPECT_NE(std::string(e).find(d / "bad.yaml:4:53: stage 't' (train-steps): parameter 'lr' expects float, got 'fast'"),
              std::string::npos)
        << e;
    EXPECT_NE(std::string(e).find(d / "bad.yaml:4:73: stage 't' (train-steps): warmup_steps 9 is more than steps 2"),
              std::string::npos)
        << e;
    json_decref(bad);
}

TEST(Observe, ReportHasEveryRanksMetrics) {
    Dir d;
    std::string p = recipe(d, d / "m.jsonl"), out;
    int rc = run_cmd("env -u SLURM_NTASKS timeout 300 " + mpirun_prefix(3) + " " + fsdp_run_bin() + " -q --report " +
                         d / "r.json " + p,
                     &out);
    ASSERT_EQ(rc, 0) << out;
    json_error_t je;
    json_t *r = json_load_file((d / "r.json").c_str(), 0, &je);
    ASSERT_TRUE(r) << je.text;
    EXPECT_EQ(json_integer_value(json_object_get(r, "world_size")), 3);
    json_t *stages = json_object_get(r, "stages");
    json_t *train = json_array_get(stages, 1);
    ASSERT_TRUE(train);
    json_t *ranks = json_object_get(train, "ranks");
    ASSERT_TRUE(json_is_object(ranks)) << json_dumps(train, JSON_INDENT(1));
    // every numeric metric of rank 0 is there over the 3 ranks, with min <= rank 0's <= max
    json_t *mine = json_object_get(train, "metrics");
    const char *key;
    json_t *val;
    size_t n = 0;
    json_object_foreach(mine, key, val) {
        if (!json_is_number(val)) continue;
        json_t *s = json_object_get(ranks, key);
        ASSERT_TRUE(s) << key;
        double mn = json_number_value(json_object_get(s, "min")), mx = json_number_value(json_object_get(s, "max")),
               mean = json_number_value(json_object_get(s, "mean")), v = json_number_value(val);
        EXPECT_EQ(json_integer_value(json_object_get(s, "ranks")), 3) << key;
        EXPECT_LE(mn, v) << key;
        EXPECT_GE(mx, v) << key;
        EXPECT_LE(mn, mean) << key;
        EXPECT_GE(mx, mean) << key;
        n++;
    }
    EXPECT_GT(n, 0u) << json_dumps(train, JSON_INDENT(1));
    // on one rank: no per-rank section
    ASSERT_EQ(run("-q --report " + d / "one.json " + p, &out), 0) << out;
    json_t *one = json_load_file((d / "one.json").c_str(), 0, &je);
    ASSERT_TRUE(one) << je.text;
    EXPECT_EQ(json_object_get(json_array_get(json_object_get(one, "stages"), 1), "ranks"), nullptr);
    json_decref(one);
    json_decref(r);
}

TEST(Observe, PlotWritesAPngWithEverySeries) {
    Dir d;
    std::string a = d / "a.jsonl", b = d / "b.jsonl", out;
    ASSERT_EQ(run("-q " + recipe(d, a, 6), &out), 0) << out;
    ASSERT_EQ(run("-q " + recipe(d, b, 9), &out), 0) << out;
    ASSERT_EQ(run("plot " + a + " " + b + " -o " + d / "loss.png", &out), 0) << out;
    EXPECT_NE(out.find("plot: wrote " + d / "loss.png (2 runs)"), std::string::npos) << out;
    std::string png = read_file(d / "loss.png");
    ASSERT_GT(png.size(), 8u);
    EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
    int w = 0, h = 0;
    // the two series' colours (the palette's first two) are drawn; the background is white
    long c1 = count_colour(d / "loss.png", 31, 120, 181, &w, &h), c2 = count_colour(d / "loss.png", 255, 127, 13);
    EXPECT_EQ(w, 1200);
    EXPECT_EQ(h, 800);
    EXPECT_GT(c1, 200);
    EXPECT_GT(c2, 200);
    EXPECT_GT(count_colour(d / "loss.png", 255, 255, 255), (long)w * h / 2);
    // one run only: the second colour is absent
    ASSERT_EQ(run("plot " + a + " -o " + d / "one.png", &out), 0) << out;
    EXPECT_GT(count_colour(d / "one.png", 31, 120, 181), 200);
    EXPECT_EQ(count_colour(d / "one.png", 255, 127, 13), 0);
}

TEST(Observe, PlotWritesAnSvgWithEveryPanel) {
    Dir d;
    std::string a = d / "a.jsonl", out;
    ASSERT_EQ(run("-q " + recipe(d, a, 5), &out), 0) << out;
    ASSERT_EQ(run("-q " + recipe(d, a, 5), &out), 0) << out;  // a second run in the same file
    ASSERT_EQ(run("plot " + a + " -o " + d / "p.svg", &out), 0) << out;
    EXPECT_NE(out.find("(2 runs)"), std::string::npos) << out;  // told apart by run_id
    std::string svg = read_file(d / "p.svg");
    EXPECT_EQ(svg.rfind("<?xml", 0), 0u) << svg.substr(0, 100);
    EXPECT_NE(svg.find("<svg"), std::string::npos);
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
    // both series' strokes: 4 panels x 2 runs
    size_t blue = 0, orange = 0;
    for (size_t p = svg.find("stroke:rgb(12%,47%,71%)"); p != std::string::npos;
         p = svg.find("stroke:rgb(12%,47%,71%)", p + 1))
        blue++;
    for (size_t p = svg.find("stroke:rgb(100%,50%,5%)"); p != std::string::npos;
         p = svg.find("stroke:rgb(100%,50%,5%)", p + 1))
        orange++;
    EXPECT_EQ(blue, 4u) << svg.substr(0, 2000);
    EXPECT_EQ(orange, 4u);
}

// The paths of an SVG whose style holds `style` (each path's d="..." attribute).
static std::vector<std::string> svg_paths(const std::string &svg, const std::string &style) {
    std::vector<std::string> v;
    for (size_t p = svg.find("<path"); p != std::string::npos; p = svg.find("<path", p + 1)) {
        size_t e = svg.find("/>", p), st = svg.find(style, p), d = svg.find(" d=\"", p);
        if (st < e && d < e) v.push_back(svg.substr(d + 4, svg.find('"', d + 4) - d - 4));
    }
    return v;
}

static size_t count_of(const std::string &s, const std::string &what) {
    size_t n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) n++;
    return n;
}

// An eval_every run's metrics: the eval lines ({"step", "eval_loss"} only) are drawn on the loss panel as
// their own dashed series with a marker at each eval step, and leave no gap in the four training curves.
TEST(Observe, PlotDrawsEvalLossAndKeepsTrainingCurvesWhole) {
    Dir d;
    std::string m;
    for (int s = 1; s <= 6; s++) {
        // no three points in a line (cairo's SVG output merges collinear segments)
        m += "{\"step\": " + std::to_string(s) + ", \"loss\": " + std::to_string(5 - 0.1 * s * s) +
             ", \"lr\": " + std::to_string(0.001 * s * s) + ", \"grad_norm\": " + std::to_string(1 + 0.1 * s * s) +
             ", \"tokens_per_s\": " + std::to_string(1000 + s * s) + ", \"run_id\": \"r\"}\n";
        if (s % 3 == 0)
            m += "{\"step\": " + std::to_string(s) + ", \"eval_loss\": " + std::to_string(5.2 - 0.3 * s) +
                 ", \"eval_tokens\": 64, \"run_id\": \"r\"}\n";
    }
    write_file(d / "m.jsonl", m);
    std::string out;
    ASSERT_EQ(run("plot " + d / "m.jsonl -o " + d / "p.svg", &out), 0) << out;
    std::string svg = read_file(d / "p.svg");
    auto solid = svg_paths(svg, "stroke-width:2;stroke-linecap:butt;stroke-linejoin:miter;stroke:rgb(12%,47%,71%)");
    ASSERT_EQ(solid.size(), 4u) << svg.substr(0, 3000);
    for (auto &p : solid) {
        EXPECT_EQ(count_of(p, "M "), 1u) << p;  // one piece: no gap at the eval lines
        EXPECT_EQ(count_of(p, "L "), 5u) << p;  // through the 6 training steps
    }
    auto dashed = svg_paths(svg, "stroke:rgb(12%,47%,71%);stroke-opacity:1;stroke-dasharray");
    ASSERT_EQ(dashed.size(), 1u) << svg.substr(0, 3000);  // the eval loss, on the loss panel only
    EXPECT_EQ(count_of(dashed[0], "M "), 1u);
    EXPECT_EQ(count_of(dashed[0], "L "), 1u);  // steps 3 and 6
    size_t markers = 0;
    for (auto &p : svg_paths(svg, "fill:rgb(12%,47%,71%)")) markers += count_of(p, "C ") ? count_of(p, "M ") : 0;
    EXPECT_EQ(markers, 2u);  // a filled circle at each eval step
}

TEST(Observe, PlotErrorsNameTheFileAndLine) {
    Dir d;
    std::string out;
    EXPECT_EQ(run("plot " + d / "none.jsonl -o " + d / "x.png", &out), 1) << out;
    EXPECT_NE(out.find(d / "none.jsonl: cannot open"), std::string::npos) << out;
    write_file(d / "bad.jsonl", "{\"step\": 1, \"loss\": 2.5}\n{\"step\": 2, \"loss\": 2.\n");
    EXPECT_EQ(run("plot " + d / "bad.jsonl -o " + d / "x.png", &out), 1) << out;
    EXPECT_NE(out.find("plot: " + d / "bad.jsonl:2: not a JSON object"), std::string::npos) << out;
    write_file(d / "nostep.jsonl", "{\"loss\": 2.5}\n");
    EXPECT_EQ(run("plot " + d / "nostep.jsonl -o " + d / "x.png", &out), 1) << out;
    EXPECT_NE(out.find("plot: " + d / "nostep.jsonl:1: no numeric \"step\""), std::string::npos) << out;
    write_file(d / "empty.jsonl", "\n");
    EXPECT_EQ(run("plot " + d / "empty.jsonl -o " + d / "x.png", &out), 1) << out;
    EXPECT_NE(out.find("plot: " + d / "empty.jsonl has no metrics lines"), std::string::npos) << out;
    write_file(d / "ok.jsonl", "{\"step\": 1, \"loss\": 2.5}\n");
    EXPECT_EQ(run("plot " + d / "ok.jsonl -o " + d / "x.jpg", &out), 2) << out;
    EXPECT_NE(out.find("expected a .png or .svg file name"), std::string::npos) << out;
    EXPECT_EQ(run("plot " + d / "ok.jsonl", &out), 2) << out;
    EXPECT_NE(out.find("-o OUT.png|OUT.svg is required"), std::string::npos) << out;
    EXPECT_FALSE(exists(d / "x.png"));
    EXPECT_FALSE(exists(d / "x.jpg"));
    // a directory that does not exist: cairo's error, named
    EXPECT_EQ(run("plot " + d / "ok.jsonl -o " + d / "no/dir/x.png", &out), 1) << out;
    EXPECT_NE(out.find("plot: cannot write " + d / "no/dir/x.png"), std::string::npos) << out;
}

// A mixture of experts' metrics (aux_loss, expert_load_min_max per layer) add two panels: six solid
// lines of the run, the balance panel the smallest layer's ratio; a dense run keeps four panels.
TEST(Observe, PlotDrawsTheExpertPanelsOfAMixtureOfExperts) {
    Dir d;
    std::string m;
    for (int s = 1; s <= 4; s++)
        m += "{\"step\": " + std::to_string(s) + ", \"loss\": " + std::to_string(5 - 0.1 * s * s) +
             ", \"lr\": " + std::to_string(0.001 * s * s) + ", \"grad_norm\": " + std::to_string(1 + 0.1 * s * s) +
             ", \"tokens_per_s\": " + std::to_string(1000 + s * s) + ", \"aux_loss\": " + std::to_string(2 + 0.01 * s * s) +
             ", \"expert_load\": {\"0\": [10, 20, 30, 40], \"1\": [25, 25, 25, 25]}, \"expert_load_min_max\": {\"0\": " +
             std::to_string(0.1 * s * s) + ", \"1\": 1}, \"run_id\": \"r\"}\n";
    write_file(d / "moe.jsonl", m);
    std::string out;
    ASSERT_EQ(run("plot " + d / "moe.jsonl -o " + d / "p.svg", &out), 0) << out;
    std::string svg = read_file(d / "p.svg");
    auto solid = svg_paths(svg, "stroke-width:2;stroke-linecap:butt;stroke-linejoin:miter;stroke:rgb(12%,47%,71%)");
    EXPECT_EQ(solid.size(), 6u) << svg.substr(0, 3000);
    for (auto &p : solid) EXPECT_EQ(count_of(p, "L "), 3u) << p;  // every panel has all 4 steps
    // without the expert metrics: the four panels
    std::string dense;
    for (int s = 1; s <= 3; s++)
        dense += "{\"step\": " + std::to_string(s) + ", \"loss\": " + std::to_string(5 - 0.1 * s * s) +
                 ", \"lr\": " + std::to_string(0.001 * s * s) + ", \"grad_norm\": " + std::to_string(1 + 0.1 * s * s) +
                 ", \"tokens_per_s\": " + std::to_string(1000 + s * s) + "}\n";
    write_file(d / "dense.jsonl", dense);
    ASSERT_EQ(run("plot " + d / "dense.jsonl -o " + d / "q.svg", &out), 0) << out;
    EXPECT_EQ(svg_paths(read_file(d / "q.svg"),
                        "stroke-width:2;stroke-linecap:butt;stroke-linejoin:miter;stroke:rgb(12%,47%,71%)")
                  .size(),
              4u);
}
