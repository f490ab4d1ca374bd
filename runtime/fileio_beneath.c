/* Opening a file of a checkpoint without leaving the checkpoint's directory (see fileio.h).
 *
 * openat2(2) with RESOLVE_BENEATH resolves the name (symlinks included) inside the directory and
 * refuses any step out of it (an absolute link, "..", a link to elsewhere) with EXDEV, atomically:
 * nothing can swap a component between the check and the open. Kernels before 5.6 (ENOSYS) and
 * sandboxes that filter the call (EPERM) get the portable fallback: realpath(3) of the name, checked
 * to lie under the directory's own realpath, then opened with O_NOFOLLOW (a link planted between
 * the check and the open is refused, not followed). FSDP_NO_OPENAT2=1 forces the fallback (tests). */
#include "runtime/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int fio_open_dir(const char *dir, int *dfd, fsdp_err *err) {
    *dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*dfd < 0) return fsdp_err_set(err, FSDP_E_IO, "cannot open the directory %s: %s", dir, strerror(errno));
    return 0;
}

static int use_openat2(void) {
    const char *s = getenv("FSDP_NO_OPENAT2");
    return !(s && *s && strcmp(s, "0"));
}

/* openat2 beneath dfd: the fd, or -1 with errno (ENOSYS when the kernel or a filter lacks it) */
static int open_beneath2(int dfd, const char *name) {
#ifdef SYS_openat2
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    return (int)syscall(SYS_openat2, dfd, name, &how, sizeof how);
#else
    (void)dfd, (void)name;
    errno = ENOSYS;
    return -1;
#endif
}

/* the portable way: the name's realpath must lie under the directory's */
static int open_beneath_rp(int dfd, const char *name) {
    char self[64], real_dir[PATH_MAX], joined[PATH_MAX + 256], real[PATH_MAX];
    snprintf(self, sizeof self, "/proc/self/fd/%d", dfd);
    ssize_t n = readlink(self, real_dir, sizeof real_dir - 1);
    if (n <= 0) return -1;
    real_dir[n] = '\0';
    if (snprintf(joined, sizeof joined, "%s/%s", real_dir, name) >= (int)sizeof joined) {
        errno = ENAMETOOLONG;
        return -1;
    }
    if (!realpath(joined, real)) return -1;
    size_t k = strlen(real_dir);
    int inside = !strcmp(real_dir, "/") ? real[0] == '/' : !strncmp(real, real_dir, k) && real[k] == '/';
    if (!inside) {
        errno = EXDEV;
        return -1;
    }
    return open(real, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
}

/* "<dir>/<name> is a symbolic link to <target>, outside <dir>" (or the component that leads out) */
static int escape_error(int dfd, const char *dir, const char *name, fsdp_err *err) {
    char target[PATH_MAX];
    ssize_t n = readlinkat(dfd, name, target, sizeof target - 1);
    if (n > 0) {
        target[n] = '\0';
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s/%s is a symbolic link to %s, which leads out of %s: refused (a checkpoint's files "
                            "must lie in its directory; a link to a file inside it is followed)",
                            dir, name, target, dir);
    }
    return fsdp_err_set(err, FSDP_E_FORMAT,
                        "%s/%s: its path leads out of %s through a symbolic link: refused (a checkpoint's files must "
                        "lie in its directory)",
                        dir, name, dir);
}

int fio_open_beneath(int dfd, const char *dir, const char *name, int *fd, fsdp_err *err) {
    *fd = -1;
    int f = use_openat2() ? open_beneath2(dfd, name) : (errno = ENOSYS, -1);
    if (f < 0 && (errno == ENOSYS || errno == EPERM)) f = open_beneath_rp(dfd, name);
    if (f < 0) {
        int e = errno;
        int rc = e == EXDEV || e == ELOOP ? escape_error(dfd, dir, name, err)
                                          : fsdp_err_set(err, FSDP_E_IO, "%s: cannot open %s: %s", dir, name, strerror(e));
        errno = e;
        return rc;
    }
    struct stat st;
    if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        close(f);
        if (S_ISREG(st.st_mode)) return fsdp_err_set(err, FSDP_E_IO, "%s: cannot open %s: %s", dir, name, strerror(e));
        return fsdp_err_set(err, FSDP_E_IO, "%s: %s is a %s, not a regular file", dir, name, fio_type_name(st.st_mode));
    }
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(f);
        return fsdp_err_set(err, FSDP_E_IO, "%s: cannot open %s: %s", dir, name, strerror(e));
    }
    *fd = f;
    return 0;
}
