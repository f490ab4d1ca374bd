/* Key selections of the ckpt tools (see ckpt_keys.h). */
#include <stdlib.h>
#include <string.h>

#include "ckpt/namemap.h"
#include "cli/ckpt_keys.h"

int ckpt_keys_add(ckpt_keys *k, const char *arg) {
    const char *p = arg;
    for (;;) {
        const char *c = strchr(p, ',');
        size_t n = c ? (size_t)(c - p) : strlen(p);
        if (n == 0 || k->n == CKPT_KEYS_MAX) return -1;
        char *s = malloc(n + 1);
        if (!s) return -1;
        memcpy(s, p, n);
        s[n] = '\0';
        k->pat[k->n++] = s;
        if (!c) return 0;
        p = c + 1;
    }
}

int ckpt_keys_match(const ckpt_keys *k, const char *name) {
    for (size_t i = 0; i < k->n; i++) {
        const char *pt = k->pat[i];
        if (strchr(pt, '*') ? nmap_glob_match(pt, name, NULL) >= 0 : !strncmp(name, pt, strlen(pt))) return 1;
    }
    return 0;
}

void ckpt_keys_free(ckpt_keys *k) {
    for (size_t i = 0; i < k->n; i++) free(k->pat[i]);
    k->n = 0;
}

int ckpt_key_is_training(const char *name) {
    static const char *const pre[] = {"optimizer.", "train_state.", "lr_scheduler.", "dataloader."};
    for (size_t i = 0; i < sizeof pre / sizeof *pre; i++)
        if (!strncmp(name, pre[i], strlen(pre[i]))) return 1;
    return 0;
}
