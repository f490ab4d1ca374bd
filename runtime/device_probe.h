/* Which GPU a rank would use, found without creating a device context: the run's device choice
 * (runtime.device auto / cuda) checks that every rank has a GPU of its own before any stage puts
 * state on one (NCCL needs one GPU per rank). */
#ifndef FSDP_RUNTIME_DEVICE_PROBE_H
#define FSDP_RUNTIME_DEVICE_PROBE_H

#include "fsdp/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dev_probe_info {
    int count;              /* visible GPUs */
    int ordinal;            /* the GPU dev_ctx_create selects for this local rank */
    unsigned char uuid[16]; /* its UUID: the same physical GPU has the same UUID in every process */
    char name[256];         /* "NVIDIA H100 80GB HBM3" */
} dev_probe_info;

/* local_rank < 0: from the environment (dev_env_local_rank), 0 when unset. The selection is
 * dev_ctx_create's: GPU local_rank, or GPU 0 when local_rank >= count and exactly one GPU is
 * visible (CUDA_VISIBLE_DEVICES set per rank). FSDP_E_DEVICE when no GPU is usable (the CUDA
 * message), when the local rank has no GPU, or when built without CUDA. */
int dev_probe(int local_rank, dev_probe_info *out, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
