// Placement of the sharded state (runtime/state_dev.c) and the device choice of the stages
// (stages/device.c). The accessors, the host views and the runtime.device errors run everywhere;
// the GPU tests (state on the device and back, stages on runtime.device cuda against the same
// stages on cpu) skip when no GPU is present.
#include <gtest/gtest.h>
#include <jansson.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ckpt_compare.h"
#include "gpu_util.h"
#include "test_util.h"
#include "train_run_util.h"

extern "C" {
#include "ckpt/state_io.h"
#include "runtime/ctx_impl.h"
#include "runtime/device.h"
#include "runtime/device_xfer.h"
#include "runtime/state.h"
#include "stages/stages.h"
}

using namespace fsdp_test;

namespace {

#define NEED_GPU()                                                   \
    do {                                                             \
        std::string why_;                                            \
        if (!gpu_present(&why_)) GTEST_SKIP() << "no GPU: " << why_;    \
    } while (0)

// A world-of-1 sharded state outside any context (freed with state_free).
struct HostState {
    fsdp_state *s = (fsdp_state *)calloc(1, sizeof(fsdp_state));
    HostState() {
        s->layout = STATE_SHARDED;
        s->world = 1;
    }
    ~HostState() { state_free(s); }
    state_param *add(const char *name, std::vector<int64_t> shape) {
        fsdp_err err;
        EXPECT_EQ(state_add_param(s, name, (int)shape.size(), shape.data(), -1, &err), 0) << err.msg;
        return &s->p[s->n - 1];
    }
};

std::vector<float> random_values(size_t n, unsigned seed) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto &x : v) x = d(g);
    return v;
}

void fill(fsdp_state *s, state_param *p, state_array a, const std::vector<float> &v) {
    fsdp_err err;
    ASSERT_EQ(state_param_put(s, p, a, v.data(), &err), 0) << err.msg;
}

std::vector<float> get(const fsdp_state *s, const state_param *p, state_array a) {
    std::vector<float> v(state_param_local_numel(p) ? state_param_local_numel(p) : 1);
    fsdp_err err;
    EXPECT_EQ(state_param_get(s, p, a, v.data(), &err), 0) << err.msg;
    v.resize(state_param_local_numel(p));
    return v;
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && (a.empty() || !memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

std::string run(const std::string &args, int *rc) {
    std::string out;
    *rc = run_cmd("timeout -k 10 300 " + fsdp_run_bin() + " " + args, &out);
    return out;
}

struct Dir {
    std::string d = make_tmpdir("fsdp-sdev");
    ~Dir() { rm_rf(d); }
    std::string operator/(const std::string &n) const { return d + "/" + n; }
};

// The string metric `key` of stage `id` in a run report.
std::string report_metric(const std::string &report, const char *id, const char *key) {
    json_error_t je;
    json_t *j = json_load_file(report.c_str(), 0, &je);
    std::string v;
    if (!j) return v;
    json_t *st = json_object_get(j, "stages");
    for (size_t i = 0; i < json_array_size(st); i++) {
        json_t *o = json_array_get(st, i);
        if (strcmp(json_string_value(json_object_get(o, "id")), id)) continue;
        const char *s = json_string_value(json_object_get(json_object_get(o, "metrics"), key));
        if (s) v = s;
    }
    json_decref(j);
    return v;
}

// Two DCP checkpoints: the data files equal byte for byte, every tensor equal both ways (.metadata
// itself names the path and a save id, so it differs).
void expect_same_dcp(const std::string &a, const std::string &b) {
    ASSERT_TRUE(exists(a + "/.metadata")) << a;
    ASSERT_TRUE(exists(b + "/.metadata")) << b;
    EXPECT_TRUE(dcp_data_blanked(a + "/__0_0.distcp") == dcp_data_blanked(b + "/__0_0.distcp")) << a << " vs " << b;
    Ckpt x(a), y(b);
    ASSERT_TRUE(x.r && y.r);
    expect_same_tensors(x.r, y.r);
    expect_same_tensors(y.r, x.r);
}

// Sign-magnitude bits of two floats (f32, or bf16 widened) at most 1 unit in the last place apart.
bool within_one_ulp(int64_t x, int64_t y, int64_t sign) {
    if ((x & sign) != (y & sign)) return (x & (sign - 1)) + (y & (sign - 1)) <= 1; // +-0 and the smallest values
    return std::llabs((long long)(x - y)) <= 1;
}

// Every floating-point tensor of `got` within 1 ulp of `want` in its stored dtype (f32 or bf16),
// with the same names, shapes and dtypes.
void expect_within_one_ulp(const std::string &got, const std::string &want) {
    Ckpt g(got), w(want);
    ASSERT_TRUE(g.r && w.r);
    size_t checked = 0;
    for (size_t i = 0; i < ckpt_count(w.r); i++) {
        const ckpt_entry *e = ckpt_entry_at(w.r, i);
        if (!e->is_tensor) continue;
        ASSERT_TRUE(e->dtype == FSDP_DT_F32 || e->dtype == FSDP_DT_BF16) << e->name;
        long gi = ckpt_find(g.r, e->name);
        ASSERT_GE(gi, 0) << e->name;
        EXPECT_EQ(ckpt_entry_at(g.r, (size_t)gi)->dtype, e->dtype) << e->name;
        auto a = tensor_bytes(g.r, e->name, e->dtype), b = tensor_bytes(w.r, e->name, e->dtype);
        ASSERT_EQ(a.size(), b.size()) << e->name;
        size_t esz = e->dtype == FSDP_DT_F32 ? 4 : 2, bad = 0;
        for (size_t k = 0; k < a.size() / esz; k++) {
            uint32_t x = 0, y = 0;
            memcpy(&x, a.data() + esz * k, esz);
            memcpy(&y, b.data() + esz * k, esz);
            if (!within_one_ulp(x, y, esz == 4 ? 0x80000000LL : 0x8000LL)) bad++;
        }
        EXPECT_EQ(bad, 0u) << e->name;
        checked++;
    }
    EXPECT_GT(checked, 0u);
}

}  // namespace

// ---- host state: runs everywhere ----------------------------------------------------------------

// The 1-ulp comparison the GPU init test relies on.
TEST(StateDev, OneUlpComparison) {
    auto bits = [](float f) {
        uint32_t u;
        memcpy(&u, &f, 4);
        return (int64_t)u;
    };
    const int64_t S = 0x80000000LL;
    EXPECT_TRUE(within_one_ulp(bits(1.0f), bits(1.0f), S));
    EXPECT_TRUE(within_one_ulp(bits(1.0f), bits(std::nextafter(1.0f, 2.0f)), S));
    EXPECT_TRUE(within_one_ulp(bits(-1.0f), bits(std::nextafter(-1.0f, -2.0f)), S));
    EXPECT_FALSE(within_one_ulp(bits(1.0f), bits(std::nextafter(std::nextafter(1.0f, 2.0f), 2.0f)), S));
    EXPECT_FALSE(within_one_ulp(bits(1.0f), bits(-1.0f), S));
    EXPECT_TRUE(within_one_ulp(bits(0.0f), bits(-0.0f), S));
    EXPECT_TRUE(within_one_ulp(0x3f80, 0x3f81, 0x8000)); // bf16
    EXPECT_FALSE(within_one_ulp(0x3f80, 0xbf80, 0x8000));
}

TEST(StateDev, HostAccessorsReadAndWriteInPlace) {
    HostState h;
    h.add("a.weight", {5, 3});
    h.add("b.weight", {7});
    state_param *a = &h.s->p[0]; // (adding a parameter may move the array)
    fsdp_err err;
    EXPECT_EQ(state_place_of(a, STATE_DATA), STATE_HOST);
    EXPECT_EQ(state_place_of(a, STATE_GRAD), STATE_ABSENT);
    EXPECT_FALSE(state_on_device(h.s));
    auto v = random_values(15, 1);
    fill(h.s, a, STATE_DATA, v);
    EXPECT_EQ(memcmp(a->data, v.data(), 15 * sizeof(float)), 0);
    EXPECT_TRUE(same_bits(get(h.s, a, STATE_DATA), v));
    // map gives the host array itself; unmap leaves it alone
    float *m = nullptr;
    ASSERT_EQ(state_param_map(h.s, a, STATE_DATA, &m, &err), 0) << err.msg;
    EXPECT_EQ(m, a->data);
    m[2] = 42.0f;
    ASSERT_EQ(state_param_unmap(h.s, a, STATE_DATA, m, 1, &err), 0) << err.msg;
    EXPECT_EQ(a->data[2], 42.0f);
    // absent arrays are named in the error
    float one;
    EXPECT_EQ(state_param_get(h.s, a, STATE_GRAD, &one, &err), FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "a.weight has no grad"), nullptr) << err.msg;
    EXPECT_EQ(state_param_map(h.s, a, STATE_EXP_AVG, &m, &err), FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "has no exp_avg"), nullptr) << err.msg;
    // gradients and moments of a host state: zeroed host memory
    ASSERT_EQ(state_alloc_grads(h.s, &err), 0) << err.msg;
    ASSERT_EQ(state_alloc_optimizer(h.s, &err), 0) << err.msg;
    for (size_t i = 0; i < h.s->n; i++)
        for (state_array k : {STATE_GRAD, STATE_EXP_AVG, STATE_EXP_AVG_SQ}) {
            EXPECT_EQ(state_place_of(&h.s->p[i], k), STATE_HOST) << state_array_name(k);
            for (float x : get(h.s, &h.s->p[i], k)) EXPECT_EQ(x, 0.0f);
        }
    EXPECT_TRUE(h.s->has_optimizer);
    // moving within the host and to the host is a no-op
    float *before = a->data;
    ASSERT_EQ(state_param_move(h.s, a, STATE_DATA, STATE_HOST, &err), 0) << err.msg;
    ASSERT_EQ(state_to_host(h.s, &err), 0) << err.msg;
    EXPECT_EQ(a->data, before);
    EXPECT_EQ(h.s->dev, nullptr);
}

TEST(StateDev, HostViewSharesHostArrays) {
    HostState h;
    state_param *a = h.add("a.weight", {4, 2});
    fsdp_err err;
    ASSERT_EQ(state_alloc_optimizer(h.s, &err), 0) << err.msg;
    h.s->train_step = 7;
    fsdp_state *v = nullptr;
    ASSERT_EQ(state_host_view(h.s, &v, &err), 0) << err.msg;
    ASSERT_NE(v, nullptr);
    EXPECT_NE(v, h.s);
    EXPECT_EQ(v->n, 1u);
    EXPECT_EQ(v->train_step, 7);
    EXPECT_EQ(v->p[0].data, a->data);
    EXPECT_EQ(v->p[0].exp_avg_sq, a->exp_avg_sq);
    EXPECT_STREQ(v->p[0].name, "a.weight");
    state_host_view_free(v);
    a->data[0] = 3.0f; // the state is intact
    EXPECT_EQ(get(h.s, a, STATE_DATA)[0], 3.0f);
}

TEST(StateDev, DevicePlacementWithoutDeviceIsAClearError) {
    HostState h;
    state_param *a = h.add("a.weight", {4, 2});
    fsdp_err err;
    EXPECT_EQ(state_to_device(h.s, nullptr, &err), FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "no device context"), nullptr) << err.msg;
    EXPECT_EQ(state_param_alloc(h.s, a, STATE_GRAD, STATE_DEVICE, 1, &err), FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "a.weight (grad): the state has no device context"), nullptr) << err.msg;
    EXPECT_EQ(state_param_alloc(h.s, a, STATE_GRAD, STATE_PINNED, 1, &err), FSDP_E_INVALID);
    EXPECT_EQ(state_param_move(h.s, a, STATE_DATA, STATE_DEVICE, &err), FSDP_E_INVALID);
    // nothing changed
    EXPECT_EQ(state_place_of(a, STATE_DATA), STATE_HOST);
    EXPECT_EQ(state_place_of(a, STATE_GRAD), STATE_ABSENT);
}

TEST(StateDev, ShardRefusesFullParametersOnTheDevice) {
    fsdp_state *s = (fsdp_state *)calloc(1, sizeof(fsdp_state));
    s->layout = STATE_FULL;
    s->world = 1;
    int64_t shape[2] = {4, 2};
    fsdp_err err;
    ASSERT_EQ(state_add_param(s, "a.weight", 2, shape, -1, &err), 0) << err.msg;
    // a device twin is only pretended here: state_shard must refuse before touching it
    float fake;
    float *host = s->p[0].data;
    s->p[0].data = nullptr;
    s->p[0].d_data = &fake;
    comm *c;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    EXPECT_EQ(state_shard(s, c, &err), FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "must be in host memory"), nullptr) << err.msg;
    s->p[0].d_data = nullptr;
    s->p[0].data = host;
    EXPECT_EQ(state_shard(s, c, &err), 0) << err.msg;
    comm_destroy(c);
    state_free(s);
}

// The device slot sits first among the attachments so that it is destroyed after the state.
TEST(StageDevice, DeviceSlotIsDestroyedLast) {
    fsdp_ctx *ctx = ctx_new(nullptr, 0, stderr);
    ASSERT_NE(ctx, nullptr);
    fsdp_state *s;
    fsdp_err err;
    ASSERT_EQ(state_create(ctx, STATE_SHARDED, &s, &err), 0);
    int on_gpu = -1;
    // no recipe: runtime.device is auto
    ASSERT_EQ(stage_on_gpu(ctx, &on_gpu, &err), 0) << err.msg;
    std::string why;
    EXPECT_EQ(on_gpu, gpu_present(&why) ? 1 : 0);
    ASSERT_GE(ctx->n_att, 2u);
    EXPECT_STREQ(ctx->att[0].name, "fsdp.device");
    EXPECT_EQ(fsdp_ctx_attached(ctx, STATE_ATTACH_NAME), s);
    ctx_free(ctx);
}

TEST(StageDevice, DeviceContextOnlyWithAGpuElseAClearError) {
    std::string why;
    fsdp_ctx *ctx = ctx_new(nullptr, 0, stderr);
    ASSERT_NE(ctx, nullptr);
    dev_ctx *d = (dev_ctx *)&why; // overwritten
    fsdp_err err;
    if (gpu_present(&why)) {
        // one context per run, shared by every later call, and NCCL on top of it
        ASSERT_EQ(stage_device(ctx, &d, &err), 0) << err.msg;
        ASSERT_NE(d, nullptr);
        dev_ctx *again = nullptr;
        ASSERT_EQ(stage_device(ctx, &again, &err), 0) << err.msg;
        EXPECT_EQ(again, d);
        EXPECT_EQ(stage_device_nccl(ctx, &err), 0) << err.msg;
        ctx_free(ctx);
        return;
    }
    EXPECT_EQ(stage_device(ctx, &d, &err), FSDP_E_DEVICE);
    EXPECT_EQ(d, nullptr);
    EXPECT_NE(strstr(err.msg, "runtime.device cuda: "), nullptr) << err.msg;
    EXPECT_NE(strstr(err.msg, dev_built_with_cuda() ? "no usable CUDA device" : "built without CUDA"), nullptr)
        << err.msg;
    EXPECT_EQ(stage_device_nccl(ctx, &err), FSDP_E_DEVICE);
    ctx_free(ctx);
}

TEST(StageDevice, CudaRunsOnAGpuAndWithoutOneFailsBeforeAnyStageNamingTheKey) {
    std::string why;
    Dir t;
    write_file(t / "r.yaml", "model: {preset: tiny}\nstages:\n  - {id: i, uses: init-meta}\n"
                             "  - {id: s, uses: save-dcp, with: {path: " + (t / "ck") + "}}\n");
    int rc;
    std::string o = run((t / "r.yaml") + " --set runtime.device=cuda --report " + (t / "rep.json"), &rc);
    if (gpu_present(&why)) {
        EXPECT_EQ(rc, 0) << o;
        EXPECT_TRUE(exists(t / "ck/.metadata")) << o;
        return;
    }
    EXPECT_EQ(rc, 2) << o;
    EXPECT_NE(o.find("runtime.device is cuda, but"), std::string::npos) << o;
    EXPECT_NE(o.find(dev_built_with_cuda() ? "no GPU is usable here" : "built without CUDA"), std::string::npos) << o;
    EXPECT_EQ(o.find("stage i"), std::string::npos) << o; // no stage ran
    EXPECT_FALSE(exists(t / "ck"));
    // in the recipe itself: the error points at the value
    write_file(t / "c.yaml", "runtime: {device: cuda}\nmodel: {preset: tiny}\nstages:\n  - {id: i, uses: init-meta}\n");
    o = run(t / "c.yaml", &rc);
    EXPECT_EQ(rc, 2) << o;
    EXPECT_NE(o.find(t / "c.yaml:1:19: runtime.device is cuda"), std::string::npos) << o;
    // validate checks recipes meant for another machine: no probe
    o = run("validate " + (t / "c.yaml"), &rc);
    EXPECT_EQ(rc, 0) << o;
    // an unknown device is still a schema error
    o = run((t / "r.yaml") + " --set runtime.device=tpu", &rc);
    EXPECT_EQ(rc, 2) << o;
    EXPECT_NE(o.find("must be one of: auto, cpu, cuda"), std::string::npos) << o;
}

TEST(StageDevice, AutoPicksTheGpuOnlyWhenPresent) {
    Dir t;
    write_file(t / "r.yaml", "model: {preset: tiny}\nstages:\n  - {id: i, uses: init-meta}\n"
                             "  - {id: s, uses: save-dcp, with: {path: " + (t / "ck") + "}}\n");
    int rc;
    std::string o = run((t / "r.yaml") + " --report " + (t / "rep.json"), &rc);
    ASSERT_EQ(rc, 0) << o;
    std::string why;
    bool gpu = gpu_present(&why);
    EXPECT_EQ(report_metric(t / "rep.json", "i", "device"), gpu ? "cuda" : "cpu");
    EXPECT_NE(o.find(gpu ? "runtime.device auto: cuda" : "runtime.device auto: cpu"), std::string::npos) << o;
    if (!gpu) { // no alarming CUDA error on a machine without a GPU, unless asked for (-v: why)
        EXPECT_EQ(o.find("cudaError"), std::string::npos) << o;
        EXPECT_NE(o.find("runtime.device auto: cpu (no usable GPU here)"), std::string::npos) << o;
        std::string v = run("-v " + (t / "r.yaml") + " --set stages.s.with.overwrite=true", &rc);
        ASSERT_EQ(rc, 0) << v;
        EXPECT_NE(v.find("runtime.device auto: why no GPU: "), std::string::npos) << v;
    }
    // device: cpu never probes
    o = run((t / "r.yaml") + " --set runtime.device=cpu --set stages.s.with.overwrite=true --report " + (t / "rep2.json"),
            &rc);
    ASSERT_EQ(rc, 0) << o;
    EXPECT_EQ(report_metric(t / "rep2.json", "i", "device"), "cpu");
    EXPECT_EQ(o.find("runtime.device auto"), std::string::npos) << o;
}

// ---- GPU --------------------------------------------------------------------------------------

namespace {

struct Gpu {
    dev_ctx *d = nullptr;
    Gpu() {
        fsdp_err err;
        d = dev_ctx_create(nullptr, &err);
        EXPECT_NE(d, nullptr) << err.msg;
    }
    ~Gpu() { dev_ctx_free(d); }
};

}  // namespace

TEST(StateDev, GpuRoundTripIsBitExact) {
    NEED_GPU();
    Gpu g;
    ASSERT_NE(g.d, nullptr);
    fsdp_err err;
    std::map<std::string, std::vector<std::vector<float>>> want;
    {
        HostState h;
        // a parameter larger than the staging chunk and not a multiple of it, an empty one, a small one
        int64_t big_rows = (int64_t)(DEV_XFER_CHUNK_DEFAULT / sizeof(float) / 1000) * 2 + 7;
        h.add("big.weight", {big_rows, 1000});
        h.add("empty.weight", {0, 4});
        h.add("norm.weight", {33});
        ASSERT_EQ(state_alloc_grads(h.s, &err), 0) << err.msg;
        ASSERT_EQ(state_alloc_optimizer(h.s, &err), 0) << err.msg;
        unsigned seed = 1;
        for (size_t i = 0; i < h.s->n; i++)
            for (int a = 0; a < STATE_ARRAYS; a++) {
                auto v = random_values(state_param_local_numel(&h.s->p[i]), seed++);
                fill(h.s, &h.s->p[i], (state_array)a, v);
                want[h.s->p[i].name].push_back(v);
            }
        ASSERT_EQ(state_to_device(h.s, g.d, &err), 0) << err.msg;
        EXPECT_EQ(h.s->dev, g.d);
        EXPECT_TRUE(state_on_device(h.s));
        for (size_t i = 0; i < h.s->n; i++)
            for (int a = 0; a < STATE_ARRAYS; a++) {
                state_param *p = &h.s->p[i];
                EXPECT_EQ(state_place_of(p, (state_array)a), STATE_DEVICE);
                EXPECT_EQ(*state_param_host_slot(p, (state_array)a), nullptr);
                EXPECT_TRUE(same_bits(get(h.s, p, (state_array)a), want[p->name][a])) << p->name << " " << a;
            }
        // put / map / unmap on the device
        state_param *big = &h.s->p[0];
        auto v2 = random_values(state_param_local_numel(big), 99);
        fill(h.s, big, STATE_GRAD, v2);
        EXPECT_TRUE(same_bits(get(h.s, big, STATE_GRAD), v2));
        want["big.weight"][STATE_GRAD] = v2;
        float *m = nullptr;
        ASSERT_EQ(state_param_map(h.s, big, STATE_DATA, &m, &err), 0) << err.msg;
        EXPECT_TRUE(same_bits(std::vector<float>(m, m + state_param_local_numel(big)), want["big.weight"][0]));
        m[12345] = -1.5f;
        want["big.weight"][0][12345] = -1.5f;
        ASSERT_EQ(state_param_unmap(h.s, big, STATE_DATA, m, 1, &err), 0) << err.msg;
        // a host view downloads what is on the device, and leaves the device state as it is
        fsdp_state *v = nullptr;
        ASSERT_EQ(state_host_view(h.s, &v, &err), 0) << err.msg;
        for (size_t i = 0; i < v->n; i++)
            for (int a = 0; a < STATE_ARRAYS; a++) {
                const state_param *p = &v->p[i];
                size_t n = state_param_local_numel(p);
                const float *hp = *state_param_host_slot((state_param *)p, (state_array)a);
                ASSERT_NE(hp, nullptr);
                EXPECT_TRUE(same_bits(std::vector<float>(hp, hp + n), want[p->name][a])) << p->name;
            }
        state_host_view_free(v);
        EXPECT_TRUE(state_on_device(h.s));
        // and back
        ASSERT_EQ(state_to_host(h.s, &err), 0) << err.msg;
        EXPECT_FALSE(state_on_device(h.s));
        EXPECT_EQ(h.s->dev, nullptr);
        for (size_t i = 0; i < h.s->n; i++)
            for (int a = 0; a < STATE_ARRAYS; a++) {
                state_param *p = &h.s->p[i];
                EXPECT_EQ(state_place_of(p, (state_array)a), STATE_HOST);
                EXPECT_TRUE(same_bits(get(h.s, p, (state_array)a), want[p->name][a])) << p->name << " " << a;
            }
    }
    dev_mem_stats dm;
    dev_mem_stats_get(g.d, &dm, nullptr);
    EXPECT_EQ(dm.in_use, 0u); // every device array was given back
}

TEST(StateDev, GpuOffloadMovesMomentsToPinnedAndBack) {
    NEED_GPU();
    Gpu g;
    ASSERT_NE(g.d, nullptr);
    fsdp_err err;
    {
        HostState h;
        state_param *p = h.add("w.weight", {300, 70});
        ASSERT_EQ(state_alloc_optimizer(h.s, &err), 0) << err.msg;
        std::vector<std::vector<float>> want;
        for (int a = 0; a < STATE_ARRAYS; a++) {
            if (a == STATE_GRAD) {
                want.push_back({});
                continue;
            }
            want.push_back(random_values(state_param_local_numel(p), 10 + a));
            fill(h.s, p, (state_array)a, want.back());
        }
        ASSERT_EQ(state_to_device(h.s, g.d, &err), 0) << err.msg;
        // offload: the moments go to pinned host memory, the weights stay on the GPU
        h.s->offloaded = 1;
        ASSERT_EQ(state_to_device(h.s, g.d, &err), 0) << err.msg;
        EXPECT_EQ(state_place_of(p, STATE_DATA), STATE_DEVICE);
        EXPECT_EQ(state_place_of(p, STATE_EXP_AVG), STATE_PINNED);
        EXPECT_EQ(state_place_of(p, STATE_EXP_AVG_SQ), STATE_PINNED);
        EXPECT_EQ(p->d_exp_avg, nullptr);
        for (state_array a : {STATE_DATA, STATE_EXP_AVG, STATE_EXP_AVG_SQ})
            EXPECT_TRUE(same_bits(get(h.s, p, a), want[a])) << state_array_name(a);
        // gradients follow the data (device); new moments of an offloaded state are pinned zeros
        ASSERT_EQ(state_alloc_grads(h.s, &err), 0) << err.msg;
        EXPECT_EQ(state_place_of(p, STATE_GRAD), STATE_DEVICE);
        for (float x : get(h.s, p, STATE_GRAD)) ASSERT_EQ(x, 0.0f);
        state_param *q = h.add("new.weight", {5, 3});
        p = &h.s->p[0]; // (adding a parameter may move the array)
        ASSERT_EQ(state_alloc_optimizer(h.s, &err), 0) << err.msg;
        EXPECT_EQ(state_place_of(q, STATE_EXP_AVG), STATE_PINNED);
        for (float x : get(h.s, q, STATE_EXP_AVG_SQ)) ASSERT_EQ(x, 0.0f);
        // master weights too
        h.s->offload_params = 1;
        ASSERT_EQ(state_to_device(h.s, g.d, &err), 0) << err.msg;
        EXPECT_EQ(state_place_of(p, STATE_DATA), STATE_PINNED);
        EXPECT_EQ(state_place_of(p, STATE_GRAD), STATE_PINNED);
        EXPECT_TRUE(same_bits(get(h.s, p, STATE_DATA), want[STATE_DATA]));
        // back on the GPU, bit for bit
        h.s->offloaded = 0;
        h.s->offload_params = 0;
        ASSERT_EQ(state_to_device(h.s, g.d, &err), 0) << err.msg;
        for (state_array a : {STATE_DATA, STATE_EXP_AVG, STATE_EXP_AVG_SQ}) {
            EXPECT_EQ(state_place_of(p, a), STATE_DEVICE);
            EXPECT_TRUE(same_bits(get(h.s, p, a), want[a])) << state_array_name(a);
        }
        // pinned arrays of a state on the host keep the device context alive in s->dev
        h.s->offloaded = 1;
        ASSERT_EQ(state_to_device(h.s, g.d, &err), 0) << err.msg;
        ASSERT_EQ(state_to_host(h.s, &err), 0) << err.msg;
        EXPECT_EQ(state_place_of(p, STATE_EXP_AVG), STATE_PINNED);
        EXPECT_EQ(state_place_of(p, STATE_DATA), STATE_HOST);
        EXPECT_EQ(h.s->dev, g.d);
    }
    dev_mem_stats dm, pm;
    dev_mem_stats_get(g.d, &dm, &pm);
    EXPECT_EQ(dm.in_use, 0u);
    EXPECT_EQ(pm.in_use, 0u);
}

TEST(StateDev, GpuInitRowsEqualTheHostDraw) {
    NEED_GPU();
    Gpu g;
    ASSERT_NE(g.d, nullptr);
    decoder_config cfg;
    fsdp_err err;
    ASSERT_EQ(decoder_config_preset(&cfg, "debugmodel", &err), 0) << err.msg;
    decoder_params t;
    ASSERT_EQ(decoder_params_build(&cfg, &t, &err), 0) << err.msg;
    for (int i = 0; i < t.n; i++) {
        const decoder_param *p = &t.p[i];
        int64_t r0 = p->shape[0] / 3, r1 = p->shape[0] - 1;
        size_t n = (size_t)((r1 - r0) * p->row_numel);
        std::vector<float> want(n), got(n);
        ASSERT_EQ(decoder_init_rows_f32(p, 5, r0, r1, want.data(), &err), 0) << err.msg;
        void *d_dst;
        ASSERT_EQ(dev_alloc(g.d, n * sizeof(float), &d_dst, &err), 0) << err.msg;
        ASSERT_EQ(decoder_init_rows_dev(g.d, p, 5, r0, r1, (float *)d_dst, &err), 0) << err.msg;
        ASSERT_EQ(dev_download(g.d, got.data(), d_dst, n * sizeof(float), &err), 0) << err.msg;
        EXPECT_TRUE(same_bits(got, want)) << p->name;
        ASSERT_EQ(dev_free(g.d, d_dst, &err), 0);
    }
    decoder_params_free(&t);
}

// ---- stages on runtime.device cuda against the same stages on cpu --------------------------------

namespace {

void run_both(const std::string &recipe, const std::string &tag, const std::string &extra = "") {
    for (const char *dev : {"cpu", "cuda"}) {
        int rc;
        ASSERT_EQ(run_cmd("mkdir -p " + tag + "-" + dev, nullptr), 0);
        std::string o = run(recipe + " --set runtime.device=" + dev + " --set vars.out=" + tag + "-" + dev + extra, &rc);
        ASSERT_EQ(rc, 0) << dev << ": " << o;
    }
}

}  // namespace

TEST(StateDev, GpuStagedLoadAndSaveEqualTheHostPaths) {
    NEED_GPU();
    Gpu g;
    ASSERT_NE(g.d, nullptr);
    fsdp_err err;
    comm *c;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    Dir t;
    // a parameter of several 16 MiB staging chunks (not a multiple of one), a small one, a 1-D one
    auto build = [](HostState &h) {
        h.add("big.weight", {(int64_t)(STAGE_CKPT_SINK_BYTES / 4 / 512) * 2 + 5, 512});
        h.add("small.weight", {7, 5});
        h.add("norm.weight", {1000});
        fsdp_err e;
        EXPECT_EQ(state_alloc_optimizer(h.s, &e), 0) << e.msg;
        h.s->has_optimizer = 1;
        h.s->opt_step = 4;
    };
    HostState src;
    build(src);
    unsigned seed = 7;
    for (size_t i = 0; i < src.s->n; i++)
        for (state_array a : {STATE_DATA, STATE_EXP_AVG, STATE_EXP_AVG_SQ})
            fill(src.s, &src.s->p[i], a, random_values(state_param_local_numel(&src.s->p[i]), seed++));
    sio_save_opts so = {};
    so.optimizer = 1;
    so.overwrite = 0;
    std::string ck = t / "host";
    ASSERT_EQ(sio_save(src.s, c, ck.c_str(), &so, &err), 0) << err.msg;
    stage_ckpt_sink sink;
    ASSERT_EQ(stage_ckpt_sink_create(g.d, &sink, &err), 0) << err.msg;
    for (int round = 0; round < 2; round++) {
        // a fresh host state bound to the GPU: every array lands on the device without a host copy
        HostState dst, ref;
        build(dst);
        build(ref);
        ASSERT_EQ(state_attach_device(dst.s, g.d, &err), 0) << err.msg;
        sio_load_opts lo;
        memset(&lo, 0, sizeof lo);
        lo.strict = 1;
        lo.load_optimizer = 1;
        lo.round_bf16 = round;
        sio_load_result rr, rd;
        ASSERT_EQ(sio_load(ref.s, ck.c_str(), &lo, &rr, &err), 0) << err.msg;
        lo.sink = &sink.sink;
        ASSERT_EQ(sio_load(dst.s, ck.c_str(), &lo, &rd, &err), 0) << err.msg;
        EXPECT_EQ(rr.bytes_read, rd.bytes_read);
        EXPECT_EQ(rr.params_loaded, rd.params_loaded);
        for (size_t i = 0; i < dst.s->n; i++)
            for (state_array a : {STATE_DATA, STATE_EXP_AVG, STATE_EXP_AVG_SQ}) {
                state_param *p = &dst.s->p[i];
                EXPECT_EQ(state_place_of(p, a), STATE_DEVICE) << p->name;
                EXPECT_TRUE(same_bits(get(dst.s, p, a), get(ref.s, &ref.s->p[i], a))) << p->name << " " << a;
            }
        // loaded again in place (the state already on the GPU), then saved through the staging
        ASSERT_EQ(sio_load(dst.s, ck.c_str(), &lo, &rd, &err), 0) << err.msg;
        std::string a = t / ("ref" + std::to_string(round)), b = t / ("staged" + std::to_string(round)),
                    e = t / ("async" + std::to_string(round));
        ASSERT_EQ(sio_save(ref.s, c, a.c_str(), &so, &err), 0) << err.msg;
        ASSERT_EQ(sio_save_staged(dst.s, c, b.c_str(), &so, &sink.sink, &err), 0) << err.msg;
        EXPECT_TRUE(dcp_data_blanked(a + "/__0_0.distcp") == dcp_data_blanked(b + "/__0_0.distcp"));
        sio_async *as;
        ASSERT_EQ(sio_save_begin_staged(dst.s, c, e.c_str(), &so, &sink.sink, &as, &err), 0) << err.msg;
        // the snapshot is complete: the device state may change at once
        std::vector<float> z(state_param_local_numel(&dst.s->p[0]), 0.0f);
        fill(dst.s, &dst.s->p[0], STATE_DATA, z);
        ASSERT_EQ(sio_save_finish(as, &err), 0) << err.msg;
        sio_async_free(as);
        EXPECT_TRUE(dcp_data_blanked(a + "/__0_0.distcp") == dcp_data_blanked(e + "/__0_0.distcp"));
    }
    stage_ckpt_sink_free(&sink);
    comm_destroy(c);
}

TEST(StageDevice, GpuInitMetaEqualsCpuWithinOneUlp) {
    NEED_GPU();
    Dir t;
    for (const char *dt : {"f32", "bf16"}) {
        write_file(t / "r.yaml", std::string("model: {preset: debugmodel}\nvars: {out: x}\nstages:\n"
                                             "  - {id: i, uses: init-meta, with: {seed: 3, dtype: ") +
                                     dt + "}}\n  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
        for (const char *dev : {"cpu", "cuda"}) {
            int rc;
            std::string o = run((t / "r.yaml") + " --set runtime.device=" + dev + " --set vars.out=" +
                                    (t / (std::string(dt) + "-" + dev)) + " --report " + (t / "rep.json"),
                                &rc);
            ASSERT_EQ(rc, 0) << o;
            EXPECT_EQ(report_metric(t / "rep.json", "i", "device"), dev);
        }
        expect_within_one_ulp(t / (std::string(dt) + "-cuda"), t / (std::string(dt) + "-cpu"));
    }
}

TEST(StageDevice, GpuLoadCkptThenSaveEqualsCpuByteForByte) {
    NEED_GPU();
    Dir t;
    write_file(t / "r.yaml", "model: {preset: tiny}\nvars: {out: x}\nstages:\n  - {id: l, uses: load-ckpt, with: {path: " +
                                 tiny("dcp_full_ws3") + "}}\n  - {id: s, uses: save-dcp, with: {path: \"${out}\"}}\n");
    run_both(t / "r.yaml", t / "l", " --report " + (t / "rep.json"));
    EXPECT_EQ(report_metric(t / "rep.json", "l", "device"), "cuda");
    expect_same_dcp(t / "l-cpu", t / "l-cuda");
    // and it is the fixture's state
    Ckpt got(t / "l-cuda"), st(tiny("model_step5.safetensors")), adam(tiny("adam_step5.safetensors"));
    expect_same_tensors(got.r, st.r);
    expect_same_tensors(got.r, adam.r, "optimizer.state.", ".exp_avg", ".exp_avg");
}

TEST(StageDevice, GpuBagelBootstrapEqualsCpu) {
    NEED_GPU();
    Dir t;
    run_both("recipes/llama_bootstrap.yaml", t / "b");
    expect_same_dcp(t / "b-cpu", t / "b-cuda");
    // training from it on the GPU trainer gives the CPU trainer's checkpoint up to the order of float32
    // sums (the GPU's reductions against OpenBLAS's) and the same losses: the AdamW moments within 1e-5 of
    // their largest value; the weights within 1% of the largest AdamW step they can take over the 2 steps
    // (lr 5e-4 + 1e-3: an element whose gradient sits at float32's noise moves by a noise-driven part
    // of its step, on any two float32 implementations)
    for (const char *dev : {"cpu", "cuda"}) {
        int rc;
        std::string o = run("recipes/llama_train.yaml --set runtime.device=" + std::string(dev) + " --set vars.ckpt=" +
                                (t / (std::string("b-") + dev)) + " --set vars.out=" + (t / (std::string("t-") + dev)) +
                                " --set vars.steps=2 --set vars.metrics=" + (t / (std::string("m-") + dev + ".jsonl")),
                            &rc);
        ASSERT_EQ(rc, 0) << o;
    }
    Ckpt a(t / "t-cpu"), b(t / "t-cuda");
    ASSERT_TRUE(a.r && b.r);
    const double steps_lr = 5e-4 + 1e-3;
    auto tol = [&](const std::string &name, double max_abs) {
        return name.rfind("optimizer.", 0) == 0 ? 1e-5 * max_abs : 1e-2 * steps_lr;
    };
    printf("[ GpuBagelBootstrap ] trained checkpoints, largest difference GPU against CPU: %.3g of max |x|\n",
           expect_close_tensors(b.r, a.r, tol));
    std::vector<double> lc = train_test::column(t / "m-cpu.jsonl", "loss"), lg = train_test::column(t / "m-cuda.jsonl", "loss");
    ASSERT_FALSE(lc.empty());  // the recipe logs every 5 steps and the last
    ASSERT_EQ(lg.size(), lc.size());
    for (size_t k = 0; k < lc.size(); k++) EXPECT_NEAR(lg[k], lc[k], 1e-6 * lc[k]) << "step " << k + 1;
}

TEST(StageDevice, GpuTransformVerifyExportOffloadAndAsyncSaveEqualCpu) {
    NEED_GPU();
    Dir t;
    write_file(t / "r.yaml",
               "model: {preset: tiny}\nvars: {out: x}\nstages:\n"
               "  - {id: i, uses: init-meta, with: {seed: 1}}\n"
               "  - id: x\n    uses: transform\n    with:\n      ops:\n"
               "        - copy: {from: \"layers.0.feed_forward.*.weight\", to: \"layers.1.feed_forward.*.weight\"}\n"
               "        - copy: {from: output.weight, to: tok_embeddings.weight}\n"
               "        - scale: {keys: \"layers.*.attention.wq.weight\", by: 0.5}\n"
               "        - fill: {keys: norm.weight, value: 2.0}\n"
               "        - cast: {keys: \"layers.1.attention.wk.weight\", dtype: bf16}\n"
               "        - load: {path: " + tiny("model_step5.safetensors") + ", keys: \"layers.0.attention.wv.weight\"}\n"
               "  - {id: v, uses: verify, with: {against: " + tiny("model_step5.safetensors") + ", atol: 1e9}}\n"
               "  - {id: e, uses: save-safetensors, with: {path: \"${out}/hf.safetensors\", names: hf, dtype: bf16}}\n"
               "  - {id: a, uses: save-dcp, with: {path: \"${out}/async\", async: true}}\n"
               "  - {id: o, uses: offload, with: {params: true}}\n"
               "  - {id: s, uses: save-dcp, with: {path: \"${out}/sync\"}}\n"
               "  - {id: v2, uses: verify, with: {against: \"${out}/sync\"}}\n");
    run_both(t / "r.yaml", t / "x", " --report " + (t / "rep.json"));
    EXPECT_EQ(report_metric(t / "rep.json", "o", "device"), "cuda");
    EXPECT_TRUE(read_file(t / "x-cpu/hf.safetensors") == read_file(t / "x-cuda/hf.safetensors"));
    expect_same_dcp(t / "x-cpu/async", t / "x-cuda/async");
    expect_same_dcp(t / "x-cpu/sync", t / "x-cuda/sync");
    expect_same_dcp(t / "x-cuda/async", t / "x-cuda/sync");
    // the transform did what it says on the device too
    Ckpt c(t / "x-cuda/sync"), st(tiny("model_step5.safetensors"));
    EXPECT_TRUE(tensor_bytes(c.r, "tok_embeddings.weight") == tensor_bytes(c.r, "output.weight"));
    EXPECT_TRUE(tensor_bytes(c.r, "layers.0.attention.wv.weight") == tensor_bytes(st.r, "layers.0.attention.wv.weight"));
    auto n = tensor_bytes(c.r, "norm.weight", FSDP_DT_F32);
    for (size_t k = 0; k < n.size() / 4; k++) {
        float x;
        memcpy(&x, n.data() + 4 * k, 4);
        ASSERT_EQ(x, 2.0f);
    }
}
