/* Private to train/train_fsdp_cuda*.c: CUDA events recorded on one of the device context's
 * streams and waited on by another (finer than dev_stream_wait, which orders a stream after
 * everything queued so far on another). Every failure is FSDP_E_DEVICE naming the call; without
 * CUDA every function fails with "built without CUDA". */
#ifndef FSDP_TRAIN_TRAIN_FSDP_CUDA_EVENT_H
#define FSDP_TRAIN_TRAIN_FSDP_CUDA_EVENT_H

#include "fsdp/error.h"
#include "runtime/device.h"

int train_fsdp_cuda_event_create(dev_event *e, fsdp_err *err);
void train_fsdp_cuda_event_destroy(dev_event e);
/* Marks the work queued so far on stream k. */
int train_fsdp_cuda_event_record(dev_ctx *d, dev_event e, dev_stream_kind k, fsdp_err *err);
/* Work queued on stream k after this call waits for the last recording of e (none: no wait). */
int train_fsdp_cuda_event_wait(dev_ctx *d, dev_stream_kind k, dev_event e, fsdp_err *err);
/* Blocks the host until the last recording of e completed. */
int train_fsdp_cuda_event_sync(dev_event e, fsdp_err *err);

#endif
