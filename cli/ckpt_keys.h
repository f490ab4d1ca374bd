/* Key selections of `fsdp-run ckpt convert --keys/--exclude` and `ckpt diff --ignore`: several
 * patterns (the option repeated, or one comma-separated list). A pattern with a '*' is a glob
 * over the whole name as in rename rules (ckpt/namemap.h): `*` matches within one dotted
 * component, `**` across components ("optimizer.**", "layers.*.attention.**"); a pattern without
 * one selects the keys it prefixes (the old `--keys PREFIX`). */
#ifndef FSDP_CLI_CKPT_KEYS_H
#define FSDP_CLI_CKPT_KEYS_H

#include <stddef.h>

#define CKPT_KEYS_MAX 64

typedef struct ckpt_keys {
    char *pat[CKPT_KEYS_MAX];
    size_t n;
} ckpt_keys;

/* Adds the comma-separated patterns of arg; -1 when there would be more than CKPT_KEYS_MAX, an
 * empty one or no memory. */
int ckpt_keys_add(ckpt_keys *k, const char *arg);
/* 1 when name matches one of the patterns. */
int ckpt_keys_match(const ckpt_keys *k, const char *name);
void ckpt_keys_free(ckpt_keys *k);

/* Whether a key is a training entry rather than a model weight: optimizer.*, train_state.*,
 * lr_scheduler.*, dataloader.* (torchtitan's layout). */
int ckpt_key_is_training(const char *name);

#endif
