/* GPU selection without a device context (device_probe.h). */
#include "runtime/device_probe.h"

#include <stdio.h>
#include <string.h>

#include "runtime/device_internal.h"

#if FSDP_HAVE_CUDA

int dev_probe(int local_rank, dev_probe_info *out, fsdp_err *err) {
    memset(out, 0, sizeof *out);
    out->ordinal = -1;
    int count = 0;
    int rc = dev_count(&count, err);
    if (rc) return rc;
    out->count = count;
    int lr = local_rank;
    if (lr < 0) {
        if ((rc = dev_env_local_rank(&lr, err))) return rc;
        if (lr < 0) lr = 0;
    }
    int ord = lr;
    if (lr >= count) {
        if (count != 1)
            return fsdp_err_set(err, FSDP_E_DEVICE, "local rank %d needs GPU %d but only %d GPUs are visible", lr, lr,
                                count);
        ord = 0;
    }
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, ord);
    if (e != cudaSuccess) return dev_cuda_fail(err, e, "cudaGetDeviceProperties(%d)", ord);
    out->ordinal = ord;
    memcpy(out->uuid, prop.uuid.bytes, sizeof out->uuid);
    snprintf(out->name, sizeof out->name, "%s", prop.name);
    return FSDP_OK;
}

#else

int dev_probe(int local_rank, dev_probe_info *out, fsdp_err *err) {
    (void)local_rank;
    memset(out, 0, sizeof *out);
    out->ordinal = -1;
    return dev_err_no_cuda(err, "dev_probe");
}

#endif
