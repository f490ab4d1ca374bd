/* Device collectives through NCCL (see comm.h). The unique id travels over MPI (comm_bcast);
 * blocks of different sizes (torch.chunk shards are uneven) become one NCCL group of
 * broadcasts (all-gather) or reduces (reduce-scatter), equal blocks the plain collective. */
#include "runtime/comm_impl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if FSDP_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include "runtime/nccl_api.h"

static int nccl_fail(const comm *c, fsdp_err *err, ncclResult_t r, const char *what) {
    return fsdp_err_set(err, FSDP_E_DEVICE, "%s failed: %s", what, c->napi->GetErrorString(r));
}

/* Loads NCCL's functions into c->napi once (the library is not linked: runtime/nccl_api.h). */
static int load_api(comm *c, fsdp_err *err) {
    if (c->napi) return 0;
    nccl_api *a = malloc(sizeof *a);
    if (!a) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = nccl_api_load(a, err);
    if (rc) free(a);
    else c->napi = a;
    return rc;
}

static int cuda_fail(fsdp_err *err, cudaError_t e, const char *what) {
    return fsdp_err_set(err, FSDP_E_DEVICE, "%s failed: %s", what, cudaGetErrorString(e));
}

int comm_dev_init(comm *c, fsdp_err *err) {
    if (c->nccl) return 0;
    int dev = -1;
    cudaError_t ce = cudaGetDevice(&dev);
    /* Every rank takes part in the id broadcast, even one without a device, so that no rank
     * waits for another that already gave up: the failure is agreed on below. */
    enum { NO_DEVICE = 101, NO_ID = 102 };
    enum { NO_LIB = 103 };
    fsdp_err lib_err;
    int local = ce != cudaSuccess ? NO_DEVICE : load_api(c, &lib_err) ? NO_LIB : 0;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t nr = ncclSuccess;
    if (c->rank == 0 && !local) {
        nr = c->napi->GetUniqueId(&id);
        if (nr != ncclSuccess) local = NO_ID;
    }
    int who = -1;
    int agreed = comm_agree(c, local, &who, err);
    if (agreed && agreed != NO_DEVICE && agreed != NO_ID && agreed != NO_LIB) return agreed; /* agreement failed */
    if (agreed) {
        if (local == NO_DEVICE) return cuda_fail(err, ce, "cudaGetDevice (no usable GPU for NCCL)");
        if (local == NO_LIB) return fsdp_err_set(err, lib_err.code, "%s", lib_err.msg);
        if (local == NO_ID) return nccl_fail(c, err, nr, "ncclGetUniqueId");
        return fsdp_err_set(err, FSDP_E_COMM, "NCCL setup failed on rank %d (%s)", who,
                            agreed == NO_DEVICE ? "no usable GPU"
                            : agreed == NO_LIB  ? "cannot load NCCL"
                                                : "ncclGetUniqueId failed");
    }
    int rc = comm_bcast(c, &id, sizeof id, 0, err);
    if (rc) return rc;
    ncclComm_t nc = NULL;
    nr = c->napi->CommInitRank(&nc, c->size, id, c->rank);
    if (nr != ncclSuccess) return nccl_fail(c, err, nr, "ncclCommInitRank");
    c->nccl = nc;
    c->nccl_device = dev;
    return 0;
}

void comm_dev_release(comm *c) {
    if (!c) return;
    if (c->nccl) {
        int cur = -1;
        if (cudaGetDevice(&cur) == cudaSuccess && cur != c->nccl_device) cudaSetDevice(c->nccl_device);
        c->napi->CommDestroy((ncclComm_t)c->nccl);
        if (cur >= 0 && cur != c->nccl_device) cudaSetDevice(cur);
        c->nccl = NULL;
    }
    free(c->napi);
    c->napi = NULL;
}

static int need(const comm *c, fsdp_err *err) {
    if (c->nccl) return 0;
    return fsdp_err_set(err, FSDP_E_INVALID, "device collective before comm_dev_init (no NCCL communicator)");
}

/* Sum of the per-rank block sizes; *equal when every rank's block has the same size. */
static size_t blocks_total(const size_t *sizes, int world, int *equal) {
    size_t total = 0;
    *equal = 1;
    for (int r = 0; r < world; r++) {
        if (sizes[r] != sizes[0]) *equal = 0;
        total += sizes[r];
    }
    return total;
}

static int group_end(const comm *c, fsdp_err *err, const char *what) {
    ncclResult_t r = c->napi->GroupEnd();
    return r == ncclSuccess ? 0 : nccl_fail(c, err, r, what);
}

int comm_dev_allgatherv(comm *c, const void *send, void *recv, const size_t *bytes, void *stream, fsdp_err *err) {
    comm_count(c, COMM_K_ALLGATHER, comm_sum_sizes(bytes, c->size, 1));
    int rc = need(c, err);
    if (rc) return rc;
    ncclComm_t nc = (ncclComm_t)c->nccl;
    cudaStream_t st = (cudaStream_t)stream;
    int equal;
    if (blocks_total(bytes, c->size, &equal) == 0) return 0;
    uint8_t *out = (uint8_t *)recv;
    if (equal) {
        ncclResult_t r = c->napi->AllGather(send, out, bytes[0], ncclUint8, nc, st);
        return r == ncclSuccess ? 0 : nccl_fail(c, err, r, "ncclAllGather");
    }
    ncclResult_t r = c->napi->GroupStart();
    if (r != ncclSuccess) return nccl_fail(c, err, r, "ncclGroupStart");
    size_t off = 0;
    for (int root = 0; root < c->size; root++) {
        if (bytes[root]) {
            r = c->napi->Broadcast(send, out + off, bytes[root], ncclUint8, root, nc, st);
            if (r != ncclSuccess) {
                c->napi->GroupEnd();
                return nccl_fail(c, err, r, "ncclBroadcast (all-gather)");
            }
        }
        off += bytes[root];
    }
    return group_end(c, err, "all-gather group");
}

int comm_dev_reduce_scatterv_f32(comm *c, const float *send, float *recv, const size_t *counts, void *stream,
                                 fsdp_err *err) {
    comm_count(c, COMM_K_REDUCE_SCATTER, comm_sum_sizes(counts, c->size, sizeof(float)));
    int rc = need(c, err);
    if (rc) return rc;
    ncclComm_t nc = (ncclComm_t)c->nccl;
    cudaStream_t st = (cudaStream_t)stream;
    int equal;
    if (blocks_total(counts, c->size, &equal) == 0) return 0;
    if (equal) {
        ncclResult_t r = c->napi->ReduceScatter(send, recv, counts[0], ncclFloat32, ncclSum, nc, st);
        return r == ncclSuccess ? 0 : nccl_fail(c, err, r, "ncclReduceScatter");
    }
    ncclResult_t r = c->napi->GroupStart();
    if (r != ncclSuccess) return nccl_fail(c, err, r, "ncclGroupStart");
    size_t off = 0;
    for (int root = 0; root < c->size; root++) {
        if (counts[root]) {
            r = c->napi->Reduce(send + off, recv, counts[root], ncclFloat32, ncclSum, root, nc, st);
            if (r != ncclSuccess) {
                c->napi->GroupEnd();
                return nccl_fail(c, err, r, "ncclReduce (reduce-scatter)");
            }
        }
        off += counts[root];
    }
    return group_end(c, err, "reduce-scatter group");
}

static int nccl_type(comm_dtype dt, ncclDataType_t *t, fsdp_err *err) {
    switch (dt) {
    case COMM_F32: *t = ncclFloat32; return 0;
    case COMM_F64: *t = ncclFloat64; return 0;
    case COMM_I64: *t = ncclInt64; return 0;
    case COMM_U8: *t = ncclUint8; return 0;
    }
    return fsdp_err_set(err, FSDP_E_INVALID, "device collective: unknown dtype %d", (int)dt);
}

static int nccl_op(comm_op op, ncclRedOp_t *o, fsdp_err *err) {
    switch (op) {
    case COMM_SUM: *o = ncclSum; return 0;
    case COMM_MAX: *o = ncclMax; return 0;
    case COMM_MIN: *o = ncclMin; return 0;
    }
    return fsdp_err_set(err, FSDP_E_INVALID, "device collective: unknown op %d", (int)op);
}

int comm_dev_allreduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op, void *stream, fsdp_err *err) {
    comm_count(c, COMM_K_ALLREDUCE, count * (dt == COMM_U8 ? 1u : dt == COMM_F32 ? 4u : 8u));
    int rc = need(c, err);
    if (rc) return rc;
    ncclDataType_t t = ncclFloat32;
    ncclRedOp_t o = ncclSum;
    if ((rc = nccl_type(dt, &t, err)) || (rc = nccl_op(op, &o, err))) return rc;
    if (count == 0) return 0;
    ncclResult_t r = c->napi->AllReduce(buf, buf, count, t, o, (ncclComm_t)c->nccl, (cudaStream_t)stream);
    return r == ncclSuccess ? 0 : nccl_fail(c, err, r, "ncclAllReduce");
}

int comm_dev_bcast(comm *c, void *buf, size_t bytes, int root, void *stream, fsdp_err *err) {
    comm_count(c, COMM_K_BCAST, bytes);
    int rc = need(c, err);
    if (rc) return rc;
    if (root < 0 || root >= c->size)
        return fsdp_err_set(err, FSDP_E_INVALID, "device broadcast: root %d outside [0, %d)", root, c->size);
    if (bytes == 0) return 0;
    ncclResult_t r = c->napi->Broadcast(buf, buf, bytes, ncclUint8, root, (ncclComm_t)c->nccl, (cudaStream_t)stream);
    return r == ncclSuccess ? 0 : nccl_fail(c, err, r, "ncclBroadcast");
}

int comm_dev_alltoallv(comm *c, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes,
                       void *stream, fsdp_err *err) {
    comm_count(c, COMM_K_OTHER, comm_sum_sizes(send_bytes, c->size, 1));
    int rc = need(c, err);
    if (rc) return rc;
    ncclComm_t nc = (ncclComm_t)c->nccl;
    cudaStream_t st = (cudaStream_t)stream;
    ncclResult_t r = c->napi->GroupStart();
    if (r != ncclSuccess) return nccl_fail(c, err, r, "ncclGroupStart");
    size_t so = 0, ro = 0;
    for (int q = 0; q < c->size && r == ncclSuccess; q++) {
        if (send_bytes[q]) r = c->napi->Send((const uint8_t *)send + so, send_bytes[q], ncclUint8, q, nc, st);
        if (r == ncclSuccess && recv_bytes[q]) r = c->napi->Recv((uint8_t *)recv + ro, recv_bytes[q], ncclUint8, q, nc, st);
        so += send_bytes[q];
        ro += recv_bytes[q];
    }
    if (r != ncclSuccess) {
        c->napi->GroupEnd();
        return nccl_fail(c, err, r, "ncclSend/ncclRecv (all-to-all)");
    }
    return group_end(c, err, "all-to-all group");
}

#else /* !FSDP_HAVE_CUDA */

static int no_cuda(fsdp_err *err) {
    return fsdp_err_set(err, FSDP_E_DEVICE, "device collectives (NCCL): fsdp-run was built without CUDA");
}

int comm_dev_init(comm *c, fsdp_err *err) {
    (void)c;
    return no_cuda(err);
}
void comm_dev_release(comm *c) { (void)c; }
int comm_dev_allgatherv(comm *c, const void *send, void *recv, const size_t *bytes, void *stream, fsdp_err *err) {
    (void)c, (void)send, (void)recv, (void)bytes, (void)stream;
    return no_cuda(err);
}
int comm_dev_reduce_scatterv_f32(comm *c, const float *send, float *recv, const size_t *counts, void *stream,
                                 fsdp_err *err) {
    (void)c, (void)send, (void)recv, (void)counts, (void)stream;
    return no_cuda(err);
}
int comm_dev_allreduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op, void *stream, fsdp_err *err) {
    (void)c, (void)buf, (void)count, (void)dt, (void)op, (void)stream;
    return no_cuda(err);
}
int comm_dev_bcast(comm *c, void *buf, size_t bytes, int root, void *stream, fsdp_err *err) {
    (void)c, (void)buf, (void)bytes, (void)root, (void)stream;
    return no_cuda(err);
}
int comm_dev_alltoallv(comm *c, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes,
                       void *stream, fsdp_err *err) {
    (void)c, (void)send, (void)send_bytes, (void)recv, (void)recv_bytes, (void)stream;
    return no_cuda(err);
}

#endif

int comm_dev_ready(const comm *c) { return c && c->nccl != NULL; }
const char *comm_dev_backend(const comm *c) { return comm_dev_ready(c) ? "nccl" : NULL; }
