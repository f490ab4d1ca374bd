/* The step-<N> directories of periodic checkpoints (see ckpt_steps.h). */
#include "ckpt/ckpt_steps.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/crash.h"
#include "runtime/fileio.h"

int ckpt_steps_is_latest(const char *path, char *base, size_t cap) {
    const char *slash = strrchr(path, '/');
    const char *last = slash ? slash + 1 : path;
    if (strcmp(last, "latest")) return 0;
    struct stat st;
    if (lstat(path, &st) == 0) return 0; /* a real file or directory of that name */
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n + 2 > cap) return 0;
    if (!slash) snprintf(base, cap, ".");
    else if (n == 0) snprintf(base, cap, "/");
    else snprintf(base, cap, "%.*s", (int)n, path);
    return 1;
}

void ckpt_steps_dir(char *out, size_t cap, const char *base, int64_t step) {
    snprintf(out, cap, "%s/step-%" PRId64, base, step);
}

int ckpt_steps_hint(const char *base, char *out, size_t cap) {
    ckpt_step_dir *v;
    size_t n, off = 0;
    fsdp_err e;
    out[0] = '\0';
    if (ckpt_steps_list(base, &v, &n, &e) || !n) return 0;
    int64_t newest = -1;
    off += (size_t)snprintf(out, cap, "it holds");
    for (size_t i = 0; i < n && off < cap; i++) {
        if (v[i].committed) newest = v[i].step;
        off += (size_t)snprintf(out + off, cap - off, "%s step-%" PRId64 "%s", i ? "," : "", v[i].step,
                                v[i].committed ? "" : " (not committed: no .metadata)");
    }
    if (off < cap && newest >= 0)
        snprintf(out + off, cap - off, ": load %s/step-%" PRId64 " (a step) or %s/latest (the newest committed)", base,
                 newest, base);
    else if (off < cap)
        snprintf(out + off, cap - off, ", none committed");
    free(v);
    return 1;
}

/* N of a name step-<N> as ckpt_steps_dir writes it (digits only, no sign, no leading zero); -1 otherwise */
static int64_t name_step(const char *name) {
    if (strncmp(name, "step-", 5) || !name[5] || (name[5] == '0' && name[6])) return -1;
    int64_t v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static int is_committed(const char *base, const char *name) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s/.metadata", base, name);
    struct stat st;
    return lstat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_step(const void *a, const void *b) {
    int64_t x = ((const ckpt_step_dir *)a)->step, y = ((const ckpt_step_dir *)b)->step;
    return (x > y) - (x < y);
}

int ckpt_steps_list(const char *base, ckpt_step_dir **out, size_t *n, fsdp_err *err) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(base);
    if (!d) {
        if (errno == ENOENT) return 0;
        return fsdp_err_set(err, FSDP_E_IO, "cannot list the checkpoints in %s: %s", base, strerror(errno));
    }
    ckpt_step_dir *v = NULL;
    size_t k = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t step = name_step(de->d_name);
        if (step < 0) continue;
        char p[4400];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", base, de->d_name);
        if (lstat(p, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        if (k == cap) {
            cap = cap ? cap * 2 : 16;
            ckpt_step_dir *nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory listing %s", base);
                break;
            }
            v = nv;
        }
        v[k].step = step;
        v[k].committed = is_committed(base, de->d_name);
        k++;
    }
    closedir(d);
    if (rc) {
        free(v);
        return rc;
    }
    if (k) qsort(v, k, sizeof *v, cmp_step);
    *out = v;
    *n = k;
    return 0;
}

int ckpt_steps_latest(const char *base, int64_t *step, fsdp_err *err) {
    *step = -1;
    ckpt_step_dir *v;
    size_t n;
    int rc = ckpt_steps_list(base, &v, &n, err);
    if (rc) return rc;
    for (size_t i = n; i-- > 0;)
        if (v[i].committed) {
            *step = v[i].step;
            break;
        }
    free(v);
    return 0;
}


/* un-commit (unlink .metadata, sync base), then the files, then the directory */
static int remove_step_dir(const char *base, int64_t step, tmpf_note_fn note, void *user) {
    char dir[4200], p[4400];
    ckpt_steps_dir(dir, sizeof dir, base, step);
    snprintf(p, sizeof p, "%s/.metadata", dir);
    if (unlink(p) != 0 && errno != ENOENT) {
        tmpf_notef(note, user, "keep_last: cannot remove %s: %s", p, strerror(errno));
        return 0;
    }
    (void)fio_fsync_dir(dir);
    crash_point("steps.uncommitted", 1, 0);
    DIR *d = opendir(dir);
    if (!d) {
        tmpf_notef(note, user, "keep_last: cannot list %s: %s", dir, strerror(errno));
        return 0;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (unlink(p) != 0) tmpf_notef(note, user, "keep_last: cannot remove %s: %s", p, strerror(errno));
    }
    closedir(d);
    if (rmdir(dir) != 0) {
        tmpf_notef(note, user, "keep_last: cannot remove %s: %s", dir, strerror(errno));
        return 0;
    }
    return 1;
}

int ckpt_steps_prune(const char *base, int64_t keep, int64_t newest, tmpf_note_fn note, void *user) {
    if (keep <= 0) return 0;
    ckpt_step_dir *v;
    size_t n;
    fsdp_err e;
    if (ckpt_steps_list(base, &v, &n, &e)) {
        tmpf_notef(note, user, "keep_last: %s", e.msg);
        return 0;
    }
    int removed = 0;
    int64_t kept = 0;
    for (size_t i = n; i-- > 0;) {
        if (v[i].step > newest) {
            kept += v[i].committed; /* a later run's, or a later save's: counted, never removed */
            continue;
        }
        if (v[i].committed && kept < keep) {
            kept++;
            continue;
        }
        if (v[i].step == newest) continue; /* never this save's own directory */
        removed += remove_step_dir(base, v[i].step, note, user);
    }
    free(v);
    return removed;
}
