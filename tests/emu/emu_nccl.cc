// Fake NCCL of the emulated-device build over MPI: the functions runtime/comm_nccl.c and
// tests/mpi/nccl_check.c call, with the signatures of nccl.h.
//
// A communicator of one rank needs no MPI (collectives are copies). One of n > 1 ranks is an MPI
// communicator split from MPI_COMM_WORLD (MPI must be initialised; every world rank takes part in
// ncclCommInitRank, the colour comes from the unique id, the key is the rank; the result must have n
// ranks). Each collective checks its arguments at the call (device buffers inside one device
// allocation of the fake runtime, types f32/f64/i32/i64/u8, ops sum/prod/max/min, root in range) and
// is queued as a deferred operation on `stream` (tests/emu/emu_cudart.cc): the MPI call happens when
// the stream runs, so a rank blocks in it until the other ranks run theirs. As on a GPU, the ranks
// must issue collectives in the same order; unlike a GPU, a rank that waits in a host-side MPI call
// while its peer forces a stream whose collective needs it deadlocks (fsdp-run's ranks issue and
// force collectives in the same order). Send data is copied at execution time, so in-place calls
// (send inside recv) are fine. ncclGroupStart/End nest; the operations of a group are queued one by
// one in call order, which MPI's in-order matching makes equivalent to NCCL's grouped launch.
#define OMPI_SKIP_MPICXX 1 // the C API only
#include <mpi.h>
#include <nccl.h>
#include <string.h>
#include <unistd.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/emu/emu_cudart.h"

struct ncclComm {
    int nranks, rank;
    MPI_Comm mpi; // MPI_COMM_NULL with one rank
};

namespace {

thread_local int group_depth = 0;

// Point-to-point (ncclSend / ncclRecv): executed as MPI_Isend / MPI_Irecv when their stream runs them;
// the requests wait in `pending` until the op the group's end (or a lone call) queues after them waits
// for all of them, so that a group of sends and receives between ranks cannot deadlock. One rank's
// messages to itself (and a communicator of one rank) go through `self_fifo`.
struct P2p {
    std::mutex mu;
    std::vector<MPI_Request> pending;
    std::vector<std::shared_ptr<std::vector<unsigned char>>> send_bufs;
    std::deque<std::vector<unsigned char>> self_fifo;
};
P2p &p2p() {
    static P2p p;
    return p;
}
thread_local cudaStream_t p2p_stream = nullptr; // the stream of this group's point-to-point calls
thread_local bool p2p_in_group = false;

bool mpi_type(ncclDataType_t t, MPI_Datatype *m, size_t *size) {
    switch (t) {
    case ncclUint8: *m = MPI_UINT8_T, *size = 1; return true;
    case ncclInt8: *m = MPI_INT8_T, *size = 1; return true;
    case ncclInt32: *m = MPI_INT32_T, *size = 4; return true;
    case ncclUint32: *m = MPI_UINT32_T, *size = 4; return true;
    case ncclInt64: *m = MPI_INT64_T, *size = 8; return true;
    case ncclUint64: *m = MPI_UINT64_T, *size = 8; return true;
    case ncclFloat32: *m = MPI_FLOAT, *size = 4; return true;
    case ncclFloat64: *m = MPI_DOUBLE, *size = 8; return true;
    default: return false; // half types: no MPI type
    }
}

bool mpi_op(ncclRedOp_t o, MPI_Op *m) {
    switch (o) {
    case ncclSum: *m = MPI_SUM; return true;
    case ncclProd: *m = MPI_PROD; return true;
    case ncclMax: *m = MPI_MAX; return true;
    case ncclMin: *m = MPI_MIN; return true;
    default: return false;
    }
}

std::string mpi_err(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return std::string();
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    return std::string(what) + ": " + std::string(s, (size_t)len);
}

ncclResult_t queue(cudaStream_t stream, const char *what, emucu::Op op) {
    return emucu::enqueue(stream, what, std::move(op)) == cudaSuccess ? ncclSuccess : ncclInvalidArgument;
}

bool dev(const void *p, size_t bytes) { return bytes == 0 || emucu::is_device_range(p, bytes); }

} // namespace

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (emulated NCCL)";
    case ncclSystemError: return "unhandled system error (emulated NCCL: MPI is not initialised or failed)";
    case ncclInternalError: return "internal error (emulated NCCL)";
    case ncclInvalidArgument: return "invalid argument (emulated NCCL: bad buffer, type, op or root)";
    case ncclInvalidUsage: return "invalid usage (emulated NCCL: communicator size or rank mismatch)";
    default: return "unknown result code (emulated NCCL)";
    }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    static const char tag[] = "fsdp-emu-nccl";
    memcpy(id->internal, tag, sizeof tag);
    // distinct ids for distinct calls of this process: its address space and a counter
    static uint64_t calls = 0; // the fake library's own state, as NCCL's
    uint64_t v[2] = {(uint64_t)(uintptr_t)id ^ (uint64_t)getpid(), ++calls};
    memcpy(id->internal + 16, v, sizeof v);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    *comm = nullptr;
    if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    if (memcmp(id.internal, "fsdp-emu-nccl", 13) != 0) return ncclInvalidArgument;
    if (nranks == 1) {
        *comm = new ncclComm{1, 0, MPI_COMM_NULL};
        return ncclSuccess;
    }
    int init = 0;
    MPI_Initialized(&init);
    if (!init) return ncclSystemError;
    uint32_t h = 2166136261u; // FNV-1a of the id: the split colour
    for (size_t i = 0; i < sizeof id.internal; i++) h = (h ^ (unsigned char)id.internal[i]) * 16777619u;
    MPI_Comm c = MPI_COMM_NULL;
    if (MPI_Comm_split(MPI_COMM_WORLD, (int)(h & 0x3fffffff), rank, &c) != MPI_SUCCESS) return ncclSystemError;
    int size = 0, me = -1;
    MPI_Comm_size(c, &size);
    MPI_Comm_rank(c, &me);
    if (size != nranks || me != rank) {
        MPI_Comm_free(&c);
        return ncclInvalidUsage;
    }
    *comm = new ncclComm{nranks, rank, c};
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclInvalidArgument;
    if (comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
    delete comm;
    return ncclSuccess;
}

// Queues the wait for every posted point-to-point request on `stream`.
static ncclResult_t p2p_wait(cudaStream_t stream) {
    return queue(stream, "ncclGroupEnd (send/recv)", []() -> std::string {
        std::vector<MPI_Request> reqs;
        std::vector<std::shared_ptr<std::vector<unsigned char>>> bufs;
        {
            std::lock_guard<std::mutex> lk(p2p().mu);
            reqs.swap(p2p().pending);
            bufs.swap(p2p().send_bufs);
        }
        if (reqs.empty()) return std::string();
        return mpi_err(MPI_Waitall((int)reqs.size(), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    });
}

// After a point-to-point call: inside a group, the group's end waits; alone, it waits at once.
static ncclResult_t p2p_after(ncclResult_t r, cudaStream_t stream) {
    if (r != ncclSuccess) return r;
    if (group_depth > 0) {
        p2p_in_group = true;
        p2p_stream = stream;
        return ncclSuccess;
    }
    return p2p_wait(stream);
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    MPI_Datatype t;
    size_t es;
    if (!comm || !mpi_type(dt, &t, &es) || peer < 0 || peer >= comm->nranks) return ncclInvalidArgument;
    const size_t bytes = count * es;
    if (!dev(send, bytes)) return ncclInvalidArgument;
    ncclComm c = *comm;
    return p2p_after(queue(stream, "ncclSend", [c, send, bytes, peer]() -> std::string {
        auto buf = std::make_shared<std::vector<unsigned char>>((const unsigned char *)send,
                                                                  (const unsigned char *)send + bytes);
        std::lock_guard<std::mutex> lk(p2p().mu);
        if (c.nranks == 1 || peer == c.rank) {
            p2p().self_fifo.push_back(*buf);
            return std::string();
        }
        MPI_Request rq;
        int rc = MPI_Isend(buf->data(), (int)bytes, MPI_BYTE, peer, 7, c.mpi, &rq);
        if (rc == MPI_SUCCESS) {
            p2p().pending.push_back(rq);
            p2p().send_bufs.push_back(buf);
        }
        return mpi_err(rc, "MPI_Isend");
    }),
                     stream);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t stream) {
    MPI_Datatype t;
    size_t es;
    if (!comm || !mpi_type(dt, &t, &es) || peer < 0 || peer >= comm->nranks) return ncclInvalidArgument;
    const size_t bytes = count * es;
    if (!dev(recv, bytes)) return ncclInvalidArgument;
    ncclComm c = *comm;
    return p2p_after(queue(stream, "ncclRecv", [c, recv, bytes, peer]() -> std::string {
        std::lock_guard<std::mutex> lk(p2p().mu);
        if (c.nranks == 1 || peer == c.rank) {
            if (p2p().self_fifo.empty() || p2p().self_fifo.front().size() != bytes)
                return "ncclRecv from itself: no send of that size before it";
            memcpy(recv, p2p().self_fifo.front().data(), bytes);
            p2p().self_fifo.pop_front();
            return std::string();
        }
        MPI_Request rq;
        int rc = MPI_Irecv(recv, (int)bytes, MPI_BYTE, peer, 7, c.mpi, &rq);
        if (rc == MPI_SUCCESS) p2p().pending.push_back(rq);
        return mpi_err(rc, "MPI_Irecv");
    }),
                     stream);
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return ncclInvalidUsage;
    group_depth--;
    if (group_depth == 0 && p2p_in_group) {
        p2p_in_group = false;
        return p2p_wait(p2p_stream);
    }
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclComm_t comm,
                           cudaStream_t stream) {
    MPI_Datatype t;
    size_t es;
    if (!comm || !mpi_type(dt, &t, &es)) return ncclInvalidArgument;
    const size_t bytes = count * es;
    if (!dev(send, bytes) || !dev(recv, bytes * (size_t)comm->nranks)) return ncclInvalidArgument;
    ncclComm c = *comm;
    return queue(stream, "ncclAllGather", [c, send, recv, count, t, bytes]() -> std::string {
        std::vector<unsigned char> tmp((const unsigned char *)send, (const unsigned char *)send + bytes);
        if (c.nranks == 1) {
            memcpy(recv, tmp.data(), bytes);
            return std::string();
        }
        return mpi_err(MPI_Allgather(tmp.data(), (int)count, t, recv, (int)count, t, c.mpi), "MPI_Allgather");
    });
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
    MPI_Datatype t;
    MPI_Op o;
    size_t es;
    if (!comm || !mpi_type(dt, &t, &es) || !mpi_op(op, &o)) return ncclInvalidArgument;
    const size_t bytes = count * es;
    if (!dev(send, bytes * (size_t)comm->nranks) || !dev(recv, bytes)) return ncclInvalidArgument;
    ncclComm c = *comm;
    return queue(stream, "ncclReduceScatter", [c, send, recv, count, t, o, bytes]() -> std::string {
        std::vector<unsigned char> tmp((const unsigned char *)send,
                                       (const unsigned char *)send + bytes * (size_t)c.nranks);
        if (c.nranks == 1) {
            memcpy(recv, tmp.data(), bytes);
            return std::string();
        }
        return mpi_err(MPI_Reduce_scatter_block(tmp.data(), recv, (int)count, t, o, c.mpi), "MPI_Reduce_scatter_block");
    });
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    MPI_Datatype t;
    MPI_Op o;
    size_t es;
    if (!comm || !mpi_type(dt, &t, &es) || !mpi_op(op, &o)) return ncclInvalidArgument;
    const size_t bytes = count * es;
    if (!dev(send, bytes) || !dev(recv, bytes)) return ncclInvalidArgument;
    ncclComm c = *comm;
    return queue(stream, "ncclAllReduce", [c, send, recv, count, t, o, bytes]() -> std::string {
        std::vector<unsigned char> tmp((const unsigned char *)send, (const unsigned char *)send + bytes);
        if (c.nranks == 1) {
            memcpy(recv, tmp.data(), bytes);
            return std::string();
        }
        return mpi_err(MPI_Allreduce(tmp.data(), recv, (int)count, t, o, c.mpi), "MPI_Allreduce");
    });
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    MPI_Datatype t;
    size_t es;
    if (!comm || !mpi_type(dt, &t, &es) || root < 0 || root >= comm->nranks) return ncclInvalidArgument;
    const size_t bytes = count * es;
    if ((comm->rank == root && !dev(send, bytes)) || !dev(recv, bytes)) return ncclInvalidArgument;
    ncclComm c = *comm;
    return queue(stream, "ncclBroadcast", [c, send, recv, count, t, root, bytes]() -> std::string {
        if (c.rank == root && send != recv) memmove(recv, send, bytes);
        if (c.nranks == 1) return std::string();
        return mpi_err(MPI_Bcast(recv, (int)count, t, root, c.mpi), "MPI_Bcast");
    });
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
    MPI_Datatype t;
    MPI_Op o;
    size_t es;
    if (!comm || !mpi_type(dt, &t, &es) || !mpi_op(op, &o) || root < 0 || root >= comm->nranks)
        return ncclInvalidArgument;
    const size_t bytes = count * es;
    if (!dev(send, bytes) || (comm->rank == root && !dev(recv, bytes))) return ncclInvalidArgument;
    ncclComm c = *comm;
    return queue(stream, "ncclReduce", [c, send, recv, count, t, o, root, bytes]() -> std::string {
        std::vector<unsigned char> tmp((const unsigned char *)send, (const unsigned char *)send + bytes);
        if (c.nranks == 1) {
            memcpy(recv, tmp.data(), bytes);
            return std::string();
        }
        return mpi_err(MPI_Reduce(tmp.data(), c.rank == root ? recv : nullptr, (int)count, t, o, root, c.mpi),
                       "MPI_Reduce");
    });
}

} // extern "C"
