/* A durable, atomic copy of a finished file (module prefix fcopy_): save-safetensors' `copies`
 * (Bagel HEAD's ema.safetensors beside model.safetensors, the same bytes). The bytes go from file to
 * file with copy_file_range(2), so the kernel may share extents (reflink on XFS/Btrfs) or copy them
 * without user-space buffers; where it cannot (another file system, no support: EXDEV, ENOSYS,
 * EOPNOTSUPP, EINVAL) they are read and written in pieces of 1 MiB. The copy is written as
 * `<dst>.tmp` (locked by its writer, runtime/tmpfile.h), fsynced, checked to hold the source's size
 * and renamed onto dst, then the directory is fsynced: dst holds the old file or the whole copy at
 * every instant, never part of one. */
#ifndef FSDP_CKPT_FILE_COPY_H
#define FSDP_CKPT_FILE_COPY_H

#include <stdint.h>

#include "fsdp/error.h"

/* Copies src onto dst as above; *bytes (may be NULL) receives the size copied. On failure dst is
 * untouched and the temporary removed. */
int fcopy_atomic(const char *src, const char *dst, uint64_t *bytes, fsdp_err *err);

#endif
