// Staged checkpoint transfers (ckpt/ckpt_pipe.h) run on the CPU with the host sink: the upload and
// download rings overlap (a buffer is refilled only after its transfer completed, the next chunk is
// read or downloaded while one is in flight), deliver every byte once at the right offset, and the
// staged load and save of a state whose arrays are "device" arrays give exactly what the host paths
// give: the same values, byte counts and error messages, byte-identical data files.
#include <gtest/gtest.h>

#include "state_fixture.h"
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

extern "C" {
#include "ckpt/ckpt_pipe.h"
#include "ckpt/state_io.h"
#include "runtime/comm.h"
#include "runtime/state.h"
}

using namespace fsdp_test;

namespace {

fsdp_state *make_state(int rank, int world, bool fill, bool opt) {
    const std::vector<StateParamSpec> specs = {
        {"a.weight", 2, {96, 256}, 0}, {"b.weight", 2, {7, 5}, 0}, {"norm.weight", 1, {1000, 0}, -1}};
    return make_spec_state(rank, world, specs, StateValues{0.013, 2.5, 1e-5, 2.0, 5}, fill, opt);
}

// Host arrays become "device" arrays (the same memory in the device slots): the staged paths must
// then go through the sink for them.
void to_fake_device(fsdp_state *s) {
    for (size_t i = 0; i < s->n; i++)
        for (int a = 0; a < STATE_ARRAYS; a++) {
            float **h = state_param_host_slot(&s->p[i], (state_array)a), **d = state_param_dev_slot(&s->p[i], (state_array)a);
            if (*h) {
                *d = *h;
                *h = NULL;
            }
        }
}

void free_fake(fsdp_state *s) {
    for (size_t i = 0; i < s->n; i++)
        for (int a = 0; a < STATE_ARRAYS; a++) {
            float **h = state_param_host_slot(&s->p[i], (state_array)a), **d = state_param_dev_slot(&s->p[i], (state_array)a);
            if (*d) {
                *h = *d;
                *d = NULL;
            }
        }
    state_free(s);
}

std::vector<float> pattern(size_t n, float base) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = base + (float)i * 0.5f;
    return v;
}

// Every completed transfer in direction dir covers [lo, lo+bytes) exactly once and nothing else.
void expect_once(const ckpt_host_sink &hs, ckpt_dir dir, const void *lo, size_t bytes) {
    std::vector<std::pair<uintptr_t, size_t>> r;
    for (size_t i = 0; i < hs.n_log; i++)
        if (hs.log[i].op == CKPT_OP_COMPLETE && hs.log[i].dir == dir) {
            uintptr_t a = (uintptr_t)hs.log[i].dev;
            if (a + hs.log[i].bytes > (uintptr_t)lo && a < (uintptr_t)lo + bytes) r.push_back({a, hs.log[i].bytes});
        }
    std::sort(r.begin(), r.end());
    uintptr_t at = (uintptr_t)lo;
    for (auto &x : r) {
        ASSERT_EQ(x.first, at) << "gap or overlap in the delivered ranges";
        at += x.second;
    }
    EXPECT_EQ(at, (uintptr_t)lo + bytes);
}

}  // namespace

TEST(CkptPipe, UploadRingOverlapsAndDeliversEveryByteOnce) {
    for (int nb : {2, 3}) {
        fsdp_err err;
        ckpt_host_sink hs;
        ASSERT_EQ(ckpt_host_sink_init(&hs, nb, 1000, 1, &err), 0) << err.msg;
        std::vector<float> src = pattern(2345, 1.0f), dst(2345, -1.0f);
        ckpt_up u;
        ckpt_up_init(&u, &hs.sink);
        ASSERT_EQ(ckpt_up_host(&u, dst.data(), src.data(), src.size(), NULL, NULL, &err), 0) << err.msg;
        ASSERT_EQ(ckpt_up_finish(&u, &err), 0) << err.msg;
        EXPECT_EQ(dst, src);
        EXPECT_EQ(hs.violations, 0);
        EXPECT_EQ(hs.bytes_to_dev, src.size() * 4);
        EXPECT_EQ(hs.max_in_flight, nb);
        expect_once(hs, CKPT_TO_DEV, dst.data(), dst.size() * 4);
        // chunk k+1's buffer is handed out (and filled) before chunk k's upload completes, and a
        // buffer is handed out again only after its own last upload completed
        std::vector<size_t> acq, done;
        std::map<int, int> pending;
        for (size_t i = 0; i < hs.n_log; i++) {
            const ckpt_host_event &e = hs.log[i];
            if (e.op == CKPT_OP_ACQUIRE) {
                EXPECT_EQ(pending[e.slot], 0) << "buffer " << e.slot << " handed out while in flight";
                acq.push_back(i);
            } else if (e.op == CKPT_OP_SUBMIT) {
                pending[e.slot]++;
            } else {
                pending[e.slot]--;
                done.push_back(i);
            }
        }
        size_t chunks = (src.size() * 4 + 999) / 1000;
        ASSERT_EQ(acq.size(), chunks);
        ASSERT_EQ(done.size(), chunks);
        for (size_t k = 0; k + 1 < chunks; k++) EXPECT_LT(acq[k + 1], done[k]) << "chunk " << k;
        ckpt_host_sink_free(&hs);
    }
}

TEST(CkptPipe, HostSinkCatchesABufferReusedBeforeItsUploadCompleted) {
    fsdp_err err;
    ckpt_host_sink hs;
    ASSERT_EQ(ckpt_host_sink_init(&hs, 2, 16, 1, &err), 0) << err.msg;
    float dst[4] = {0, 0, 0, 0};
    void *buf;
    ASSERT_EQ(hs.sink.ops->acquire(hs.sink.self, 0, &buf, &err), 0);
    const float ones[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    memcpy(buf, ones, 16);
    ASSERT_EQ(hs.sink.ops->submit(hs.sink.self, 0, CKPT_TO_DEV, dst, 16, &err), 0);
    // a pipeline that overwrote the buffer now would deliver the new bytes: the late completion shows it
    memset(buf, 0x41, 16);
    // and a second submission from the busy buffer is refused
    EXPECT_NE(hs.sink.ops->submit(hs.sink.self, 0, CKPT_TO_DEV, dst, 16, &err), 0);
    EXPECT_EQ(hs.violations, 1);
    ASSERT_EQ(hs.sink.ops->drain(hs.sink.self, &err), 0);
    EXPECT_NE(dst[0], 1.0f);
    EXPECT_EQ(hs.violations, 2); // and the change in flight is counted
    ckpt_host_sink_free(&hs);
    // too few buffers, odd sizes
    EXPECT_NE(ckpt_host_sink_init(&hs, 1, 16, 0, &err), 0);
    EXPECT_NE(ckpt_host_sink_init(&hs, 2, 18, 0, &err), 0);
}

TEST(CkptPipe, DownloadRingPrefetchesAheadAndKeepsOrder) {
    fsdp_err err;
    ckpt_host_sink hs;
    ASSERT_EQ(ckpt_host_sink_init(&hs, 3, 400, 1, &err), 0) << err.msg;
    std::vector<float> a = pattern(1000, 3.0f), b = pattern(7, -9.0f), c = pattern(333, 100.0f);
    ckpt_down d;
    ckpt_down_init(&d, &hs.sink);
    ASSERT_EQ(ckpt_down_add(&d, a.data(), a.size() * 4, &err), 0);
    ASSERT_EQ(ckpt_down_add(&d, b.data(), b.size() * 4, &err), 0);
    ASSERT_EQ(ckpt_down_add(&d, c.data(), c.size() * 4, &err), 0);
    std::vector<float> got;
    for (size_t k = 0; k < d.n; k++) {
        void *buf;
        size_t bytes;
        ASSERT_EQ(ckpt_down_next(&d, &buf, &bytes, &err), 0) << err.msg;
        // while chunk k is consumed, the next n_bufs-1 chunks are already under way
        EXPECT_EQ(d.submitted, std::min(d.n, k + 3)) << k;
        got.insert(got.end(), (float *)buf, (float *)buf + bytes / 4);
    }
    void *buf;
    size_t bytes;
    EXPECT_NE(ckpt_down_next(&d, &buf, &bytes, &err), 0); // nothing left
    ASSERT_EQ(ckpt_down_finish(&d, &err), 0);
    std::vector<float> want = a;
    want.insert(want.end(), b.begin(), b.end());
    want.insert(want.end(), c.begin(), c.end());
    EXPECT_EQ(got, want);
    EXPECT_EQ(hs.violations, 0);
    EXPECT_EQ(hs.max_in_flight, 3);
    ckpt_down_free(&d);
    ckpt_host_sink_free(&hs);
}

namespace {
struct Saved {
    std::string dir, ck;
    comm *c = nullptr;
    fsdp_state *src = nullptr;
    Saved(bool opt) {
        dir = make_tmpdir("fsdp-pipe");
        ck = dir + "/ck";
        fsdp_err err;
        EXPECT_EQ(comm_create_single(&c, &err), 0);
        src = make_state(0, 1, true, opt);
        sio_save_opts so = {};
        so.optimizer = opt ? 1 : 0;
        so.overwrite = 0;
        EXPECT_EQ(sio_save(src, c, ck.c_str(), &so, &err), 0) << err.msg;
    }
    ~Saved() {
        state_free(src);
        comm_destroy(c);
        rm_rf(dir);
    }
};

sio_load_opts strict_opts() {
    sio_load_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.strict = 1;
    lo.load_optimizer = -1;
    return lo;
}

void expect_same_arrays(const fsdp_state *host, const fsdp_state *dev, const char *what) {
    for (size_t i = 0; i < host->n; i++)
        for (int a = 0; a < STATE_ARRAYS; a++) {
            float *h = *state_param_host_slot((state_param *)&host->p[i], (state_array)a);
            float *d = *state_param_dev_slot((state_param *)&dev->p[i], (state_array)a);
            ASSERT_EQ(h == NULL, d == NULL) << host->p[i].name << " " << a;
            if (h) {
                EXPECT_EQ(0, memcmp(h, d, state_param_local_numel(&host->p[i]) * 4)) << what << " " << host->p[i].name;
            }
        }
}
}  // namespace

TEST(CkptPipe, StagedLoadEqualsTheHostLoadAtEveryShardingAndBufferSize) {
    Saved sv(true);
    fsdp_err err;
    // 64 KiB buffers: several rows a chunk; 600 bytes: rows of a.weight (1 KiB) exceed a buffer
    for (size_t buf : {(size_t)65536, (size_t)600})
        for (int round = 0; round < 2; round++)
            for (int r = 0; r < 3; r++) {
                fsdp_state *h = make_state(r, 3, false, true), *d = make_state(r, 3, false, true);
                to_fake_device(d);
                sio_load_opts lo = strict_opts();
                lo.round_bf16 = round;
                sio_load_result rh, rd;
                ASSERT_EQ(sio_load(h, sv.ck.c_str(), &lo, &rh, &err), 0) << err.msg;
                ckpt_host_sink hs;
                ASSERT_EQ(ckpt_host_sink_init(&hs, 2, buf, 1, &err), 0);
                lo.sink = &hs.sink;
                ASSERT_EQ(sio_load(d, sv.ck.c_str(), &lo, &rd, &err), 0) << err.msg;
                EXPECT_EQ(hs.violations, 0);
                EXPECT_EQ(rh.bytes_read, rd.bytes_read);
                EXPECT_EQ(rh.params_loaded, rd.params_loaded);
                EXPECT_EQ(rh.optimizer_loaded, rd.optimizer_loaded);
                EXPECT_EQ(h->opt_step, d->opt_step);
                expect_same_arrays(h, d, "staged load");
                for (size_t i = 0; i < d->n; i++) {
                    EXPECT_EQ(h->p[i].dtype, d->p[i].dtype);
                    if (round) {
                        EXPECT_EQ(d->p[i].dtype, FSDP_DT_BF16);
                    }
                }
                // every byte of every device array arrived once, and only through the sink
                size_t total = 0;
                for (size_t i = 0; i < d->n; i++) {
                    size_t n = state_param_local_numel(&d->p[i]) * 4;
                    total += 3 * n;
                    for (float *arr : {d->p[i].d_data, d->p[i].d_exp_avg, d->p[i].d_exp_avg_sq}) expect_once(hs, CKPT_TO_DEV, arr, n);
                }
                EXPECT_EQ(hs.bytes_to_dev, total);
                ckpt_host_sink_free(&hs);
                state_free(h);
                free_fake(d);
            }
}

TEST(CkptPipe, StagedLoadFailsLikeTheHostLoadAndClaimsNothingPartial) {
    Saved sv(false);
    fsdp_err err;
    // break the last item's archive (norm.weight, read after the others): its end record
    std::string data = read_file(sv.ck + "/__0_0.distcp");
    size_t eocd = data.rfind(std::string("PK\x05\x06", 4));
    ASSERT_NE(eocd, std::string::npos);
    data[eocd + 2] = 'X';
    write_file(sv.ck + "/__0_0.distcp", data);
    fsdp_state *h = make_state(0, 1, false, false), *d = make_state(0, 1, false, false);
    for (size_t i = 0; i < d->n; i++) std::fill(d->p[i].data, d->p[i].data + state_param_local_numel(&d->p[i]), 7.0f);
    to_fake_device(d);
    sio_load_opts lo = strict_opts();
    sio_load_result rh, rd;
    fsdp_err eh, ed;
    int rch = sio_load(h, sv.ck.c_str(), &lo, &rh, &eh);
    ckpt_host_sink hs;
    ASSERT_EQ(ckpt_host_sink_init(&hs, 2, 4096, 1, &err), 0);
    lo.sink = &hs.sink;
    int rcd = sio_load(d, sv.ck.c_str(), &lo, &rd, &ed);
    ASSERT_NE(rch, 0);
    EXPECT_EQ(rch, rcd);
    EXPECT_STREQ(eh.msg, ed.msg);
    EXPECT_NE(std::string(ed.msg).find("__0_0.distcp"), std::string::npos) << ed.msg;
    EXPECT_EQ(rh.params_loaded, rd.params_loaded);
    EXPECT_EQ(rd.params_loaded, 2u);
    EXPECT_EQ(hs.violations, 0);
    // nothing left in flight, and every parameter not loaded is NaN throughout (no stale rows)
    for (int i = 0; i < hs.sink.n_bufs; i++) EXPECT_EQ(hs.pend[i].busy, 0);
    size_t nan_params = 0;
    for (size_t i = 0; i < d->n; i++) {
        size_t n = state_param_local_numel(&d->p[i]), nans = 0;
        for (size_t k = 0; k < n; k++) nans += std::isnan(d->p[i].d_data[k]);
        EXPECT_TRUE(nans == 0 || nans == n) << d->p[i].name << ": " << nans << " of " << n;
        nan_params += nans == n;
        EXPECT_EQ(nans == n, (bool)std::isnan(h->p[i].data[0])) << d->p[i].name;
    }
    EXPECT_GE(nan_params, 1u);
    EXPECT_EQ(nan_params + rd.params_loaded, d->n);
    ckpt_host_sink_free(&hs);
    state_free(h);
    free_fake(d);
}

TEST(CkptPipe, StagedLoadReportsShapesMissingKeysNaNAndSinkFailuresLikeTheHostLoad) {
    Saved sv(false);
    fsdp_err err;
    // a wrong shape and a parameter the checkpoint lacks
    auto build = [](bool fake) {
        fsdp_state *s = (fsdp_state *)calloc(1, sizeof *s);
        s->layout = STATE_SHARDED;
        s->world = 1;
        fsdp_err e;
        int64_t a[2] = {96, 255}, b[2] = {7, 5}, v[1] = {1000}, x[1] = {12};
        state_add_param(s, "a.weight", 2, a, 0, &e);
        state_add_param(s, "b.weight", 2, b, 0, &e);
        state_add_param(s, "norm.weight", 1, v, -1, &e);
        state_add_param(s, "extra.weight", 1, x, -1, &e);
        if (fake) to_fake_device(s);
        return s;
    };
    fsdp_state *h = build(false), *d = build(true);
    sio_load_opts lo = strict_opts();
    sio_load_result rh, rd;
    fsdp_err eh, ed;
    int rch = sio_load(h, sv.ck.c_str(), &lo, &rh, &eh);
    ckpt_host_sink hs;
    ASSERT_EQ(ckpt_host_sink_init(&hs, 3, 512, 0, &err), 0);
    lo.sink = &hs.sink;
    int rcd = sio_load(d, sv.ck.c_str(), &lo, &rd, &ed);
    ASSERT_NE(rch, 0);
    EXPECT_EQ(rch, rcd);
    EXPECT_STREQ(eh.msg, ed.msg);
    EXPECT_NE(std::string(ed.msg).find("extra.weight not restored"), std::string::npos) << ed.msg;
    EXPECT_NE(std::string(ed.msg).find("a.weight has shape"), std::string::npos) << ed.msg;
    for (size_t i = 0; i < d->n; i++)
        EXPECT_EQ(0, memcmp(h->p[i].data, d->p[i].d_data, state_param_local_numel(&d->p[i]) * 4)) << d->p[i].name;
    ckpt_host_sink_free(&hs);
    state_free(h);
    free_fake(d);
    // a NaN in the checkpoint, seen in the staged chunks
    sv.src->p[2].data[700] = NAN;
    sio_save_opts so = {};
    so.optimizer = 0;
    so.overwrite = 1;
    ASSERT_EQ(sio_save(sv.src, sv.c, sv.ck.c_str(), &so, &err), 0) << err.msg;
    d = make_state(0, 1, false, false);
    to_fake_device(d);
    ASSERT_EQ(ckpt_host_sink_init(&hs, 2, 256, 0, &err), 0);
    lo.sink = &hs.sink;
    EXPECT_NE(sio_load(d, sv.ck.c_str(), &lo, &rd, &ed), 0);
    EXPECT_NE(std::string(ed.msg).find("norm.weight holds NaN"), std::string::npos) << ed.msg;
    // a transfer that fails midway fails the load
    ckpt_host_sink_free(&hs);
    ASSERT_EQ(ckpt_host_sink_init(&hs, 2, 256, 0, &err), 0);
    hs.fail_submit_at = 5;
    lo.sink = &hs.sink;
    EXPECT_NE(sio_load(d, sv.ck.c_str(), &lo, &rd, &ed), 0);
    EXPECT_NE(std::string(ed.msg).find("injected"), std::string::npos) << ed.msg;
    ckpt_host_sink_free(&hs);
    free_fake(d);
}

TEST(CkptPipe, StagedSaveWritesTheHostSaversBytes) {
    std::string t = make_tmpdir("fsdp-pipe");
    fsdp_err err;
    comm *c;
    ASSERT_EQ(comm_create_single(&c, &err), 0);
    for (int world : {1, 3})
        for (int r = 0; r < world; r++) {
            fsdp_state *h = make_state(r, world, true, true), *d = make_state(r, world, true, true);
            h->p[1].dtype = d->p[1].dtype = FSDP_DT_BF16; // converted chunk by chunk
            to_fake_device(d);
            std::string a = t + "/host", b = t + "/staged", e = t + "/async";
            sio_save_opts so = {};
            so.optimizer = 1;
            so.overwrite = 1;
            ASSERT_EQ(sio_save(h, c, a.c_str(), &so, &err), 0) << err.msg;
            ckpt_host_sink hs;
            ASSERT_EQ(ckpt_host_sink_init(&hs, 3, 1000, 1, &err), 0);
            ASSERT_EQ(sio_save_staged(d, c, b.c_str(), &so, &hs.sink, &err), 0) << err.msg;
            EXPECT_EQ(hs.violations, 0);
            size_t total = 0;
            for (size_t i = 0; i < d->n; i++) {
                size_t n = state_param_local_numel(&d->p[i]) * 4;
                total += 3 * n;
                for (float *arr : {d->p[i].d_data, d->p[i].d_exp_avg, d->p[i].d_exp_avg_sq}) expect_once(hs, CKPT_FROM_DEV, arr, n);
            }
            EXPECT_EQ(hs.bytes_from_dev, total);
            ckpt_host_sink_free(&hs);
            EXPECT_TRUE(dcp_data_blanked(a + "/__0_0.distcp") == dcp_data_blanked(b + "/__0_0.distcp")) << "world " << world << " rank " << r;
            // async: every download has completed when begin returns; later changes do not reach the file
            ASSERT_EQ(ckpt_host_sink_init(&hs, 2, 4096, 0, &err), 0);
            sio_async *as;
            ASSERT_EQ(sio_save_begin_staged(d, c, e.c_str(), &so, &hs.sink, &as, &err), 0) << err.msg;
            EXPECT_EQ(hs.bytes_from_dev, total);
            for (int i = 0; i < hs.sink.n_bufs; i++) EXPECT_EQ(hs.pend[i].busy, 0);
            for (size_t i = 0; i < d->n; i++) d->p[i].d_data[0] = 1234.5f;
            ASSERT_EQ(sio_save_finish(as, &err), 0) << err.msg;
            sio_async_free(as);
            ckpt_host_sink_free(&hs);
            EXPECT_TRUE(dcp_data_blanked(a + "/__0_0.distcp") == dcp_data_blanked(e + "/__0_0.distcp")) << "async, world " << world;
            // without a sink a device state cannot be saved; a failing transfer leaves no checkpoint
            std::string f = t + "/failed";
            EXPECT_NE(sio_save(d, c, f.c_str(), &so, &err), 0);
            EXPECT_NE(std::string(err.msg).find("no staging sink"), std::string::npos) << err.msg;
            ASSERT_EQ(ckpt_host_sink_init(&hs, 2, 4096, 0, &err), 0);
            hs.fail_submit_at = 3;
            EXPECT_NE(sio_save_staged(d, c, f.c_str(), &so, &hs.sink, &err), 0);
            EXPECT_NE(std::string(err.msg).find("injected"), std::string::npos) << err.msg;
            EXPECT_TRUE(read_file(f + "/.metadata").empty());
            ckpt_host_sink_free(&hs);
            ASSERT_EQ(ckpt_host_sink_init(&hs, 2, 4096, 0, &err), 0);
            hs.fail_submit_at = 2;
            EXPECT_NE(sio_save_begin_staged(d, c, f.c_str(), &so, &hs.sink, &as, &err), 0);
            EXPECT_NE(std::string(err.msg).find("injected"), std::string::npos) << err.msg;
            ckpt_host_sink_free(&hs);
            state_free(h);
            free_fake(d);
            rm_rf(a);
            rm_rf(b);
            rm_rf(e);
            rm_rf(f);
        }
    comm_destroy(c);
    rm_rf(t);
}
