/* fcopy_atomic (file_copy.h). */
#include "ckpt/file_copy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_pio.h"
#include "runtime/crash.h"
#include "runtime/fileio.h"
#include "runtime/tmpfile.h"

#define PIECE ((size_t)1 << 20)

/* read + write from offset off on, when copy_file_range cannot */
static int copy_buffered(int in, int out, uint64_t off, uint64_t size, const char *tmp, fsdp_err *err) {
    char *buf = malloc(PIECE);
    if (!buf) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    ckpt_pio_opts o = {0, 1, 0, 0}; /* one thread: pieces of 1 MiB */
    int rc = 0;
    for (; off < size && !rc; off += PIECE) {
        size_t want = size - off < PIECE ? (size_t)(size - off) : PIECE;
        uint64_t at = 0;
        rc = ckpt_pread_all(in, buf, want, off, "the source", &o, err);
        int e = rc ? 0 : ckpt_pwrite_sliced(out, buf, want, off, &at);
        if (e) rc = fsdp_err_set(err, FSDP_E_IO, "%s: write error at byte %llu: %s", tmp, (unsigned long long)at, strerror(e));
    }
    free(buf);
    return rc;
}

static int copy_bytes(int in, int out, uint64_t size, const char *tmp, fsdp_err *err) {
    uint64_t off = 0;
    while (off < size) {
        loff_t a = (loff_t)off, b = (loff_t)off;
        size_t want = size - off < ((size_t)1 << 30) ? (size_t)(size - off) : ((size_t)1 << 30);
        ssize_t k = copy_file_range(in, &a, out, &b, want, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL))
            return copy_buffered(in, out, off, size, tmp, err);
        if (k < 0) return fsdp_err_set(err, FSDP_E_IO, "%s: copy_file_range: %s", tmp, strerror(errno));
        if (k == 0) return fsdp_err_set(err, FSDP_E_IO, "%s: the source ended at byte %llu of %llu", tmp,
                                        (unsigned long long)off, (unsigned long long)size);
        off += (uint64_t)k;
    }
    return 0;
}


int fcopy_atomic(const char *src, const char *dst, uint64_t *bytes, fsdp_err *err) {
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) return fsdp_err_set(err, FSDP_E_IO, "cannot open %s: %s", src, strerror(errno));
    struct stat st;
    if (fstat(in, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(in);
        return fsdp_err_set(err, FSDP_E_IO, "%s is not a regular file", src);
    }
    size_t n = strlen(dst) + 5;
    char *tmp = malloc(n);
    if (!tmp) {
        close(in);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    snprintf(tmp, n, "%s.tmp", dst);
    int out, rc = tmpf_create(tmp, &out, NULL, NULL, err);
    if (!rc) {
        rc = copy_bytes(in, out, (uint64_t)st.st_size, tmp, err);
        struct stat so = {0};
        if (!rc && (fstat(out, &so) != 0 || so.st_size != st.st_size))
            rc = fsdp_err_set(err, FSDP_E_IO, "%s: holds %lld bytes, the source %lld", tmp, (long long)so.st_size,
                              (long long)st.st_size);
        if (!rc && fsync(out) != 0) rc = fsdp_err_set(err, FSDP_E_IO, "%s: fsync failed: %s", tmp, strerror(errno));
        if (!rc) crash_point("st.copy.synced", 1, -1);
        /* renamed while still open: the lock covers the temporary until it has its final name */
        if (!rc && rename(tmp, dst) != 0)
            rc = fsdp_err_set(err, FSDP_E_IO, "cannot rename %s to %s: %s", tmp, dst, strerror(errno));
        if (rc) unlink(tmp);
        if (close(out) != 0 && !rc) rc = fsdp_err_set(err, FSDP_E_IO, "%s: close failed: %s", dst, strerror(errno));
        if (!rc) (void)fio_fsync_parent(dst); /* not every file system syncs directories */
    }
    close(in);
    free(tmp);
    if (!rc && bytes) *bytes = (uint64_t)st.st_size;
    return rc;
}
