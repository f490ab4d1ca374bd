/* Parallel positional file I/O for checkpoints: large reads and writes split into pieces
 * that several threads (OpenMP) move at once, since one thread copying from or into the
 * page cache reaches only a fraction of the memory bandwidth. Writes also compute the zip
 * CRC32 of what they write (per piece, combined with zlib's crc32_combine) while the piece
 * is in cache, and can start the kernel's write-back of the range at once (sync_file_range)
 * so that the final fsync finds little left to do. */
#ifndef FSDP_CKPT_PIO_H
#define FSDP_CKPT_PIO_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/tensor.h"

/* Pieces and threads of a transfer; 0 picks the defaults (up to 8 threads, or
 * omp_get_max_threads() when smaller; 8 MiB pieces, smaller down to 1 MiB so that every thread
 * gets one). Transfers of one piece run on the calling thread. */
typedef struct ckpt_pio_opts {
    size_t piece;
    int threads;
    int writeback; /* writes: start write-back of each written range (no wait) */
    int direct;    /* writes: the payload's whole 4 KiB blocks with O_DIRECT when its offset allows (ckpt_pwrite.h) */
} ckpt_pio_opts;

/* The alignment of a payload written with O_DIRECT: the file offset, the length of each direct write
 * and the address of its buffer are multiples of it (the largest logical block size of common devices). */
#define CKPT_DIRECT_ALIGN ((size_t)4096)

/* A buffer of bytes for O_DIRECT writes (freed with free()), NULL when out of memory: aligned to
 * CKPT_DIRECT_ALIGN and, from 1 MiB on, on transparent huge pages (2 MiB-aligned, its size rounded up to
 * whole 2 MiB, madvise MADV_HUGEPAGE where the kernel has it). A direct write goes to the device as one request
 * per contiguous run of physical memory up to the queue's segment limit: from 4 KiB pages, virtio-blk's 254
 * segments cut every 1 MiB write into a 1016 KiB and an 8 KiB request (NVMe's 127-255 segments alike), from
 * huge pages each is one request (convert_moe HF -> DCP 0.93-1.00 -> 1.03-1.06 of cp, DCP -> HF 0.87-0.91 ->
 * 1.11-1.12, block-layer trace: 405 + 537 write requests -> 268). The kernel falls back to small pages where
 * it has no huge page to give (under its defrag setting, after trying to compact memory for one: the buffers are
 * allocated once per copy ring and once per payload a save converts or produces, not per piece). */
void *ckpt_dio_alloc(size_t bytes);

/* The threads of a parallel transfer: o->threads when set, else the OpenMP team's size capped at 8
 * (1 when built without OpenMP). */
int ckpt_pio_threads(const ckpt_pio_opts *o);

/* pwrite of all n bytes of p at off, in write(2) calls of at most CKPT_WRITE_SLICE bytes (restarted on
 * EINTR): 0, or the errno (EIO for a write that took no byte) with *at the first byte not written.
 * The page cache sizes its folios by the write call: a call of 4 MiB or more gets 2 MiB folios, taken
 * from the free blocks that a VM's free page reporting gives back to the host, whose re-faults made
 * each copy into them 3x slower (save-dcp of 2 GB 2.7 s against 0.72 s in 1 MiB calls, measured after
 * a few idle seconds on the 2-core VM); 1 MiB calls cost nothing measurable when memory is warm. */
#define CKPT_WRITE_SLICE ((size_t)1 << 20)
int ckpt_pwrite_sliced(int fd, const void *p, size_t n, uint64_t off, uint64_t *at);

/* Reads exactly n bytes at file offset off into dst (ckpt_pread.c, the read engine). A file that ends early is a format
 * error "<what>: the file ends before byte B (truncated?)", naming the first missing byte. */
int ckpt_pread_all(int fd, void *dst, size_t n, uint64_t off, const char *what, const ckpt_pio_opts *o,
                   fsdp_err *err);

/* The same, and *crc receives zlib's CRC32 of the bytes read, computed by each thread over
 * each 1 MiB it has just read (while in cache), the pieces combined with crc32_combine. */
int ckpt_pread_crc(int fd, void *dst, size_t n, uint64_t off, uint32_t *crc, const char *what,
                   const ckpt_pio_opts *o, fsdp_err *err);

/* Copies n bytes (memcpy) with the same pieces and threads. */
void ckpt_copy_par(void *dst, const void *src, size_t n, const ckpt_pio_opts *o);

/* fsdp_convert of n elements, on several threads for large n (pieces of o->piece bytes of
 * the wider dtype). */
int ckpt_convert_par(void *dst, fsdp_dtype dst_dt, const void *src, fsdp_dtype src_dt, size_t n,
                     const ckpt_pio_opts *o, fsdp_err *err);

#endif
