/* Internals shared by the ckpt_reader backends. */
#ifndef FSDP_CKPT_READER_IMPL_H
#define FSDP_CKPT_READER_IMPL_H

#include "ckpt/reader.h"

typedef struct ckpt_ops {
    int (*read_rows)(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dst_dt, fsdp_err *err);
    const char *(*value_text)(ckpt_reader *r, size_t i);
    void (*close)(ckpt_reader *r);
} ckpt_ops;

struct ckpt_reader {
    const ckpt_ops *ops;
    ckpt_format format;
    char *path;
    ckpt_entry *entries;
    size_t n;
    void *impl;
};

int ckpt_open_safetensors(const char *path, ckpt_reader **out, fsdp_err *err);
int ckpt_open_dcp(const char *path, ckpt_reader **out, fsdp_err *err);
int ckpt_open_pt(const char *path, ckpt_reader **out, fsdp_err *err);

#endif
