/* CRC-32 (the zip / gzip polynomial) of checkpoint bytes: one implementation for every reader and
 * writer. libdeflate's (carry-less multiply where the CPU has it, several times zlib 1.2's rate);
 * the values are zlib's crc32 exactly, and zlib's crc32_combine joins pieces. */
#ifndef FSDP_CKPT_CRC32_H
#define FSDP_CKPT_CRC32_H

#include <stddef.h>
#include <stdint.h>

#include <libdeflate.h>
#include <zlib.h>

/* the CRC of p[0..n) continued from crc (0 to start) */
static inline uint32_t ckpt_crc32(uint32_t crc, const void *p, size_t n) { return n ? libdeflate_crc32(crc, p, n) : crc; }

/* the CRC of A followed by B, from crc(A), crc(B) and B's length */
static inline uint32_t ckpt_crc32_combine(uint32_t a, uint32_t b, uint64_t len_b) {
    return (uint32_t)crc32_combine(a, b, (z_off_t)len_b);
}

#endif
