/* Temporaries left by interrupted checkpoint writers (see ckpt_stale.h). */
#include "ckpt/ckpt_stale.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
