/* Writing a record's payload at the speed of the page cache (issue 18): the payload is cut into
 * pieces (4 MiB of output by default) that several threads take in turn; each converts its piece
 * to the stored dtype into a per-thread buffer when the dtypes differ (no copy of the whole
 * array), takes its CRC-32 while it is in cache and writes it by pwrite at its offset. A buffered
 * write holds the inode lock for the whole call, so the kernel copies into one file run one at a
 * time: the threads overlap one piece's copy with the other pieces' conversion and CRC. Whole
 * pages of every written piece are handed to write-back at once (sync_file_range, no wait), so
 * that the one fsync at the end of the file finds little left to do.
 *
 * The bytes written and the CRC are those of one thread converting and writing the whole payload:
 * FSDP_SAVE_THREADS=1 selects that (sequential) path, FSDP_SAVE_THREADS=N (N > 1) N threads,
 * FSDP_SAVE_PIECE_KB=K the piece size; unset, the threads are the OpenMP team size (up to 8).
 *
 * Direct writes (the default; FSDP_SAVE_DIRECT=0 turns them off): a payload that starts at a
 * multiple of CKPT_DIRECT_ALIGN in the file (torch.save's zip writer puts large payloads there,
 * ckpt/zip_write.c) has its whole 4 KiB blocks written with O_DIRECT, each piece from the thread's
 * aligned buffer (converted or copied there, its CRC taken on the way), and only the last partial
 * block through the page cache. The page cache copy is what a buffered write of a large state costs,
 * and on a VM that returns idle memory to its host each copy into fresh cache pages pays host page
 * faults: 4 GB took 10-11 s buffered + fsync against 2.7 s direct on the 2-core VM, and a save of an
 * 8.4 GB state ran at 0.45 GB/s buffered. A file system that refuses O_DIRECT (tmpfs: EINVAL) gets
 * the buffered writes; the bytes are the same either way. */
#ifndef FSDP_CKPT_PWRITE_H
#define FSDP_CKPT_PWRITE_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt_pio.h"
#include "fsdp/error.h"
#include "fsdp/tensor.h"

/* The options of a checkpoint save from the environment (see above): piece 0 and threads 0
 * mean the defaults; writeback on; direct unless FSDP_SAVE_DIRECT=0. */
void ckpt_pwrite_opts_env(ckpt_pio_opts *o);

/* The piece size (bytes of output) the options give. */
size_t ckpt_pwrite_piece(const ckpt_pio_opts *o);

/* Writes n elements of src (src_dt) stored as dst_dt (converted with fsdp_convert's rounding
 * when they differ) at file offset off: n * size(dst_dt) bytes. *crc (when not NULL) receives
 * zlib's CRC-32 of the bytes written. On failure no piece is started after it, and the error
 * (whichever thread met it: the first failed piece's) names what, the byte and the system's
 * reason ("<what>: write error at byte B: No space left on device"); a dtype pair fsdp_convert
 * refuses is refused before any write. */
int ckpt_pwrite_conv(int fd, const void *src, fsdp_dtype src_dt, fsdp_dtype dst_dt, size_t n, uint64_t off,
                     uint32_t *crc, const char *what, const ckpt_pio_opts *o, fsdp_err *err);

/* Produces elements [e0, e0 + n) of a payload as float32 into dst (any thread, several at once). */
typedef int (*ckpt_gen_fn)(void *user, uint64_t e0, size_t n, float *dst, fsdp_err *err);

/* ckpt_pwrite_conv of n float32 values that gen produces piece by piece on the writing threads, each
 * into the thread's aligned write buffer (or a scratch piece, converted into it): producing one piece
 * overlaps the writes of the others, and no more than a piece per thread is ever held. A production
 * that fails stops the write with its error. */
int ckpt_pwrite_gen(int fd, ckpt_gen_fn gen, void *user, fsdp_dtype dst_dt, size_t n, uint64_t off, uint32_t *crc,
                    const char *what, const ckpt_pio_opts *o, fsdp_err *err);

/* Writes n bytes of src at file offset off; *crc (when not NULL) receives zlib's CRC32 of
 * them (the same value as crc32(0, src, n)). The pieces (o->piece, 4 MiB by default) are
 * CRC'd by o->threads threads and written in file order. */
int ckpt_pwrite_all(int fd, const void *src, size_t n, uint64_t off, uint32_t *crc, const char *what,
                    const ckpt_pio_opts *o, fsdp_err *err);

#endif
