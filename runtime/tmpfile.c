/* Lock-marked temporary files and the sweep of stale ones (see tmpfile.h). */
#include "runtime/tmpfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/crash.h"
#include "runtime/fileio.h"

void tmpf_notef(tmpf_note_fn note, void *user, const char *fmt, ...) {
    if (!note) return;
    char msg[4600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    note(user, msg);
}

/* 1 when fd is still the file at path (nobody unlinked or replaced it since it was opened) */
static int still_at(int fd, const char *path) {
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int tmpf_remove_if_stale(const char *path, tmpf_note_fn note, void *user) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat st;
    int removed = 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0 && still_at(fd, path)) {
        if (unlink(path) == 0) {
            removed = 1;
            tmpf_notef(note, user, "removed stale temporary %s (%lld bytes) left by an interrupted save", path,
                       (long long)st.st_size);
        } else {
            tmpf_notef(note, user, "cannot remove the stale temporary %s (%lld bytes): %s", path,
                       (long long)st.st_size, strerror(errno));
        }
    }
    close(fd); /* drops the lock */
    return removed;
}

int tmpf_in_use(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return 0;
    int busy = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);
    return busy;
}

static void nap_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* One attempt: 0 done (*fd set), 1 try again, else an error code. */
static int create_once(const char *path, int *fd, tmpf_note_fn note, void *user, fsdp_err *err) {
    int f = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NONBLOCK | O_CLOEXEC, 0644);
    if (f < 0 && errno == EEXIST) {
        struct stat st;
        if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
            return fsdp_err_set(err, FSDP_E_IO, "%s is a %s, not a regular file (remove it to save here)", path,
                                fio_type_name(st.st_mode));
        if (tmpf_remove_if_stale(path, note, user)) return 1;
        if (lstat(path, &st) != 0) return 1; /* gone meanwhile */
        return fsdp_err_set(err, FSDP_E_IO,
                            "%s is being written by another process (its writer holds the lock); is another save "
                            "to the same path running?",
                            path);
    }
    if (f < 0) return fsdp_err_set(err, FSDP_E_IO, "cannot create %s: %s", path, strerror(errno));
    /* a sweep that opened it between our create and our lock holds the lock for a moment and then
     * unlinks it: wait for the lock, then make sure the file is still ours */
    for (int i = 0; flock(f, LOCK_EX | LOCK_NB) != 0; i++) {
        if (errno != EWOULDBLOCK || i >= 200) {
            int e = errno;
            close(f);
            return fsdp_err_set(err, FSDP_E_IO, "cannot lock %s: %s", path, strerror(e));
        }
        nap_ms(5);
    }
    if (!still_at(f, path)) {
        close(f);
        return 1;
    }
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(f);
        unlink(path);
        return fsdp_err_set(err, FSDP_E_IO, "cannot create %s: %s", path, strerror(e));
    }
    *fd = f;
    return 0;
}

int tmpf_create(const char *path, int *fd, tmpf_note_fn note, void *user, fsdp_err *err) {
    *fd = -1;
    for (int attempt = 0; attempt < 20; attempt++) {
        int rc = create_once(path, fd, note, user, err);
        if (rc != 1) return rc;
    }
    return fsdp_err_set(err, FSDP_E_IO, "cannot create %s: it keeps being replaced by another process", path);
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int tmpf_sweep(const char *dir, int (*owned)(const char *name), tmpf_note_fn note, void *user) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!has_suffix(de->d_name, ".tmp") || (owned && !owned(de->d_name))) continue;
        size_t n = strlen(dir) + strlen(de->d_name) + 2;
        char *p = malloc(n);
        if (!p) break;
        snprintf(p, n, "%s/%s", dir, de->d_name);
        removed += tmpf_remove_if_stale(p, note, user);
        free(p);
    }
    closedir(d);
    return removed;
}

static void crash_after(const char *prefix, const char *step) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s", prefix, step);
    crash_point(name, 1, -1);
}

int tmpf_write_replace(const char *tmp, const char *fin, const void *buf, size_t len, const char *crash_prefix,
                       fsdp_err *err) {
    int fd;
    int rc = tmpf_create(tmp, &fd, NULL, NULL, err);
    if (rc) return rc;
    const unsigned char *p = buf;
    for (size_t left = len; left && !rc;) {
        ssize_t k = write(fd, p, left);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) rc = fsdp_err_set(err, FSDP_E_IO, "cannot write %s: %s", tmp, k < 0 ? strerror(errno) : "no progress");
        else p += k, left -= (size_t)k;
    }
    if (!rc) crash_after(crash_prefix, "written");
    if (!rc && fsync(fd) != 0) rc = fsdp_err_set(err, FSDP_E_IO, "cannot write %s: %s", tmp, strerror(errno));
    if (!rc) crash_after(crash_prefix, "synced");
    if (!rc && rename(tmp, fin) != 0) rc = fsdp_err_set(err, FSDP_E_IO, "cannot rename %s: %s", tmp, strerror(errno));
    if (!rc) crash_after(crash_prefix, "renamed");
    if (rc) unlink(tmp);
    close(fd);
    return rc;
}
