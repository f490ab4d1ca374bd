/* NCCL, loaded when the first device communicator is made (module prefix nccl_api_).
 *
 * fsdp-run does not link libnccl: a run on the CPU (and every `--version`, `validate`, `ckpt`, ...)
 * then starts without mapping it. nccl_api_load dlopens `libnccl.so.<major>` (the executable's RPATH,
 * LD_LIBRARY_PATH and the system's paths are searched, as for cuBLAS: runtime/device_blas.c) and looks
 * up the functions runtime/comm_nccl.c calls. A build with FSDP_NCCL_LINKED=1 (the emulated device's,
 * whose NCCL is linked in) takes their addresses instead. */
#ifndef FSDP_RUNTIME_NCCL_API_H
#define FSDP_RUNTIME_NCCL_API_H

#include "fsdp/error.h"

#if FSDP_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#ifdef __cplusplus
extern "C" { /* the CUDA headers above are C++ in C++ (the tests include this file as it is) */
#endif

typedef struct nccl_api {
    const char *(*GetErrorString)(ncclResult_t);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                  cudaStream_t);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*Reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
} nccl_api;

/* Every field of nccl_api, for X(field) (the function is nccl<field>). */
#define NCCL_API_FNS(X)                                                                                        \
    X(GetErrorString) X(GetUniqueId) X(CommInitRank) X(CommDestroy) X(GroupStart) X(GroupEnd) X(AllGather) \
    X(ReduceScatter) X(AllReduce) X(Reduce) X(Broadcast) X(Send) X(Recv)

/* Fills api (FSDP_E_DEVICE naming the library or the missing symbol when it cannot). The library
 * stays loaded for the process's life (NCCL's own threads may outlive a communicator). */
int nccl_api_load(nccl_api *api, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif

#endif
