/* Temporaries left by interrupted checkpoint writers (see ckpt_stale.h). */
#include "ckpt/ckpt_stale.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int ckpt_stale_owned(const char *name) {
    static const char *const OWNED[] = {".distcp.tmp", ".metadata.tmp", ".safetensors.tmp",
                                        ".safetensors.index.json.tmp"};
    for (size_t i = 0; i < sizeof OWNED / sizeof *OWNED; i++)
        if (has_suffix(name, OWNED[i])) return 1;
    return 0;
}

int ckpt_stale_sweep(const char *path, tmpf_note_fn note, void *user) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return tmpf_sweep(path, ckpt_stale_owned, note, user);
    size_t n = strlen(path) + 5;
    char *tmp = malloc(n);
    if (!tmp) return 0;
    snprintf(tmp, n, "%s.tmp", path);
    const char *base = strrchr(tmp, '/');
    int removed = ckpt_stale_owned(base ? base + 1 : tmp) ? tmpf_remove_if_stale(tmp, note, user) : 0;
    free(tmp);
    return removed;
}

int ckpt_stale_count(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d) return 0;
        int n = 0;
        struct dirent *de;
        while ((de = readdir(d))) n += ckpt_stale_owned(de->d_name);
        closedir(d);
        return n;
    }
    size_t len = strlen(path) + 5;
    char *tmp = malloc(len);
    if (!tmp) return 0;
    snprintf(tmp, len, "%s.tmp", path);
    const char *base = strrchr(tmp, '/');
    int n = ckpt_stale_owned(base ? base + 1 : tmp) && lstat(tmp, &st) == 0;
    free(tmp);
    return n;
}

int ckpt_stale_report(const char *path, tmpf_note_fn note, void *user) {
    int n = ckpt_stale_count(path);
    if (n > 0)
        tmpf_notef(note, user,
                   "%s: %d temporar%s of an interrupted (or still running) save; `fsdp-run ckpt clean %s` removes them",
                   path, n, n == 1 ? "y" : "ies", path);
    return n;
}
