/* mempages_prefault (mempages.h). */
#include "runtime/mempages.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

void mempages_prefault(void *p, size_t n) {
#ifdef MADV_POPULATE_WRITE
    long pg = sysconf(_SC_PAGESIZE);
    if (n < ((size_t)64 << 10) || pg <= 0) return;
    uintptr_t mask = (uintptr_t)pg - 1, lo = (uintptr_t)p & ~mask, hi = ((uintptr_t)p + n + mask) & ~mask;
    (void)madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
#else
    (void)p, (void)n;
#endif
}
