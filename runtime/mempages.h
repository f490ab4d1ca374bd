/* Faulting memory in ahead of its first write (module prefix mempages_). */
#ifndef FSDP_RUNTIME_MEMPAGES_H
#define FSDP_RUNTIME_MEMPAGES_H

#include <stddef.h>

/* The pages under [p, p + n) faulted in for writing in one call (madvise MADV_POPULATE_WRITE, Linux 5.14)
 * before a read or a fill writes them: fresh memory then costs the kernel's zeroing of each page but not a
 * trap per page (the 2-rank load of llama3_1b, 1 GB per rank from the page cache with its CRC and NaN checks:
 * 0.58-0.73 s -> 0.44-0.53 s in a probe of the read loop, 0.61 -> 0.45 s in build/bench/ckpt_vs_torch; init-meta
 * of it 0.87 -> 0.75 s). Callers call it per piece of 1-2 MiB, so that the zeroed pages are still in cache when
 * they are written. The contents
 * are not changed; below 64 KiB, or where the kernel or the memory refuses, nothing is done (the writes then
 * fault the pages in as before). */
void mempages_prefault(void *p, size_t n);

#endif
