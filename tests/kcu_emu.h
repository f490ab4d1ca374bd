// Host emulation of the CUDA surface the kernels of kernels/cuda/*.cu use, so that their source (kernels
// and host wrappers alike) compiles as plain C++ and runs on a machine without a GPU. Include it at
// global scope, with KCU_EMULATE defined, before a .cu file (kernels/cuda/kcu_common.cuh then skips
// cuda_runtime.h and takes KCU_LAUNCH, KCU_SHARED, KCU_DYN_SHARED, KCU_API and KCU_UNROLL from here).
//
// Execution: a launch runs its blocks one after another (threadIdx from x fastest, warps of 32
// consecutive threads; shared memory is refilled with the poison between blocks). The threads of a
// block are fibers (256 KiB stacks with a guard page, mapped once per OS thread and reused; on x86-64 a
// switch saves the callee-saved registers, the stack pointer, MXCSR and the x87 control word, the System V
// ABI's whole callee-saved state, without the signal-mask system call of swapcontext; ucontext elsewhere)
// that one OS thread runs, resumed round-robin by thread index by the block scheduler of run_grid: a
// thread runs until it waits at a barrier or exits, so the interleaving is deterministic. Under ASan or
// TSan (which track stacks and would need fiber-switch annotations) the block runs instead on
// blockDim.x*y*z real std::threads.
//   __syncthreads   a block barrier;
//   __syncwarp, __shfl*_sync, __ballot/any/all_sync   warp collectives: a per-warp barrier through
//                   which the lanes exchange their values. Only the full mask is accepted, and every
//                   lane of a full warp must take part with the same collective (real full-mask
//                   semantics); anything else is an emulation failure.
// Each is a scheduling point: the waiting fiber goes back to the scheduler, which resumes it once the
// barrier completed (with std::threads: a waiting thread yields a few times, then sleeps on a
// condition variable).
// Misuse is reported, never a hang: a barrier that can no longer complete (some threads exited, or
// are blocked in another barrier) aborts the block with a message naming what each side waits at.
// Shared memory: dynamic (the launch's size, exactly) and static (KCU_SHARED, one allocation per
// declaration and block) are heap allocations filled with 0xff bytes (NaN in float and bf16), so
// ASan catches overruns, TSan sees missing barriers as races and unwritten reads show up as NaN.
// Launch checks as CUDA's: block and grid limits, dynamic shared memory above 48 KiB only after
// cudaFuncSetAttribute(MaxDynamicSharedMemorySize), 227 KiB in all. A failed launch or kernel sets
// the error cudaGetLastError returns (the message names the check), so the host wrappers' own
// error paths report it. Memory (cudaMalloc) is host memory; streams are ignored (launches are
// synchronous). With KCU_EMU_DEVICE (the emulated-device build, tests/emu/emu_kernels.cc) the types
// and the runtime API come from the CUDA headers and the fake runtime of tests/emu/emu_cudart.cc
// instead, a launch is checked at once but queued on its stream (arguments captured by value) and
// runs when that stream is forced, and everything here lives in an inline namespace so that both
// modes link into one test binary. WMMA (16x16x16 bf16 -> float) is a reference implementation run by lane 0 only,
// with alignment, leading-dimension and shared-memory bounds checks.
#ifndef FSDP_TESTS_KCU_EMU_H
#define FSDP_TESTS_KCU_EMU_H

#ifndef KCU_EMULATE
#define KCU_EMULATE 1
#endif

#include <math.h>
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KCU_EMU_SANITIZED 1
#endif
#endif
#else
#define KCU_EMU_SANITIZED 1
#endif
// Fibers (one OS thread runs a whole block) unless a sanitizer that tracks stacks is on: ASan and TSan
// would need their fiber-switch annotations, so the sanitized builds keep one std::thread per CUDA thread.
#ifndef KCU_EMU_FIBERS
#ifdef KCU_EMU_SANITIZED
#define KCU_EMU_FIBERS 0
#else
#define KCU_EMU_FIBERS 1
#endif
#endif
#if KCU_EMU_FIBERS
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#if defined(__x86_64__) && defined(__GNUC__)
#define KCU_EMU_FAST_SWITCH 1
#else
#define KCU_EMU_FAST_SWITCH 0
#endif
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

// The C headers kernels/cuda/kcu.h includes, at global scope (the .cu files are included inside a
// namespace by the tests).
#include "fsdp/error.h"
#include "fsdp/tensor.h"
#include "kernels/cpu/kc.h"

#ifdef KCU_EMU_DEVICE
// The emulated-device build: the types and runtime API are those of the CUDA headers, implemented by
// the fake runtime (tests/emu/emu_cudart.cc), which runs launches as deferred stream operations.
#include <cuda_runtime_api.h>
#include <vector_functions.h>

#include "tests/emu/emu_cudart.h"
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#else
struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorLaunchFailure = 719,
} cudaError_t;
typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;
typedef enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;

#endif // KCU_EMU_DEVICE

#ifdef KCU_EMU_DEVICE
// Everything below has other definitions (synchronous launches) in the tests' emulation
// (tests/kcu_emu_kernels.cc), which the same test binary links: an inline namespace keeps the two
// apart for the linker while the names stay usable unqualified.
inline namespace kcu_emu_streams {
#endif

namespace kcu_emu {

constexpr size_t kSmemDefault = 48 * 1024;  // dynamic shared memory without the opt-in
constexpr size_t kSmemMax = 227 * 1024;     // sm_90 opt-in limit per block (static + dynamic)
constexpr unsigned kFull = 0xffffffffu;

struct Abort {}; // unwinds a CUDA thread of a block that failed

enum Kind { K_SYNCTHREADS = 1, K_SYNCWARP, K_SHFL, K_VOTE };
inline const char *kind_name(int k) {
    return k == K_SYNCTHREADS ? "__syncthreads" : k == K_SYNCWARP ? "__syncwarp" : k == K_SHFL ? "__shfl*_sync" : "__ballot/any/all_sync";
}

struct Warp {
    unsigned size = 0;    // lanes that exist (the last warp of a block may be partial)
    unsigned arrived = 0; // lanes waiting in the current collective
    unsigned gen = 0;     // completed collectives
    unsigned exited = 0;
    int kind = 0;
    uint64_t val[2][32] = {}; // exchanged values, by collective parity
    std::condition_variable cv;
};

struct Block {
    uint3 bid;
    dim3 bdim, gdim;
    unsigned n = 0;
    std::mutex m;
    std::condition_variable cv;
    unsigned arrived = 0, gen = 0, exited = 0, waiting = 0;
    std::vector<int> at; // per thread: the kind of barrier it waits at (0: running or exited)
    std::vector<Warp> warps;
    bool abort = false;
    std::string err;
    unsigned char *dyn = nullptr;
    size_t dyn_bytes = 0, static_bytes = 0;
    std::vector<std::pair<const void *, std::pair<unsigned char *, size_t>>> statics;
};

#if KCU_EMU_FIBERS
#if KCU_EMU_FAST_SWITCH
// A fiber's saved context: its stack pointer, below which fiber_switch pushed the callee-saved state.
struct FiberCtx {
    void *sp = nullptr;
};

// Saves the caller's callee-saved registers, MXCSR and x87 control word on its stack and its stack
// pointer in save->sp, then resumes the context of load (returning from that context's own call of
// fiber_switch, or entering a new fiber at the function fiber_make put on its stack). A plain call for
// the compiler: every caller-saved register is clobbered by the ABI anyway.
__attribute__((naked, noinline)) inline void fiber_switch(FiberCtx *, FiberCtx *) { // save: %rdi, load: %rsi
    __asm__ volatile("pushq %rbp\n\t"
                     "pushq %rbx\n\t"
                     "pushq %r12\n\t"
                     "pushq %r13\n\t"
                     "pushq %r14\n\t"
                     "pushq %r15\n\t"
                     "subq $8, %rsp\n\t"
                     "stmxcsr (%rsp)\n\t"
                     "fnstcw 4(%rsp)\n\t"
                     "movq %rsp, (%rdi)\n\t"
                     "movq (%rsi), %rsp\n\t"
                     "ldmxcsr (%rsp)\n\t"
                     "fldcw 4(%rsp)\n\t"
                     "addq $8, %rsp\n\t"
                     "popq %r15\n\t"
                     "popq %r14\n\t"
                     "popq %r13\n\t"
                     "popq %r12\n\t"
                     "popq %rbx\n\t"
                     "popq %rbp\n\t"
                     "ret\n\t");
}

// A new context on [stack, stack + size) that enters fn() (which must never return) at its first switch.
inline void fiber_ctx_make(FiberCtx *c, unsigned char *stack, size_t size, void (*fn)()) {
    uint64_t *top = reinterpret_cast<uint64_t *>((reinterpret_cast<uintptr_t>(stack + size)) & ~uintptr_t(15));
    uint32_t csr;
    uint16_t cw;
    __asm__ volatile("stmxcsr %0" : "=m"(csr));
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    top[-1] = 0;                                   // fn's return address: none (it never returns)
    top[-2] = reinterpret_cast<uint64_t>(fn);      // where fiber_switch's ret goes: rsp = top - 8 at fn's entry,
                                                   // as after a call (16-byte aligned before it)
    for (int r = 3; r <= 8; r++) top[-r] = 0;      // rbp, rbx, r12 .. r15
    top[-9] = (uint64_t)csr | ((uint64_t)cw << 32);
    c->sp = top - 9;
}
#else
typedef ucontext_t FiberCtx;

inline void fiber_switch(FiberCtx *save, FiberCtx *load) { swapcontext(save, load); }
#endif
#endif

struct Thread {
    uint3 tid;
    unsigned lin; // linear thread index
    Block *b;
#if KCU_EMU_FIBERS
    FiberCtx ctx;                             // this CUDA thread's fiber
    FiberCtx *sched = nullptr;                // the block scheduler's context
    const std::function<void()> *body = nullptr;
    bool done = false;                        // the fiber returned
#endif
};

inline thread_local Thread *cur = nullptr;

// ---- process-wide state of the emulated device (test code only) -------------------------------------

struct LaunchRecord {
    std::string kernel;
    dim3 grid, block;
    size_t smem;
};

struct Device {
    std::mutex m;
    std::map<const void *, int> max_dyn_smem; // cudaFuncSetAttribute
    std::vector<LaunchRecord> launches;        // every launch attempted, in order
    long malloc_fail_after = -1;               // cudaMalloc fails once this many more calls succeeded
    long live_allocs = 0;
    static Device &get() {
        static Device d;
        return d;
    }
};

#ifdef KCU_EMU_DEVICE
inline void set_error(cudaError_t e, const std::string &detail) { emucu::set_error(e, detail); }
#else
inline thread_local cudaError_t last_error = cudaSuccess;
inline thread_local std::string last_detail; // what failed, for cudaGetErrorString

inline void set_error(cudaError_t e, const std::string &detail) {
    last_error = e;
    last_detail = detail;
}
#endif

// ---- block execution ------------------------------------------------------------------------------------

inline std::string thread_name(const Block &b, unsigned lin) {
    const unsigned x = lin % b.bdim.x, y = lin / b.bdim.x % b.bdim.y, z = lin / (b.bdim.x * b.bdim.y);
    return "block (" + std::to_string(b.bid.x) + "," + std::to_string(b.bid.y) + "," + std::to_string(b.bid.z) +
           ") thread (" + std::to_string(x) + "," + std::to_string(y) + "," + std::to_string(z) + ")";
}

// With b.m held: records the first failure and wakes every waiting thread, which then unwinds.
inline void abort_locked(Block &b, const std::string &what) {
    if (b.err.empty()) b.err = what;
    b.abort = true;
    b.cv.notify_all();
    for (Warp &w : b.warps) w.cv.notify_all();
}

inline void fail(const std::string &what) {
    Block &b = *cur->b;
    std::lock_guard<std::mutex> l(b.m);
    abort_locked(b, thread_name(b, cur->lin) + ": " + what);
}

// With b.m held, after a thread blocked or exited: when no thread can run any more, the barriers
// that threads wait at can never complete.
inline void check_stuck_locked(Block &b) {
    if (b.abort || b.waiting == 0 || b.waiting + b.exited < b.n) return;
    std::string what = "barrier that cannot complete (divergent barriers or an early exit):";
    int shown = 0;
    for (unsigned t = 0; t < b.n && shown < 4; t++)
        if (b.at[t] && (t == 0 || b.at[t] != b.at[t - 1])) {
            what += " " + thread_name(b, t) + " waits at " + kind_name(b.at[t]) + ";";
            shown++;
        }
    what += " " + std::to_string(b.exited) + " of " + std::to_string(b.n) + " threads exited";
    abort_locked(b, what);
}

#if KCU_EMU_FIBERS
// Back to the block scheduler; returns when the scheduler resumes this fiber.
inline void fiber_yield() {
    Thread *me = cur;
    fiber_switch(&me->ctx, me->sched);
    cur = me;
}
#endif

// Blocks the calling CUDA thread (l holds b.m) until done() (evaluated with b.m held).
// Fibers: back to the scheduler, which resumes the thread only once its barrier completed or the block
// aborted. Threads: a waiting thread yields a few times before it sleeps on the condition variable (most
// barriers complete within a few scheduler slices; sleeping costs a futex wake-up per thread).
template <class Done>
inline void block_wait(std::unique_lock<std::mutex> &l, std::condition_variable &cv, Done done) {
#if KCU_EMU_FIBERS
    (void)cv;
    while (!done()) {
        l.unlock(); // never switch with the lock held: the next fiber runs on this OS thread
        fiber_yield();
        l.lock();
    }
#else
    for (int spin = 0; spin < 32 && !done(); spin++) {
        l.unlock();
        std::this_thread::yield();
        l.lock();
    }
    cv.wait(l, done);
#endif
}

inline void syncthreads() {
    Block &b = *cur->b;
    std::unique_lock<std::mutex> l(b.m);
    if (b.abort) throw Abort{};
    const unsigned g = b.gen;
    if (++b.arrived == b.n) {
        b.arrived = 0;
        b.gen++;
        b.waiting -= b.n - 1;
        for (unsigned t = 0; t < b.n; t++)
            if (b.at[t] == K_SYNCTHREADS) b.at[t] = 0;
        b.cv.notify_all();
        return;
    }
    b.waiting++;
    b.at[cur->lin] = K_SYNCTHREADS;
    check_stuck_locked(b);
    block_wait(l, b.cv, [&] { return b.gen != g || b.abort; });
    if (b.gen == g) throw Abort{};
}

// A warp collective of kind k: stores this lane's value v, waits for every lane, returns the parity
// slot whose values the lanes read.
inline unsigned warp_collective(int k, unsigned mask, uint64_t v) {
    Block &b = *cur->b;
    const unsigned lane = cur->lin & 31;
    Warp &w = b.warps[cur->lin >> 5];
    std::unique_lock<std::mutex> l(b.m);
    if (b.abort) throw Abort{};
    if (mask != kFull) {
        abort_locked(b, thread_name(b, cur->lin) + ": " + kind_name(k) + " with mask " + std::to_string(mask) +
                            " (the emulation takes full-mask collectives only)");
        throw Abort{};
    }
    if (w.size != 32) {
        abort_locked(b, thread_name(b, cur->lin) + ": full-mask " + kind_name(k) + " in a warp of " +
                            std::to_string(w.size) + " threads");
        throw Abort{};
    }
    if (w.arrived == 0) {
        w.kind = k;
    } else if (w.kind != k) {
        abort_locked(b, thread_name(b, cur->lin) + ": lanes of a warp diverged: " + kind_name(k) + " while others wait at " +
                            kind_name(w.kind));
        throw Abort{};
    }
    const unsigned ph = w.gen & 1, g = w.gen;
    w.val[ph][lane] = v;
    if (++w.arrived == 32) {
        w.arrived = 0;
        w.gen++;
        b.waiting -= 31;
        for (unsigned t = cur->lin & ~31u; t < (cur->lin & ~31u) + 32; t++) b.at[t] = 0;
        w.cv.notify_all();
        return ph;
    }
    b.waiting++;
    b.at[cur->lin] = k;
    check_stuck_locked(b);
    block_wait(l, w.cv, [&] { return w.gen != g || b.abort; });
    if (w.gen == g) throw Abort{};
    return ph;
}

template <class T>
inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T>
inline T from_bits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}
inline uint64_t lane_val(unsigned ph, unsigned lane) {
    return cur->b->warps[cur->lin >> 5].val[ph][lane]; // read after the collective: stable until the next one
}

// Shuffle source lane as the PTX shfl modes define it; out of the lane's segment of `width`: itself.
enum ShflMode { SH_IDX, SH_UP, SH_DOWN, SH_XOR };
template <class T>
inline T shfl(ShflMode mode, unsigned mask, T v, int arg, int width) {
    const unsigned lane = cur->lin & 31;
    if (width <= 0 || width > 32 || (width & (width - 1))) {
        fail("shuffle width " + std::to_string(width) + " is not a power of two up to 32");
        throw Abort{};
    }
    const unsigned ph = warp_collective(K_SHFL, mask, to_bits(v));
    const int base = (int)(lane & ~(unsigned)(width - 1));
    int src = (int)lane;
    switch (mode) {
    case SH_IDX: src = base + (arg & (width - 1)); break;
    case SH_UP: src = (int)lane - arg >= base ? (int)lane - arg : (int)lane; break;
    case SH_DOWN: src = (int)lane + arg < base + width ? (int)lane + arg : (int)lane; break;
    case SH_XOR: src = (int)(lane ^ (unsigned)arg) < base + width ? (int)(lane ^ (unsigned)arg) : (int)lane; break;
    }
    return from_bits<T>(lane_val(ph, (unsigned)src));
}

inline unsigned ballot(unsigned mask, int pred) {
    const unsigned ph = warp_collective(K_VOTE, mask, pred != 0);
    unsigned r = 0;
    for (unsigned l = 0; l < 32; l++) r |= (lane_val(ph, l) ? 1u : 0u) << l;
    return r;
}

// Shared memory of the running block: the declaration `tag`'s static array (allocated on first use).
inline void *static_smem(const void *tag, size_t bytes) {
    Block &b = *cur->b;
    std::lock_guard<std::mutex> l(b.m);
    for (auto &s : b.statics)
        if (s.first == tag) return s.second.first;
    if (b.static_bytes + bytes > kSmemDefault || b.static_bytes + bytes + b.dyn_bytes > kSmemMax) {
        abort_locked(b, "static shared memory beyond the limit (" + std::to_string(b.static_bytes + bytes) + " bytes static, " +
                            std::to_string(b.dyn_bytes) + " dynamic)");
        throw Abort{};
    }
    void *p = nullptr;
    if (posix_memalign(&p, 16, bytes ? bytes : 1) != 0) {
        abort_locked(b, "cannot allocate emulated shared memory");
        throw Abort{};
    }
    std::memset(p, 0xff, bytes);
    b.statics.push_back({tag, {static_cast<unsigned char *>(p), bytes}});
    b.static_bytes += bytes;
    return p;
}

inline unsigned char *dyn_smem() { return cur->b->dyn; }

// 1 when [p, p + bytes) lies inside one of the running block's shared-memory allocations.
inline bool in_shared(const void *p, size_t bytes) {
    Block &b = *cur->b;
    const unsigned char *c = static_cast<const unsigned char *>(p);
    if (b.dyn && c >= b.dyn && c + bytes <= b.dyn + b.dyn_bytes) return true;
    std::lock_guard<std::mutex> l(b.m);
    for (auto &s : b.statics)
        if (c >= s.second.first && c + bytes <= s.second.first + s.second.second) return true;
    return false;
}

// A block's shared state for a launch of `bdim` threads with `smem` bytes of dynamic shared memory;
// "" or why it cannot be set up.
inline std::string block_init(Block &b, dim3 gdim, dim3 bdim, size_t smem) {
    b.gdim = gdim;
    b.bdim = bdim;
    b.n = bdim.x * bdim.y * bdim.z;
    b.at.assign(b.n, 0);
    b.warps = std::vector<Warp>((b.n + 31) / 32);
    if (smem) {
        void *p = nullptr;
        if (posix_memalign(&p, 128, smem) != 0) return "cannot allocate emulated shared memory";
        b.dyn = static_cast<unsigned char *>(p);
    }
    b.dyn_bytes = smem;
    return "";
}

// With b.m held: block `bid` starts (counters reset, shared memory poisoned again).
inline void block_reset_locked(Block &b, uint3 bid) {
    b.bid = bid;
    b.arrived = b.exited = b.waiting = 0;
    for (unsigned w = 0; w < b.warps.size(); w++) {
        Warp &wp = b.warps[w];
        wp.size = std::min(32u, b.n - 32 * w);
        wp.arrived = wp.exited = 0;
    }
    if (b.dyn) std::memset(b.dyn, 0xff, b.dyn_bytes);
    for (auto &s : b.statics) std::memset(s.second.first, 0xff, s.second.second);
}

inline void block_free(Block &b) {
    std::free(b.dyn);
    for (auto &s : b.statics) std::free(s.second.first);
}

// With b.m held: thread t of the block returned from the kernel (or unwound).
inline void thread_exit_locked(Block &b, unsigned t) {
    b.exited++;
    b.warps[t >> 5].exited++;
    b.at[t] = 0;
    check_stuck_locked(b);
}

#if KCU_EMU_FIBERS
constexpr size_t kFiberStack = 256 * 1024; // per CUDA thread

// The fiber stacks of one OS thread, mapped once and reused by every block and launch run on it; a
// PROT_NONE guard page below each stack makes an overflow fault at once instead of corrupting memory.
struct FiberStacks {
    std::vector<unsigned char *> base; // guard page, then the stack
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    ~FiberStacks() {
        for (unsigned char *p : base) munmap(p, page + kFiberStack);
    }
    // The stack of fiber i, nullptr when it cannot be mapped.
    unsigned char *get(unsigned i) {
        while (base.size() <= i) {
            void *p = mmap(nullptr, page + kFiberStack, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
            if (p == MAP_FAILED) return nullptr;
            if (mprotect(p, page, PROT_NONE) != 0) {
                munmap(p, page + kFiberStack);
                return nullptr;
            }
            base.push_back(static_cast<unsigned char *>(p));
        }
        return base[i] + page;
    }
};
inline thread_local FiberStacks fiber_stacks;

// A CUDA thread's fiber: runs the kernel, then records the exit and goes back to the scheduler for
// good. No exception leaves it (none may cross a context switch): Abort ends the thread, anything else
// fails the block.
inline void fiber_entry() {
    Thread *me = cur;
    try {
        (*me->body)();
    } catch (const Abort &) {
    } catch (...) {
        cur = me;
        fail("C++ exception thrown by the kernel");
    }
    Block &b = *me->b;
    {
        std::lock_guard<std::mutex> l(b.m);
        thread_exit_locked(b, me->lin);
    }
    me->done = true;
#if KCU_EMU_FAST_SWITCH
    FiberCtx dead;
    fiber_switch(&dead, me->sched); // never resumed
    __builtin_unreachable();
#else
    setcontext(me->sched);
#endif
}

// Sets f's fiber up to run the kernel from the start on `stack`. Apart from run_grid: getcontext
// returns twice, which would make the compiler assume the scheduler's locals clobbered.
__attribute__((noinline)) inline void fiber_make(Thread &f, unsigned char *stack) {
    f.done = false;
#if KCU_EMU_FAST_SWITCH
    fiber_ctx_make(&f.ctx, stack, kFiberStack, fiber_entry);
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stack;
    f.ctx.uc_stack.ss_size = kFiberStack;
    f.ctx.uc_link = f.sched;
    makecontext(&f.ctx, fiber_entry, 0);
#endif
}

// Runs body() as every thread of every block of the grid, the blocks one after another on the calling
// OS thread, the threads of a block as fibers that a scheduler resumes round-robin by thread
// index: a thread runs until it waits at a barrier or exits, and a waiting thread is resumed once its
// barrier completed (or the block aborted, so that it unwinds). Deterministic: the same launch always
// interleaves the same way. Returns "" or the first failure (the remaining blocks do not run).
inline std::string run_grid(dim3 gdim, dim3 bdim, size_t smem, const std::function<void()> &body) {
    Block b;
    std::string err = block_init(b, gdim, bdim, smem);
    if (!err.empty()) return err;
    FiberCtx sched;
    std::vector<Thread> th(b.n);
    for (unsigned t = 0; t < b.n && err.empty(); t++) {
        th[t].tid = {t % b.bdim.x, t / b.bdim.x % b.bdim.y, t / (b.bdim.x * b.bdim.y)};
        th[t].lin = t;
        th[t].b = &b;
        th[t].sched = &sched;
        th[t].body = &body;
        if (!fiber_stacks.get(t)) err = "cannot map the emulated threads' stacks";
    }
    Thread *const caller = cur;
    for (unsigned z = 0; z < gdim.z && err.empty(); z++)
        for (unsigned y = 0; y < gdim.y && err.empty(); y++)
            for (unsigned x = 0; x < gdim.x && err.empty(); x++) {
                {
                    std::lock_guard<std::mutex> l(b.m);
                    block_reset_locked(b, {x, y, z});
                }
                for (unsigned t = 0; t < b.n; t++) fiber_make(th[t], fiber_stacks.get(t));
                for (;;) {
                    bool ran = false, left = false;
                    for (unsigned t = 0; t < b.n; t++) {
                        if (th[t].done) continue;
                        left = true;
                        if (b.at[t] && !b.abort) continue; // waits at a barrier that has not completed
                        cur = &th[t];
                        fiber_switch(&sched, &th[t].ctx);
                        ran = true;
                    }
                    if (!left) break;
                    if (!ran) { // cannot happen: check_stuck_locked aborts a block before all threads wait
                        std::lock_guard<std::mutex> l(b.m);
                        abort_locked(b, "emulation scheduler: no runnable thread");
                    }
                }
                cur = caller;
                err = b.err;
            }
    cur = caller;
    block_free(b);
    return err;
}
#else
// Runs body() as every thread of every block of the grid, the blocks one after another on the same
// blockDim.x*y*z std::threads. Returns "" or the first failure (the remaining blocks do not run).
inline std::string run_grid(dim3 gdim, dim3 bdim, size_t smem, const std::function<void()> &body) {
    Block b;
    const std::string bad = block_init(b, gdim, bdim, smem);
    if (!bad.empty()) return bad;
    // the host thread sets a block up and opens the gate (round++); the last thread to exit wakes it
    std::condition_variable gate, host;
    unsigned round = 0;
    bool done = false;
    std::vector<std::thread> th;
    th.reserve(b.n);
    for (unsigned t = 0; t < b.n; t++)
        th.emplace_back([&, t] {
            Thread me{{t % b.bdim.x, t / b.bdim.x % b.bdim.y, t / (b.bdim.x * b.bdim.y)}, t, &b};
            unsigned seen = 0;
            for (;;) {
                {
                    std::unique_lock<std::mutex> l(b.m);
                    gate.wait(l, [&] { return round != seen || done; });
                    if (done) return;
                    seen = round;
                }
                cur = &me;
                try {
                    body();
                } catch (const Abort &) {
                }
                cur = nullptr;
                std::lock_guard<std::mutex> l(b.m);
                thread_exit_locked(b, t);
                if (b.exited == b.n) host.notify_one();
            }
        });
    std::string err;
    for (unsigned z = 0; z < gdim.z && err.empty(); z++)
        for (unsigned y = 0; y < gdim.y && err.empty(); y++)
            for (unsigned x = 0; x < gdim.x && err.empty(); x++) {
                std::unique_lock<std::mutex> l(b.m);
                block_reset_locked(b, {x, y, z});
                round++;
                gate.notify_all();
                host.wait(l, [&] { return b.exited == b.n; });
                err = b.err;
            }
    {
        std::lock_guard<std::mutex> l(b.m);
        done = true;
        gate.notify_all();
    }
    for (auto &t : th) t.join();
    block_free(b);
    return err;
}
#endif

// ---- launches ----------------------------------------------------------------------------------------------

template <class P>
inline P pass(P v) { // kernel arguments convert implicitly to the parameter types, as with <<<>>>
    return v;
}

template <class... P>
struct Launcher {
    void (*kernel)(P...);
    const char *name;
    dim3 grid, block;
    size_t smem;

    std::string check() const {
        const uint64_t nt = (uint64_t)block.x * block.y * block.z;
        if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 || block.z > 64 || nt > 1024)
            return "block (" + std::to_string(block.x) + "," + std::to_string(block.y) + "," + std::to_string(block.z) +
                   ") outside the limits";
        if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
            return "grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," + std::to_string(grid.z) +
                   ") outside the limits";
        return "";
    }

    template <class... A>
    void operator()(A &&...args) const {
        static_assert(sizeof...(A) == sizeof...(P), "kernel called with the wrong number of arguments");
        Device &d = Device::get();
        int optin = 0;
        {
            std::lock_guard<std::mutex> l(d.m);
            d.launches.push_back({name, grid, block, smem});
            auto it = d.max_dyn_smem.find(reinterpret_cast<const void *>(kernel));
            if (it != d.max_dyn_smem.end()) optin = it->second;
        }
        std::string bad = check();
        if (!bad.empty()) return set_error(cudaErrorInvalidConfiguration, std::string(name) + ": " + bad);
        if (smem > kSmemDefault && smem > (size_t)optin)
            return set_error(cudaErrorInvalidValue, std::string(name) + ": " + std::to_string(smem) +
                                                        " bytes of dynamic shared memory without cudaFuncSetAttribute");
        if (smem > kSmemMax)
            return set_error(cudaErrorInvalidValue, std::string(name) + ": " + std::to_string(smem) +
                                                        " bytes of dynamic shared memory exceed the limit");
        const std::tuple<P...> params(pass<P>(std::forward<A>(args))...);
#ifdef KCU_EMU_DEVICE
        // queued on the stream with the arguments captured by value; runs when the stream is forced
        void (*k)(P...) = kernel;
        const dim3 g = grid, b = block;
        const size_t sm = smem;
        std::string nm = name;
        emucu::enqueue(stream, name, [k, g, b, sm, params, nm]() -> std::string {
            std::string e = run_grid(g, b, sm, [&] {
                std::tuple<P...> own(params); // each thread has its own copy of the parameters
                std::apply(k, own);
            });
            return e;
        });
#else
        std::string e = run_grid(grid, block, smem, [&] {
            std::tuple<P...> own(params); // each thread has its own copy of the parameters
            std::apply(kernel, own);
        });
        if (!e.empty()) set_error(cudaErrorLaunchFailure, std::string(name) + ": " + e);
#endif
    }
#ifdef KCU_EMU_DEVICE
    cudaStream_t stream;
#endif
};

#ifdef KCU_EMU_DEVICE
template <class... P>
inline Launcher<P...> launcher(void (*k)(P...), const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t s) {
    return Launcher<P...>{k, name, grid, block, smem, s};
}
#else
template <class... P>
inline Launcher<P...> launcher(void (*k)(P...), const char *name, dim3 grid, dim3 block, size_t smem, const void *) {
    return Launcher<P...>{k, name, grid, block, smem};
}
#endif

// The launches since the last call (and forgets them).
inline std::vector<LaunchRecord> take_launches() {
    Device &d = Device::get();
    std::lock_guard<std::mutex> l(d.m);
    std::vector<LaunchRecord> r;
    r.swap(d.launches);
    return r;
}

// cudaMalloc fails after `n` more successful calls (-1: never).
inline void fail_malloc_after(long n) {
    Device &d = Device::get();
    std::lock_guard<std::mutex> l(d.m);
    d.malloc_fail_after = n;
}

inline long live_allocs() {
    Device &d = Device::get();
    std::lock_guard<std::mutex> l(d.m);
    return d.live_allocs;
}

inline float bf2f(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

} // namespace kcu_emu

// ---- the CUDA surface: device side --------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define threadIdx (kcu_emu::cur->tid)
#define blockIdx (kcu_emu::cur->b->bid)
#define blockDim (kcu_emu::cur->b->bdim)
#define gridDim (kcu_emu::cur->b->gdim)
#define warpSize 32

inline void __syncthreads() { kcu_emu::syncthreads(); }
inline void __syncwarp(unsigned mask = kcu_emu::kFull) { kcu_emu::warp_collective(kcu_emu::K_SYNCWARP, mask, 0); }
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return kcu_emu::shfl(kcu_emu::SH_IDX, mask, v, src, width);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return kcu_emu::shfl(kcu_emu::SH_UP, mask, v, (int)d, width);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return kcu_emu::shfl(kcu_emu::SH_DOWN, mask, v, (int)d, width);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lm, int width = 32) {
    return kcu_emu::shfl(kcu_emu::SH_XOR, mask, v, lm, width);
}
inline unsigned __ballot_sync(unsigned mask, int pred) { return kcu_emu::ballot(mask, pred); }
inline int __any_sync(unsigned mask, int pred) { return kcu_emu::ballot(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return kcu_emu::ballot(mask, pred) == kcu_emu::kFull; }

// Atomics on (host) global memory: GCC builtins, which ThreadSanitizer understands.
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
template <class F, class U>
inline F kcu_emu_atomic_add_fp(F *p, F v) {
    static_assert(sizeof(F) == sizeof(U), "float type and its bits");
    U *q = reinterpret_cast<U *>(p);
    U old = __atomic_load_n(q, __ATOMIC_RELAXED), nw;
    F f;
    do {
        std::memcpy(&f, &old, sizeof f);
        const F s = f + v;
        std::memcpy(&nw, &s, sizeof nw);
    } while (!__atomic_compare_exchange_n(q, &old, nw, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return f;
}
inline float atomicAdd(float *p, float v) { return kcu_emu_atomic_add_fp<float, uint32_t>(p, v); }
inline double atomicAdd(double *p, double v) { return kcu_emu_atomic_add_fp<double, uint64_t>(p, v); }
inline int atomicCAS(int *p, int cmp, int v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
inline unsigned atomicCAS(unsigned *p, unsigned cmp, unsigned v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
inline int atomicMax(int *p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

template <class T>
inline T __ldg(const T *p) {
    return *p;
}
inline float __uint_as_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __int_as_float(int i) { return __uint_as_float((uint32_t)i); }
inline int __float_as_int(float f) { return (int)__float_as_uint(f); }
inline long long __double_as_longlong(double d) {
    long long u;
    std::memcpy(&u, &d, 8);
    return u;
}
inline double __longlong_as_double(long long u) {
    double d;
    std::memcpy(&d, &u, 8);
    return d;
}
// Correctly rounded operations: the host's IEEE float arithmetic (x86-64 builds have no implicit FMA).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return sqrt(a); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __powf(float a, float b) { return powf(a, b); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

// cuda_bf16.h
struct __nv_bfloat16 {
    uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) { // round to nearest even, quiet NaN
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(uint16_t)((u >> 16) | 0x40u)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return __nv_bfloat16{(uint16_t)(u >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 h) { return kcu_emu::bf2f(h.bits); }

// mma.h: 16x16x16 bf16 fragments with float accumulation. A fragment holds the whole tile in lane 0
// (bf16 operands are exact in float); the other lanes' copies are unused, so data leaves a fragment
// only through lane 0's store_matrix_sync and other lanes need a __syncwarp before they read it.
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation has 16x16x16 fragments only");
    float x[256];
};

// A 16-row tile at p with leading dimension ldm (elements of esz bytes): 32-byte aligned, ldm a
// multiple of `mult`, inside the block's shared memory.
inline bool tile_ok(const void *p, unsigned ldm, size_t esz, unsigned mult) {
    if (((uintptr_t)p & 31u) != 0) {
        kcu_emu::fail("WMMA fragment pointer not 32-byte aligned");
        return false;
    }
    if (ldm % mult != 0) {
        kcu_emu::fail("WMMA leading dimension " + std::to_string(ldm) + " not a multiple of " + std::to_string(mult));
        return false;
    }
    if (!kcu_emu::in_shared(p, (15 * (size_t)ldm + 16) * esz)) {
        kcu_emu::fail("WMMA fragment outside the block's shared memory");
        return false;
    }
    return true;
}

inline bool lane0() { return (kcu_emu::cur->lin & 31) == 0; }

inline void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float v) {
    for (float &e : f.x) e = v;
}
inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, __nv_bfloat16, row_major> &f, const __nv_bfloat16 *p,
                             unsigned ldm) {
    if (!lane0() || !tile_ok(p, ldm, 2, 8)) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r * 16 + c] = kcu_emu::bf2f(p[(size_t)r * ldm + c].bits);
}
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, __nv_bfloat16, row_major> &f, const __nv_bfloat16 *p,
                             unsigned ldm) {
    if (!lane0() || !tile_ok(p, ldm, 2, 8)) return;
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 16; n++) f.x[k * 16 + n] = kcu_emu::bf2f(p[(size_t)k * ldm + n].bits);
}
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, __nv_bfloat16, col_major> &f, const __nv_bfloat16 *p,
                             unsigned ldm) {
    if (!lane0() || !tile_ok(p, ldm, 2, 8)) return;
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 16; n++) f.x[k * 16 + n] = kcu_emu::bf2f(p[(size_t)n * ldm + k].bits);
}
template <class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, row_major> &a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c) {
    if (!lane0()) return;
    float t[256];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = c.x[r * 16 + n];
            for (int k = 0; k < 16; k++) s += a.x[r * 16 + k] * b.x[k * 16 + n];
            t[r * 16 + n] = s;
        }
    std::memcpy(d.x, t, sizeof t);
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm, layout_t lay) {
    if (!lane0() || !tile_ok(p, ldm, 4, 4)) return;
    if (lay != mem_row_major) {
        kcu_emu::fail("only mem_row_major WMMA stores are emulated");
        return;
    }
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) p[(size_t)r * ldm + c] = f.x[r * 16 + c];
}
} // namespace wmma
} // namespace nvcuda

// ---- the CUDA surface: runtime API ---------------------------------------------------------------------------
// (in the emulated-device build: the fake runtime's, but for the per-kernel cudaFuncSetAttribute)
#ifndef KCU_EMU_DEVICE

inline cudaError_t cudaGetLastError() {
    const cudaError_t e = kcu_emu::last_error;
    kcu_emu::last_error = cudaSuccess;
    return e;
}
inline cudaError_t cudaPeekAtLastError() { return kcu_emu::last_error; }
inline const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}
// The emulation's message: what failed (the last failure of this host thread).
inline const char *cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess ? "no error" : kcu_emu::last_detail.c_str();
}
inline cudaError_t cudaMalloc(void **p, size_t bytes) {
    kcu_emu::Device &d = kcu_emu::Device::get();
    std::lock_guard<std::mutex> l(d.m);
    *p = nullptr;
    if (d.malloc_fail_after == 0 || posix_memalign(p, 256, bytes ? bytes : 1) != 0) {
        kcu_emu::set_error(cudaErrorMemoryAllocation, "cudaMalloc failed (emulated)");
        return cudaErrorMemoryAllocation;
    }
    if (d.malloc_fail_after > 0) d.malloc_fail_after--;
    d.live_allocs++;
    return cudaSuccess;
}
inline cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    kcu_emu::Device &d = kcu_emu::Device::get();
    std::lock_guard<std::mutex> l(d.m);
    d.live_allocs--;
    std::free(p);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind) {
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k, const void *) {
    return cudaMemcpy(dst, src, bytes, k);
}
inline cudaError_t cudaMemset(void *p, int v, size_t bytes) {
    if (bytes) std::memset(p, v, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, const void *) { return cudaMemset(p, v, bytes); }
#endif // !KCU_EMU_DEVICE
template <class... P>
inline cudaError_t cudaFuncSetAttribute(void (*k)(P...), cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || (size_t)value > kcu_emu::kSmemMax) {
        kcu_emu::set_error(cudaErrorInvalidValue, "cudaFuncSetAttribute: bad attribute or value");
        return cudaErrorInvalidValue;
    }
    kcu_emu::Device &d = kcu_emu::Device::get();
    std::lock_guard<std::mutex> l(d.m);
    d.max_dyn_smem[reinterpret_cast<const void *>(k)] = value;
    return cudaSuccess;
}

#ifdef KCU_EMU_DEVICE
} // inline namespace kcu_emu_streams
#endif

// ---- what kernels/cuda/kcu_common.cuh takes from here under KCU_EMULATE ---------------------------------------

#ifdef KCU_EMU_DEVICE
#define KCU_API extern "C"
#else
#define KCU_API
#endif
#define KCU_UNROLL
#define KCU_LAUNCH(kernel, grid, block, smem, stream) kcu_emu::launcher(kernel, #kernel, grid, block, smem, stream)
#define KCU_SHARED(T, name, n)                 \
    static char name##_kcu_emu_tag;            \
    T *const name = static_cast<T *>(kcu_emu::static_smem(&name##_kcu_emu_tag, sizeof(T) * (size_t)(n)))
#define KCU_DYN_SHARED(T, name) T *const name = reinterpret_cast<T *>(kcu_emu::dyn_smem())

#endif
