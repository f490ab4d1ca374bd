/* Opening regular files without blocking on FIFOs (see fileio.h). */
#include "runtime/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *fio_type_name(mode_t mode) {
    if (S_ISREG(mode)) return "regular file";
    if (S_ISFIFO(mode)) return "FIFO";
    if (S_ISDIR(mode)) return "directory";
    if (S_ISSOCK(mode)) return "socket";
    if (S_ISCHR(mode)) return "character device";
    if (S_ISBLK(mode)) return "block device";
    if (S_ISLNK(mode)) return "symbolic link";
    return "special file";
}

int fio_open_raw(const char *path, int flags, int *fd, mode_t *mode) {
    *fd = -1;
    struct stat st;
    int f = open(path, flags | O_NONBLOCK | O_CLOEXEC, 0644);
    if (f < 0) {
        int e = errno;
        /* a FIFO without a reader refuses O_WRONLY | O_NONBLOCK with ENXIO */
        if (e == ENXIO && stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
            *mode = st.st_mode;
            return -1;
        }
        return e;
    }
    if (fstat(f, &st) != 0) {
        int e = errno;
        close(f);
        return e;
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        *mode = st.st_mode;
        return -1;
    }
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(f);
        return e;
    }
    *fd = f;
    return 0;
}

static int open_regular(const char *path, const char *label, int flags, int *fd, fsdp_err *err) {
    const char *what = label ? label : path;
    mode_t mode = 0;
    int e = fio_open_raw(path, flags, fd, &mode);
    if (e < 0) return fsdp_err_set(err, FSDP_E_IO, "%s is a %s, not a regular file", what, fio_type_name(mode));
    if (e) return fsdp_err_set(err, FSDP_E_IO, "%s: cannot open: %s", what, strerror(e));
    return 0;
}

int fio_open_read(const char *path, const char *label, int *fd, fsdp_err *err) {
    return open_regular(path, label, O_RDONLY, fd, err);
}

static int as_stream(int fd, const char *mode, const char *what, FILE **f, fsdp_err *err) {
    *f = fdopen(fd, mode);
    if (*f) return 0;
    int e = errno;
    close(fd);
    return fsdp_err_set(err, FSDP_E_IO, "%s: cannot open: %s", what, strerror(e));
}

int fio_fopen_read(const char *path, const char *label, FILE **f, fsdp_err *err) {
    int fd;
    *f = NULL;
    int rc = open_regular(path, label, O_RDONLY, &fd, err);
    return rc ? rc : as_stream(fd, "rb", label ? label : path, f, err);
}

int fio_fopen_append(const char *path, const char *label, FILE **f, fsdp_err *err) {
    int fd;
    *f = NULL;
    int rc = open_regular(path, label, O_WRONLY | O_APPEND | O_CREAT, &fd, err);
    return rc ? rc : as_stream(fd, "a", label ? label : path, f, err);
}

int fio_not_there_yet(const char *path) {
    struct stat st;
    if (!path || !*path || stat(path, &st) == 0 || errno != ENOENT) return 0;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') dir[--n] = '\0'; /* trailing slashes */
    char *slash = strrchr(dir, '/');
    if (!slash) return 1; /* relative to the working directory, which exists */
    if (slash == dir) return 0; /* in the root directory, which exists */
    *slash = '\0';
    return stat(dir, &st) != 0 && errno == ENOENT;
}

int fio_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno;
    int e = fsync(fd) == 0 ? 0 : errno;
    close(fd);
    return e;
}

int fio_fsync_parent(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) return fio_fsync_dir(".");
    slash[slash == dir] = '\0'; /* "/x" -> "/" */
    return fio_fsync_dir(dir);
}
