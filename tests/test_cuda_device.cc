// Device runtime pieces that run without a GPU: the caching allocator (on a malloc backend), the
// local-rank lookup, argument checks of the CUDA entry points, and the clear error a build without
// CUDA, or a CUDA build on a machine without a GPU, gives instead of crashing.
#include <gtest/gtest.h>

#include "gpu_util.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/kcu.h"
#include "runtime/device.h"
#include "runtime/device_cache.h"
#include "runtime/device_gemm.h"

using fsdp_test::gpu_count;
using fsdp_test::gpu_present;

namespace {

// ---- the caching allocator on a malloc backend --------------------------------------------------

struct Mock {
    size_t capacity = SIZE_MAX; // bytes the backend may hand out at once
    size_t used = 0;
    int allocs = 0, releases = 0, fence_releases = 0;
    std::map<void *, size_t> live;
    std::set<void *> ready; // fences that have completed
};

int mock_alloc(void *u, size_t bytes, void **ptr, fsdp_err *err) {
    Mock *m = static_cast<Mock *>(u);
    if (bytes > m->capacity - m->used) return fsdp_err_set(err, FSDP_E_NOMEM, "mock backend out of memory");
    *ptr = malloc(bytes);
    if (!*ptr) return fsdp_err_set(err, FSDP_E_NOMEM, "malloc failed");
    m->used += bytes;
    m->live[*ptr] = bytes;
    m->allocs++;
    return FSDP_OK;
}

void mock_release(void *u, void *p) {
    Mock *m = static_cast<Mock *>(u);
    m->used -= m->live.at(p);
    m->live.erase(p);
    m->releases++;
    free(p);
}

int mock_fence_ready(void *u, void *f) { return static_cast<Mock *>(u)->ready.count(f) ? 1 : 0; }
void mock_fence_release(void *u, void *) { static_cast<Mock *>(u)->fence_releases++; }

dev_cache *make_cache(Mock *m, bool fences = true) {
    dev_cache_backend be;
    memset(&be, 0, sizeof be);
    be.user = m;
    be.what = "mock";
    be.alloc = mock_alloc;
    be.release = mock_release;
    if (fences) {
        be.fence_ready = mock_fence_ready;
        be.fence_release = mock_fence_release;
    }
    fsdp_err err;
    dev_cache *c = dev_cache_create(&be, &err);
    EXPECT_NE(c, nullptr) << err.msg;
    return c;
}

TEST(CudaCache, SizeClasses) {
    EXPECT_EQ(dev_cache_class_size(0), 512u);
    EXPECT_EQ(dev_cache_class_size(1), 512u);
    EXPECT_EQ(dev_cache_class_size(512), 512u);
    EXPECT_EQ(dev_cache_class_size(513), 576u);   // 512 + 512/8
    EXPECT_EQ(dev_cache_class_size(1024), 1024u);
    EXPECT_EQ(dev_cache_class_size(1025), 1152u); // 1024 + 1024/8
    EXPECT_EQ(dev_cache_class_size(3000), 3072u);
    EXPECT_EQ(dev_cache_class_size(((size_t)1 << 40) + 1), ((size_t)1 << 40) + ((size_t)1 << 37));
    EXPECT_EQ(dev_cache_class_size(SIZE_MAX), 0u);
    std::mt19937_64 g(7);
    for (int i = 0; i < 10000; i++) {
        size_t n = (size_t)(g() >> (g() % 50 + 14));
        size_t c = dev_cache_class_size(n);
        ASSERT_GE(c, n);
        ASSERT_LE(c, std::max<size_t>(512, n + n / 8 + 1)) << n; // at most 12.5% over the request
        ASSERT_EQ(dev_cache_class_size(c), c);                   // a class size is its own class
    }
}

TEST(CudaCache, StepLoopStopsCallingTheBackendAfterWarmUp) {
    Mock m;
    dev_cache *c = make_cache(&m);
    const size_t sizes[] = {100, 5000, 5000, 70000, 1 << 20, 777, 5000};
    fsdp_err err;
    dev_mem_stats st;
    int allocs_after_warmup = -1;
    for (int step = 0; step < 5; step++) {
        std::vector<void *> ptrs;
        for (size_t s : sizes) {
            void *p = nullptr;
            ASSERT_EQ(dev_cache_alloc(c, s, &p, &err), 0) << err.msg;
            memset(p, 0xab, s); // the block really has the bytes asked for
            ptrs.push_back(p);
        }
        dev_cache_stats(c, &st);
        size_t want = 0, req = 0;
        for (size_t s : sizes) {
            want += dev_cache_class_size(s);
            req += s;
        }
        EXPECT_EQ(st.in_use, want);
        EXPECT_EQ(st.requested_in_use, req);
        EXPECT_EQ(st.peak_in_use, want);
        for (void *p : ptrs) ASSERT_EQ(dev_cache_release(c, p, nullptr, &err), 0) << err.msg;
        if (step == 0) allocs_after_warmup = m.allocs;
    }
    dev_cache_stats(c, &st);
    EXPECT_EQ(m.allocs, allocs_after_warmup);
    EXPECT_EQ(allocs_after_warmup, 7);
    EXPECT_EQ(st.backend_allocs, 7u);
    EXPECT_EQ(st.cache_hits, 4u * 7u);
    EXPECT_EQ(st.allocs, 5u * 7u);
    EXPECT_EQ(st.in_use, 0u);
    EXPECT_EQ(st.cached, st.reserved);
    EXPECT_EQ(st.reserved, m.used);
    dev_cache_trim(c);
    dev_cache_stats(c, &st);
    EXPECT_EQ(st.reserved, 0u);
    EXPECT_EQ(m.used, 0u);
    EXPECT_EQ(st.backend_frees, 7u);
    dev_cache_free(c);
}

TEST(CudaCache, BadFreesAreErrors) {
    Mock m;
    dev_cache *c = make_cache(&m);
    fsdp_err err;
    void *p = nullptr;
    ASSERT_EQ(dev_cache_alloc(c, 64, &p, &err), 0);
    int x = 0;
    EXPECT_EQ(dev_cache_release(c, &x, nullptr, &err), FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "not allocated by this cache"), nullptr) << err.msg;
    EXPECT_EQ(dev_cache_release(c, p, nullptr, &err), 0);
    EXPECT_EQ(dev_cache_release(c, p, nullptr, &err), FSDP_E_INVALID); // double free
    EXPECT_EQ(dev_cache_release(c, nullptr, nullptr, &err), 0);
    dev_cache_free(c);
    EXPECT_EQ(m.used, 0u);

    Mock m2;
    dev_cache *nf = make_cache(&m2, false);
    ASSERT_EQ(dev_cache_alloc(nf, 64, &p, &err), 0);
    EXPECT_EQ(dev_cache_release(nf, p, (void *)1, &err), FSDP_E_INVALID); // no fence support
    dev_cache_free(nf);                                                     // frees the live block too
    EXPECT_EQ(m2.used, 0u);

    dev_cache_backend be;
    memset(&be, 0, sizeof be);
    be.alloc = mock_alloc;
    EXPECT_EQ(dev_cache_create(&be, &err), nullptr);
    EXPECT_EQ(err.code, FSDP_E_INVALID);
}

TEST(CudaCache, FencedBlocksWaitForTheirFence) {
    Mock m;
    dev_cache *c = make_cache(&m);
    fsdp_err err;
    void *a = nullptr, *b = nullptr, *a2 = nullptr;
    void *fence = (void *)0x10;
    ASSERT_EQ(dev_cache_alloc(c, 4096, &a, &err), 0);
    ASSERT_EQ(dev_cache_release(c, a, fence, &err), 0);
    dev_mem_stats st;
    dev_cache_stats(c, &st);
    EXPECT_EQ(st.in_use, 0u);
    EXPECT_EQ(st.cached, 0u); // pending, not reusable
    ASSERT_EQ(dev_cache_alloc(c, 4096, &b, &err), 0);
    EXPECT_NE(a, b);
    EXPECT_EQ(m.allocs, 2);
    m.ready.insert(fence);
    ASSERT_EQ(dev_cache_alloc(c, 4096, &a2, &err), 0);
    EXPECT_EQ(a2, a); // reused once the fence completed
    EXPECT_EQ(m.allocs, 2);
    EXPECT_EQ(m.fence_releases, 1);
    ASSERT_EQ(dev_cache_release(c, b, (void *)0x20, &err), 0);
    dev_cache_free(c); // a pending block is given back, its fence released
    EXPECT_EQ(m.fence_releases, 2);
    EXPECT_EQ(m.used, 0u);
}

TEST(CudaCache, OutOfMemoryTrimsTheCacheAndRetries) {
    Mock m;
    m.capacity = 4096;
    dev_cache *c = make_cache(&m);
    fsdp_err err;
    void *a = nullptr, *b = nullptr, *x = nullptr;
    ASSERT_EQ(dev_cache_alloc(c, 2048, &a, &err), 0);
    ASSERT_EQ(dev_cache_release(c, a, nullptr, &err), 0); // cached: 2048 of 4096 reserved
    ASSERT_EQ(dev_cache_alloc(c, 3000, &b, &err), 0) << err.msg; // 3072 fits only after the trim
    EXPECT_EQ(m.releases, 1);
    EXPECT_EQ(dev_cache_alloc(c, 3000, &x, &err), FSDP_E_NOMEM);
    EXPECT_EQ(x, nullptr);
    EXPECT_NE(strstr(err.msg, "cannot allocate 3072 bytes"), nullptr) << err.msg;
    EXPECT_NE(strstr(err.msg, "mock backend out of memory"), nullptr) << err.msg;
    dev_mem_stats st;
    dev_cache_stats(c, &st);
    EXPECT_EQ(st.in_use, 3072u);
    dev_cache_free(c);
    EXPECT_EQ(m.used, 0u);
}

TEST(CudaCache, ManyLiveBlocksInAnyOrder) {
    Mock m;
    dev_cache *c = make_cache(&m);
    fsdp_err err;
    std::mt19937 g(3);
    std::vector<std::pair<void *, size_t>> live;
    std::set<void *> seen;
    size_t peak = 0, in_use = 0;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 2000; i++) {
            size_t n = 1 + g() % 20000;
            void *p = nullptr;
            ASSERT_EQ(dev_cache_alloc(c, n, &p, &err), 0);
            ASSERT_TRUE(std::none_of(live.begin(), live.end(), [&](auto &e) { return e.first == p; }));
            live.push_back({p, n});
            in_use += dev_cache_class_size(n);
            peak = std::max(peak, in_use);
        }
        std::shuffle(live.begin(), live.end(), g);
        size_t keep = live.size() / 3;
        while (live.size() > keep) {
            ASSERT_EQ(dev_cache_release(c, live.back().first, nullptr, &err), 0) << err.msg;
            in_use -= dev_cache_class_size(live.back().second);
            live.pop_back();
        }
    }
    dev_mem_stats st;
    dev_cache_stats(c, &st);
    EXPECT_EQ(st.in_use, in_use);
    EXPECT_EQ(st.peak_in_use, peak);
    dev_cache_reset_peak(c);
    dev_cache_stats(c, &st);
    EXPECT_EQ(st.peak_in_use, in_use);
    for (auto &e : live) ASSERT_EQ(dev_cache_release(c, e.first, nullptr, &err), 0);
    dev_cache_stats(c, &st);
    EXPECT_EQ(st.in_use, 0u);
    EXPECT_EQ(st.requested_in_use, 0u);
    dev_cache_free(c);
    EXPECT_EQ(m.used, 0u);
    EXPECT_TRUE(m.live.empty());
}

// ---- local rank ----------------------------------------------------------------------------------------

class EnvGuard {
public:
    explicit EnvGuard(std::vector<std::string> names) : names_(std::move(names)) {
        for (auto &n : names_) {
            const char *v = getenv(n.c_str());
            saved_.push_back(v ? std::make_pair(true, std::string(v)) : std::make_pair(false, std::string()));
            unsetenv(n.c_str());
        }
    }
    ~EnvGuard() {
        for (size_t i = 0; i < names_.size(); i++) {
            if (saved_[i].first)
                setenv(names_[i].c_str(), saved_[i].second.c_str(), 1);
            else
                unsetenv(names_[i].c_str());
        }
    }

private:
    std::vector<std::string> names_;
    std::vector<std::pair<bool, std::string>> saved_;
};

TEST(CudaDevice, LocalRankFromTheEnvironment) {
    EnvGuard guard({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"});
    fsdp_err err;
    int lr = 7;
    ASSERT_EQ(dev_env_local_rank(&lr, &err), 0);
    EXPECT_EQ(lr, -1);
    setenv("SLURM_LOCALID", "5", 1);
    ASSERT_EQ(dev_env_local_rank(&lr, &err), 0);
    EXPECT_EQ(lr, 5);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1); // Open MPI's comes before Slurm's
    ASSERT_EQ(dev_env_local_rank(&lr, &err), 0);
    EXPECT_EQ(lr, 2);
    setenv("LOCAL_RANK", "3", 1);
    ASSERT_EQ(dev_env_local_rank(&lr, &err), 0);
    EXPECT_EQ(lr, 3);
    setenv("LOCAL_RANK", "1x", 1);
    EXPECT_EQ(dev_env_local_rank(&lr, &err), FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "LOCAL_RANK=\"1x\""), nullptr) << err.msg;
    setenv("LOCAL_RANK", "-1", 1);
    EXPECT_EQ(dev_env_local_rank(&lr, &err), FSDP_E_INVALID);
}

// ---- without CUDA, or without a GPU ---------------------------------------------------------------------

TEST(CudaDevice, ContextWithAGpuElseAClearError) {
    fsdp_err err;
    fsdp_err_clear(&err);
    dev_options opt = {0, 0};
    dev_ctx *d = dev_ctx_create(&opt, &err);
    if (gpu_present()) {
        // with a device: the context, its count and its name
        ASSERT_NE(d, nullptr) << err.msg;
        int n = 0;
        EXPECT_EQ(dev_count(&n, &err), FSDP_OK) << err.msg;
        EXPECT_GT(n, 0);
        EXPECT_GT(strlen(dev_ctx_name(d)), 0u);
        dev_ctx_free(d);
        return;
    }
    EXPECT_EQ(d, nullptr);
    EXPECT_EQ(err.code, FSDP_E_DEVICE);
    int n = -1;
    EXPECT_EQ(dev_count(&n, &err), FSDP_E_DEVICE);
    EXPECT_EQ(n, 0);
    if (!dev_built_with_cuda()) {
        EXPECT_NE(strstr(err.msg, "built without CUDA"), nullptr) << err.msg;
        d = dev_ctx_create(nullptr, &err);
        EXPECT_NE(strstr(err.msg, "dev_ctx_create: fsdp-run was built without CUDA"), nullptr) << err.msg;
        // every entry point links and fails the same way
        EXPECT_EQ(kcu_cast(nullptr, FSDP_DT_BF16, nullptr, FSDP_DT_F32, 4, nullptr, &err), FSDP_E_DEVICE);
        EXPECT_NE(strstr(err.msg, "kcu_cast: fsdp-run was built without CUDA"), nullptr) << err.msg;
        EXPECT_EQ(kcu_attention_forward(FSDP_DT_F32, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, 1, 1, 8, nullptr,
                                        &err),
                  FSDP_E_DEVICE);
        kcu_tensor_list *l = (kcu_tensor_list *)&n;
        EXPECT_EQ(kcu_tensor_list_create(nullptr, 0, &l, &err), FSDP_E_DEVICE);
        EXPECT_EQ(l, nullptr);
        EXPECT_EQ(dev_gemm(nullptr, 0, 0, 1, 1, 1, 1.0f, FSDP_DT_F32, nullptr, 1, nullptr, 1, 0.0f, FSDP_DT_F32,
                           nullptr, 1, &err),
                  FSDP_E_DEVICE);
        EXPECT_NE(strstr(err.msg, "dev_gemm"), nullptr) << err.msg;
        void *p = &n;
        EXPECT_EQ(dev_alloc(nullptr, 16, &p, &err), FSDP_E_DEVICE);
        EXPECT_EQ(dev_sync(nullptr, &err), FSDP_E_DEVICE);
        dev_ctx_free(nullptr);
    } else {
        // CUDA runtime present, no usable device or driver: the CUDA error is in the message
        EXPECT_NE(strstr(err.msg, "CUDA device"), nullptr) << err.msg;
        d = dev_ctx_create(nullptr, &err);
        EXPECT_EQ(d, nullptr);
        EXPECT_EQ(err.code, FSDP_E_DEVICE);
        EXPECT_NE(strstr(err.msg, "CUDA device"), nullptr) << err.msg;
        // a kernel launch without a device is an error, not a crash
        EXPECT_EQ(kcu_scale(nullptr, 16, 2.0f, nullptr, &err), FSDP_E_DEVICE);
        EXPECT_NE(strstr(err.msg, "kcu_scale"), nullptr) << err.msg;
    }
}

// Argument checks come before any CUDA call, so they behave the same with and without a GPU.
TEST(CudaDevice, KernelArgumentChecks) {
    if (!dev_built_with_cuda()) GTEST_SKIP() << "built without CUDA (NoCudaOrNoGpuIsAClearError covers it)";
    fsdp_err err;
    EXPECT_EQ(kcu_add(FSDP_DT_I32, nullptr, nullptr, nullptr, 4, nullptr, &err), FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "dtype i32 is not supported"), nullptr) << err.msg;
    EXPECT_EQ(kcu_attention_forward(FSDP_DT_F32, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 8, 6, 4, 16, nullptr,
                                    &err),
              FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "not a multiple of n_kv_heads"), nullptr) << err.msg;
    EXPECT_EQ(kcu_attention_forward(FSDP_DT_BF16, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 8, 2, 2, 300, nullptr,
                                    &err),
              FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "head_dim 300"), nullptr) << err.msg;
    EXPECT_EQ(kcu_attention_backward(FSDP_DT_F32, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                     nullptr, 1, 8, 2, 2, 16, nullptr, nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_EQ(kcu_rope_forward(FSDP_DT_F32, nullptr, nullptr, nullptr, 1, 4, 2, 7, nullptr, &err), FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "even head_dim"), nullptr) << err.msg;
    EXPECT_EQ(kcu_rmsnorm_backward(FSDP_DT_F32, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 1 << 20,
                                   nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_EQ(kcu_cast(nullptr, FSDP_DT_F16, nullptr, FSDP_DT_F32, 4, nullptr, &err), FSDP_E_INVALID);
    EXPECT_EQ(kcu_embedding_forward(FSDP_DT_F32, nullptr, nullptr, nullptr, -1, 10, 4, nullptr, nullptr, &err),
              FSDP_E_INVALID);
    EXPECT_EQ(kcu_attention_scratch_floats(2, 5, 3), 30u);
    EXPECT_EQ(kcu_attention_scratch_floats(0, 5, 3), 0u);
    kcu_tensor t;
    memset(&t, 0, sizeof t);
    t.n = 10; // NULL param and grad
    kcu_tensor_list *l = nullptr;
    EXPECT_EQ(kcu_tensor_list_create(&t, 1, &l, &err), FSDP_E_INVALID);
    EXPECT_NE(strstr(err.msg, "tensor 0"), nullptr) << err.msg;
    EXPECT_EQ(kcu_adamw_step(nullptr, nullptr, 1, nullptr, &err), FSDP_E_INVALID);
    EXPECT_EQ(dev_gemm(nullptr, 0, 0, 1, 1, 1, 1.0f, FSDP_DT_F32, nullptr, 1, nullptr, 1, 0.0f, FSDP_DT_F32, nullptr, 1,
                       &err),
              FSDP_E_INVALID);
}

} // namespace
