// Fake CUDA runtime of the emulated-device build (build-emu/, `make emu`): exactly the cudart
// functions fsdp-run and its tests call, with the signatures of $(CUDA_HOME)/include/cuda_runtime_api.h
// (included, so the compiler checks them and any name the header maps is defined under its mapped
// name). Device memory is host memory; kernels are the kernels/cuda/*.cu sources compiled as host C++
// (tests/emu/emu_kernels.cc over tests/kcu_emu.h); GEMMs and collectives come from the fake cuBLASLt
// and NCCL (tests/emu/emu_cublas.cc, tests/emu/emu_nccl.cc). Nothing here is a GPU: it exists so that
// the host-side GPU code (ordering between streams, pinned buffers, placement) runs in `make test`.
//
// Devices: FSDP_EMU_DEVICES (default 1; 0 makes cudaGetDeviceCount fail with cudaErrorNoDevice).
// Device d of a process has the name "fsdp-emu device d", compute capability 9.0,
// FSDP_EMU_SMS multiprocessors (default 4), FSDP_EMU_MEM_MB MiB of memory (default 4096: a limit on the
// bytes cudaMalloc hands out, not a reservation) and a UUID and PCI bus id made from d and the process's
// node-local rank (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, ... as runtime/device.c reads them), so that
// the ranks of one emulated node never seem to share a GPU.
//
// Memory: cudaMalloc / cudaHostAlloc allocations are tracked; a new device allocation is filled with
// 0xff bytes (NaN in f32 and bf16) so that reads of memory never written show up. cudaFree of a pointer
// that is not the start of a live device allocation, cudaFreeHost of one that is not pinned, a copy or
// memset whose device range is not inside one live device allocation, or a host range of a copy that
// lies in device memory: cudaErrorInvalidValue. cudaFree first runs every stream of the allocation's
// device (real cudaFree synchronises the device).
//
// Streams are not synchronous. Each stream (the legacy stream of a device included) is a FIFO of
// deferred operations: copies, memsets, kernel launches (arguments captured by value at launch),
// GEMMs, collectives, event records and event waits. Nothing runs when it is queued. Operations run,
// in order, in the host thread that forces them, when:
//   cudaStreamSynchronize(s)           runs s until it is empty;
//   cudaEventSynchronize(e), cudaEventQuery(e)   run e's stream up to e's latest record
//                                      (so cudaEventQuery never returns cudaErrorNotReady);
//   cudaMemcpy, cudaMemset             queue on the legacy stream of the current device and run it
//                                      until empty (created streams are non-blocking: they are not run);
//   cudaMemcpyAsync device->pageable host   runs the stream until the copy is done (CUDA's rule);
//   cudaMemcpyAsync pageable host->device   reads the source at the call (staged), copies when run;
//   cudaFree, cudaStreamDestroy        run the device's streams / that stream until empty;
//   a wait operation (cudaStreamWaitEvent) runs the stream of the awaited event up to that record.
// cudaStreamWaitEvent waits for the event's latest record at the time of the call (none: no wait);
// a wait that can only complete after work queued behind it on a stream being run is a deadlock on
// a GPU too: the wait fails with cudaErrorIllegalState. So a host read of pinned memory after an
// asynchronous device->host copy without a synchronisation sees the old bytes, and a missing
// cudaStreamWaitEvent between two streams shows up as work running before its inputs are ready.
// Only non-blocking streams can be created (cudaStreamNonBlocking; a blocking stream would have to be
// ordered with the legacy stream, which this emulation does not do): cudaErrorNotSupported otherwise.
// A failed operation (a kernel that aborted, a failed collective) makes the synchronisation that ran
// it return its error (cudaErrorLaunchFailure for kernels) and sets the last error of that thread;
// the operations behind it still run. Timing events (cudaEventCreate) take the host's clock when
// their record runs; cudaEventElapsedTime measures emulation time, not GPU time.
// All the state is one process-wide emulated driver, guarded by one recursive mutex (operations run
// with it held; a kernel's CUDA threads never call the runtime).
#include "tests/emu/emu_cudart.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

struct CUevent_st;

struct CUstream_st {
    struct Item {
        enum Kind { EXEC, RECORD, WAIT } kind;
        std::string what;
        emucu::Op op;
        cudaError_t code;
        CUevent_st *ev;
        uint64_t gen;
    };
    int device = 0;
    bool legacy = false;
    bool running = false;
    std::deque<Item> q;
    cudaError_t err = cudaSuccess; // first failure since the last synchronisation
    std::string err_msg;
};

struct CUevent_st {
    unsigned flags = 0;
    CUstream_st *stream = nullptr; // of the latest record
    uint64_t recorded = 0;         // records made
    uint64_t completed = 0;        // latest record that ran
    int refs = 0;                  // queued records and waits naming it
    bool destroyed = false;
    double t_ms = 0;               // host clock when the completed record ran
};

namespace {

struct Alloc {
    size_t bytes;
    int device; // -1: pinned host memory
};

struct Driver {
    std::recursive_mutex m;
    int n_dev = -1;
    int sms = 4;
    size_t mem_bytes = (size_t)4096 << 20;
    int local_rank = 0;
    std::vector<size_t> used;
    std::vector<CUstream_st *> legacy;
    std::set<CUstream_st *> streams;
    std::set<CUevent_st *> events;
    std::map<uintptr_t, Alloc> allocs;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

    static Driver &get() {
        static Driver d;
        return d;
    }
};

thread_local int cur_device = 0;
thread_local cudaError_t last_error = cudaSuccess;
thread_local cudaError_t detail_code = cudaSuccess;
thread_local std::string last_detail;

cudaError_t fail(cudaError_t e, const std::string &detail) {
    emucu::set_error(e, detail);
    return e;
}

long env_long(const char *name, long dflt, long lo, long hi) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end = nullptr;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) {
        fprintf(stderr, "fsdp-emu: %s=\"%s\" is not an integer in [%ld, %ld]; using %ld\n", name, v, lo, hi, dflt);
        return dflt;
    }
    return x;
}

// With the lock held: reads the environment once.
Driver &drv() {
    Driver &d = Driver::get();
    if (d.n_dev < 0) {
        d.n_dev = (int)env_long("FSDP_EMU_DEVICES", 1, 0, 64);
        d.sms = (int)env_long("FSDP_EMU_SMS", 4, 1, 1024);
        d.mem_bytes = (size_t)env_long("FSDP_EMU_MEM_MB", 4096, 1, 1L << 24) << 20;
        static const char *const vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                                           "MPI_LOCALRANKID", "PMI_LOCAL_RANK"};
        for (const char *v : vars)
            if (getenv(v) && *getenv(v)) {
                d.local_rank = (int)env_long(v, 0, 0, 1 << 20);
                break;
            }
        d.used.assign((size_t)d.n_dev, 0);
        for (int i = 0; i < d.n_dev; i++) {
            CUstream_st *s = new CUstream_st;
            s->device = i;
            s->legacy = true;
            d.legacy.push_back(s);
            d.streams.insert(s);
        }
    }
    return d;
}

typedef std::lock_guard<std::recursive_mutex> Lock;

CUstream_st *resolve(Driver &d, cudaStream_t s) {
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return cur_device < d.n_dev ? d.legacy[(size_t)cur_device] : nullptr;
    return d.streams.count(s) ? s : nullptr;
}

// The live allocation holding [p, p + bytes), or allocs.end().
std::map<uintptr_t, Alloc>::iterator find_alloc(Driver &d, const void *p, size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    auto it = d.allocs.upper_bound(a);
    if (it == d.allocs.begin()) return d.allocs.end();
    --it;
    if (a < it->first || a + bytes > it->first + (it->second.bytes ? it->second.bytes : 1)) return d.allocs.end();
    return it;
}

bool in_device(Driver &d, const void *p, size_t bytes) {
    auto it = find_alloc(d, p, bytes);
    return it != d.allocs.end() && it->second.device >= 0;
}
bool in_pinned(Driver &d, const void *p, size_t bytes) {
    auto it = find_alloc(d, p, bytes);
    return it != d.allocs.end() && it->second.device < 0;
}
bool touches_device(Driver &d, const void *p, size_t bytes) {
    // any byte of [p, p + bytes) inside a device allocation
    uintptr_t a = (uintptr_t)p;
    auto it = d.allocs.upper_bound(a + (bytes ? bytes - 1 : 0));
    while (it != d.allocs.begin()) {
        --it;
        if (it->first + it->second.bytes <= a) break;
        if (it->second.device >= 0) return true;
    }
    return false;
}

void unref(Driver &d, CUevent_st *e) {
    if (--e->refs == 0 && e->destroyed) {
        d.events.erase(e);
        delete e;
    }
}

void drive_event(Driver &d, CUevent_st *e, uint64_t gen);

// Runs the first operation of s.
void run_one(Driver &d, CUstream_st *s) {
    CUstream_st::Item it = std::move(s->q.front());
    s->q.pop_front();
    std::string err;
    cudaError_t code = it.code;
    if (it.kind == CUstream_st::Item::EXEC) {
        err = it.op();
    } else if (it.kind == CUstream_st::Item::RECORD) {
        if (it.gen > it.ev->completed) {
            it.ev->completed = it.gen;
            it.ev->t_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d.t0).count();
        }
        unref(d, it.ev);
    } else {
        CUevent_st *e = it.ev;
        if (e->completed < it.gen) {
            if (e->stream->running) {
                err = "cudaStreamWaitEvent: the awaited record is queued behind work that waits for this stream "
                      "(a deadlock on a GPU)";
                code = cudaErrorIllegalState;
            } else {
                drive_event(d, e, it.gen);
            }
        }
        unref(d, e);
    }
    if (!err.empty() && s->err == cudaSuccess) {
        s->err = code;
        s->err_msg = it.what + ": " + err;
    }
}

void drive(Driver &d, CUstream_st *s) {
    if (s->running) return; // an operation of s forced s itself: cannot happen (waits check first)
    s->running = true;
    while (!s->q.empty()) run_one(d, s);
    s->running = false;
}

// Runs e's stream until record `gen` of e has run.
void drive_event(Driver &d, CUevent_st *e, uint64_t gen) {
    CUstream_st *s = e->stream;
    if (!s || e->completed >= gen || s->running) return;
    s->running = true;
    while (e->completed < gen && !s->q.empty()) run_one(d, s);
    s->running = false;
}

// The stream's pending failure (cleared), also made the last error.
cudaError_t take_err(CUstream_st *s) {
    cudaError_t e = s->err;
    if (e == cudaSuccess) return e;
    s->err = cudaSuccess;
    return fail(e, s->err_msg);
}

cudaError_t sync_stream(Driver &d, CUstream_st *s) {
    drive(d, s);
    return take_err(s);
}

cudaError_t sync_device(Driver &d, int dev) {
    cudaError_t first = cudaSuccess;
    std::vector<CUstream_st *> ss(d.streams.begin(), d.streams.end());
    for (CUstream_st *s : ss)
        if (s->device == dev) {
            cudaError_t e = sync_stream(d, s);
            if (first == cudaSuccess) first = e;
        }
    return first;
}

cudaError_t push(Driver &d, cudaStream_t stream, CUstream_st::Item it, CUstream_st **out = nullptr) {
    CUstream_st *s = resolve(d, stream);
    if (!s) return fail(cudaErrorInvalidResourceHandle, it.what + ": the stream does not exist");
    s->q.push_back(std::move(it));
    if (out) *out = s;
    return cudaSuccess;
}

const char *kind_name(cudaMemcpyKind k) {
    switch (k) {
    case cudaMemcpyHostToHost: return "host to host";
    case cudaMemcpyHostToDevice: return "host to device";
    case cudaMemcpyDeviceToHost: return "device to host";
    case cudaMemcpyDeviceToDevice: return "device to device";
    default: return "default";
    }
}

// Queues a copy on `stream`; sync: run that stream until empty afterwards.
cudaError_t memcpy_on(void *dst, const void *src, size_t count, cudaMemcpyKind kind, cudaStream_t stream, bool sync,
                      const char *api) {
    Driver &d = drv();
    if (count == 0) return cudaSuccess;
    if (!dst || !src) return fail(cudaErrorInvalidValue, std::string(api) + ": null pointer");
    bool dd = in_device(d, dst, count), sd = in_device(d, src, count);
    if (kind == cudaMemcpyDefault) {
        kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                  : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    }
    bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice)
        return fail(cudaErrorInvalidMemcpyDirection, std::string(api) + ": bad direction");
    if (want_dd != dd || (!want_dd && touches_device(d, dst, count)))
        return fail(cudaErrorInvalidValue, std::string(api) + " " + kind_name(kind) + " of " + std::to_string(count) +
                                               " bytes: the destination is " +
                                               (want_dd ? "not inside one device allocation" : "device memory"));
    if (want_sd != sd || (!want_sd && touches_device(d, src, count)))
        return fail(cudaErrorInvalidValue, std::string(api) + " " + kind_name(kind) + " of " + std::to_string(count) +
                                               " bytes: the source is " +
                                               (want_sd ? "not inside one device allocation" : "device memory"));
    CUstream_st::Item it{CUstream_st::Item::EXEC, std::string(api) + " " + kind_name(kind), {}, cudaErrorLaunchFailure,
                         nullptr, 0};
    bool pageable_src = !sd && !in_pinned(d, src, count), pageable_dst = !dd && !in_pinned(d, dst, count);
    if (pageable_src && !sync) { // staged at the call
        auto staged = std::make_shared<std::vector<unsigned char>>((const unsigned char *)src,
                                                                   (const unsigned char *)src + count);
        it.op = [dst, staged]() {
            memcpy(dst, staged->data(), staged->size());
            return std::string();
        };
    } else {
        it.op = [dst, src, count]() {
            memmove(dst, src, count);
            return std::string();
        };
    }
    CUstream_st *s = nullptr;
    cudaError_t e = push(d, stream, std::move(it), &s);
    if (e != cudaSuccess) return e;
    if (sync || pageable_dst) return sync_stream(d, s);
    return cudaSuccess;
}

cudaError_t memset_on(void *p, int value, size_t count, cudaStream_t stream, bool sync, const char *api) {
    Driver &d = drv();
    if (count == 0) return cudaSuccess;
    if (!in_device(d, p, count))
        return fail(cudaErrorInvalidValue, std::string(api) + " of " + std::to_string(count) +
                                               " bytes: not inside one device allocation");
    CUstream_st::Item it{CUstream_st::Item::EXEC, api, [p, value, count]() {
                             memset(p, value, count);
                             return std::string();
                         },
                         cudaErrorLaunchFailure, nullptr, 0};
    CUstream_st *s = nullptr;
    cudaError_t e = push(d, stream, std::move(it), &s);
    if (e != cudaSuccess) return e;
    return sync ? sync_stream(d, s) : cudaSuccess;
}

} // namespace

namespace emucu {

cudaError_t enqueue(cudaStream_t s, const char *what, Op op, cudaError_t code) {
    Driver &d = Driver::get();
    Lock l(d.m);
    drv();
    return push(d, s, CUstream_st::Item{CUstream_st::Item::EXEC, what, std::move(op), code, nullptr, 0});
}

void set_error(cudaError_t e, const std::string &detail) {
    last_error = e;
    detail_code = e;
    last_detail = detail;
}

bool is_device_range(const void *p, size_t bytes) {
    Driver &d = Driver::get();
    Lock l(d.m);
    return in_device(drv(), p, bytes);
}

} // namespace emucu

// ---- the runtime API --------------------------------------------------------------------------------------------

extern "C" {

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define EMU_NAME(x) \
    case x: return #x;
        EMU_NAME(cudaSuccess)
        EMU_NAME(cudaErrorInvalidValue)
        EMU_NAME(cudaErrorMemoryAllocation)
        EMU_NAME(cudaErrorInvalidConfiguration)
        EMU_NAME(cudaErrorInvalidMemcpyDirection)
        EMU_NAME(cudaErrorNoDevice)
        EMU_NAME(cudaErrorInvalidDevice)
        EMU_NAME(cudaErrorInvalidResourceHandle)
        EMU_NAME(cudaErrorIllegalState)
        EMU_NAME(cudaErrorNotReady)
        EMU_NAME(cudaErrorLaunchFailure)
        EMU_NAME(cudaErrorNotSupported)
#undef EMU_NAME
    default: return "cudaErrorUnknown";
    }
}

// The message of this thread's latest failure with that code, else a generic one.
const char *cudaGetErrorString(cudaError_t e) {
    if (e == cudaSuccess) return "no error";
    if (e == detail_code && !last_detail.empty()) return last_detail.c_str();
    return "emulated CUDA error";
}

cudaError_t cudaGetDeviceCount(int *count) {
    Driver &d = Driver::get();
    Lock l(d.m);
    *count = drv().n_dev;
    if (d.n_dev == 0) return fail(cudaErrorNoDevice, "no emulated device (FSDP_EMU_DEVICES=0)");
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    Driver &d = Driver::get();
    Lock l(d.m);
    if (device < 0 || device >= drv().n_dev)
        return fail(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) + "): " +
                                                std::to_string(d.n_dev) + " emulated devices");
    cur_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    *device = cur_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    Driver &d = Driver::get();
    Lock l(d.m);
    if (device < 0 || device >= drv().n_dev)
        return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(" + std::to_string(device) + ")");
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "fsdp-emu device %d", device);
    const char tag[8] = {'f', 's', 'd', 'p', 'e', 'm', 'u', 0};
    memcpy(prop->uuid.bytes, tag, 8);
    uint32_t lr = (uint32_t)d.local_rank, dv = (uint32_t)device;
    memcpy(prop->uuid.bytes + 8, &lr, 4);
    memcpy(prop->uuid.bytes + 12, &dv, 4);
    prop->totalGlobalMem = d.mem_bytes;
    prop->sharedMemPerBlock = 48 * 1024;
    prop->sharedMemPerBlockOptin = 227 * 1024;
    prop->regsPerBlock = 65536;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = d.sms;
    prop->pciBusID = 1 + d.local_rank * 64 + device;
    prop->pciDeviceID = 0;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
    Driver &d = Driver::get();
    Lock l(d.m);
    drv();
    *devPtr = nullptr;
    if (cur_device >= d.n_dev) return fail(cudaErrorNoDevice, "cudaMalloc: no emulated device");
    size_t &used = d.used[(size_t)cur_device];
    if (size > d.mem_bytes - used)
        return fail(cudaErrorMemoryAllocation, "cudaMalloc(" + std::to_string(size) + " bytes): the emulated device has " +
                                                   std::to_string(d.mem_bytes - used) + " bytes left (FSDP_EMU_MEM_MB)");
    void *p = nullptr;
    if (posix_memalign(&p, 256, size ? size : 1) != 0)
        return fail(cudaErrorMemoryAllocation, "cudaMalloc(" + std::to_string(size) + " bytes): host memory exhausted");
    memset(p, 0xff, size);
    used += size;
    d.allocs[(uintptr_t)p] = Alloc{size, cur_device};
    *devPtr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr) {
    if (!devPtr) return cudaSuccess;
    Driver &d = Driver::get();
    Lock l(d.m);
    drv();
    auto it = d.allocs.find((uintptr_t)devPtr);
    if (it == d.allocs.end() || it->second.device < 0)
        return fail(cudaErrorInvalidValue, "cudaFree: the pointer is not a live device allocation");
    int dev = it->second.device;
    cudaError_t e = sync_device(d, dev); // real cudaFree synchronises
    it = d.allocs.find((uintptr_t)devPtr);
    d.used[(size_t)dev] -= it->second.bytes;
    d.allocs.erase(it);
    free(devPtr);
    return e;
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    Driver &d = Driver::get();
    Lock l(d.m);
    drv();
    *pHost = nullptr;
    if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
        return fail(cudaErrorInvalidValue, "cudaHostAlloc: unknown flags");
    void *p = nullptr;
    if (posix_memalign(&p, 256, size ? size : 1) != 0)
        return fail(cudaErrorMemoryAllocation, "cudaHostAlloc(" + std::to_string(size) + " bytes)");
    d.allocs[(uintptr_t)p] = Alloc{size, -1};
    *pHost = p;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr) {
    if (!ptr) return cudaSuccess;
    Driver &d = Driver::get();
    Lock l(d.m);
    auto it = d.allocs.find((uintptr_t)ptr);
    if (it == d.allocs.end() || it->second.device >= 0)
        return fail(cudaErrorInvalidValue, "cudaFreeHost: the pointer is not a live cudaHostAlloc allocation");
    d.allocs.erase(it);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    Driver &d = Driver::get();
    Lock l(d.m);
    return memcpy_on(dst, src, count, kind, nullptr, true, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
    Driver &d = Driver::get();
    Lock l(d.m);
    return memcpy_on(dst, src, count, kind, stream, false, "cudaMemcpyAsync");
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
    Driver &d = Driver::get();
    Lock l(d.m);
    return memset_on(devPtr, value, count, nullptr, true, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
    Driver &d = Driver::get();
    Lock l(d.m);
    return memset_on(devPtr, value, count, stream, false, "cudaMemsetAsync");
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    Driver &d = Driver::get();
    Lock l(d.m);
    drv();
    *pStream = nullptr;
    if (flags != cudaStreamNonBlocking)
        return fail(cudaErrorNotSupported, "cudaStreamCreateWithFlags: the emulation has non-blocking streams only");
    if (cur_device >= d.n_dev) return fail(cudaErrorNoDevice, "cudaStreamCreateWithFlags: no emulated device");
    CUstream_st *s = new CUstream_st;
    s->device = cur_device;
    d.streams.insert(s);
    *pStream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    Driver &d = Driver::get();
    Lock l(d.m);
    drv();
    if (!stream || !d.streams.count(stream) || stream->legacy)
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: not a created stream");
    cudaError_t e = sync_stream(d, stream);
    d.streams.erase(stream);
    delete stream;
    return e;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    Driver &d = Driver::get();
    Lock l(d.m);
    CUstream_st *s = resolve(drv(), stream);
    if (!s) return fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: the stream does not exist");
    return sync_stream(d, s);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    Driver &d = Driver::get();
    Lock l(d.m);
    drv();
    if (!d.events.count(event) || event->destroyed)
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: the event does not exist");
    if (flags != 0) return fail(cudaErrorInvalidValue, "cudaStreamWaitEvent: flags must be 0");
    if (event->recorded == 0) {
        if (!resolve(d, stream))
            return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: the stream does not exist");
        return cudaSuccess;
    }
    event->refs++;
    cudaError_t e = push(d, stream, CUstream_st::Item{CUstream_st::Item::WAIT, "cudaStreamWaitEvent", {},
                                                      cudaErrorIllegalState, event, event->recorded});
    if (e != cudaSuccess) unref(d, event);
    return e;
}

static cudaError_t event_create(cudaEvent_t *event, unsigned int flags) {
    Driver &d = Driver::get();
    Lock l(d.m);
    drv();
    if (flags & ~(unsigned)(cudaEventDisableTiming | cudaEventBlockingSync))
        return fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags: unsupported flags");
    CUevent_st *e = new CUevent_st;
    e->flags = flags;
    d.events.insert(e);
    *event = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return event_create(event, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) { return event_create(event, flags); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    Driver &d = Driver::get();
    Lock l(d.m);
    drv();
    if (!d.events.count(event) || event->destroyed)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy: the event does not exist");
    event->destroyed = true; // queued records and waits still name it: freed after the last one
    if (event->refs == 0) {
        d.events.erase(event);
        delete event;
    }
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    Driver &d = Driver::get();
    Lock l(d.m);
    drv();
    if (!d.events.count(event) || event->destroyed)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: the event does not exist");
    CUstream_st *s = resolve(d, stream);
    if (!s) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: the stream does not exist");
    event->refs++;
    uint64_t gen = ++event->recorded;
    event->stream = s;
    s->q.push_back(CUstream_st::Item{CUstream_st::Item::RECORD, "cudaEventRecord", {}, cudaSuccess, event, gen});
    return cudaSuccess;
}

static cudaError_t event_run(cudaEvent_t event, const char *api) {
    Driver &d = Driver::get();
    Lock l(d.m);
    drv();
    if (!d.events.count(event) || event->destroyed)
        return fail(cudaErrorInvalidResourceHandle, std::string(api) + ": the event does not exist");
    if (event->recorded == 0) return cudaSuccess;
    CUstream_st *s = event->stream;
    drive_event(d, event, event->recorded);
    if (event->completed < event->recorded)
        return fail(cudaErrorIllegalState, std::string(api) + ": the record cannot run (its stream is running)");
    return take_err(s);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) { return event_run(event, "cudaEventSynchronize"); }

cudaError_t cudaEventQuery(cudaEvent_t event) { return event_run(event, "cudaEventQuery"); }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    Driver &d = Driver::get();
    Lock l(d.m);
    drv();
    *ms = 0;
    for (cudaEvent_t e : {start, end}) {
        if (!d.events.count(e) || e->destroyed)
            return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: the event does not exist");
        if (e->flags & cudaEventDisableTiming)
            return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event has timing disabled");
        if (e->recorded == 0 || e->completed < e->recorded)
            return fail(cudaErrorNotReady, "cudaEventElapsedTime: an event has not completed");
    }
    *ms = (float)(end->t_ms - start->t_ms);
    return cudaSuccess;
}

} // extern "C"
