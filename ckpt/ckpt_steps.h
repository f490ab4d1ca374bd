/* The periodic checkpoints of a run: `step-<N>` directories under one base directory, each a DCP
 * checkpoint that is committed once its `.metadata` exists (ckpt/dcp_commit.c writes it last).
 *
 *   - the newest committed step (resume-latest: `load-ckpt path: DIR/latest`), skipping directories
 *     without `.metadata` (a save killed before its commit);
 *   - keep_last K: after step N is committed, the committed directories older than the K newest go,
 *     and so do the incomplete ones older than N. A directory is un-committed first (its `.metadata`
 *     unlinked, the base directory synced), then emptied and removed, so a kill at any point leaves
 *     at least K committed checkpoints and at worst an incomplete directory, which resume skips. */
#ifndef FSDP_CKPT_CKPT_STEPS_H
#define FSDP_CKPT_CKPT_STEPS_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "runtime/tmpfile.h"

typedef struct ckpt_step_dir {
    int64_t step;
    int committed; /* holds a `.metadata` */
} ckpt_step_dir;

/* "DIR/latest" when the last component of path is `latest` and path itself does not exist: 1 with
 * DIR (without the component) in base; 0 otherwise. */
int ckpt_steps_is_latest(const char *path, char *base, size_t cap);
/* The step-<N> directories of base sorted by step (*out malloc'd; none when base does not exist). */
int ckpt_steps_list(const char *base, ckpt_step_dir **out, size_t *n, fsdp_err *err);
/* The newest committed step under base (-1: none). */
int ckpt_steps_latest(const char *base, int64_t *step, fsdp_err *err);
/* When base is a run directory (it holds step-<N> directories): "it holds step-10, step-20 (step-30 not
 * committed): load BASE/step-20 or BASE/latest" into out, 1; 0 (out empty) when it holds none. */
int ckpt_steps_hint(const char *base, char *out, size_t cap);
/* base/step-<N> */
void ckpt_steps_dir(char *out, size_t cap, const char *base, int64_t step);
/* keep_last after step `newest` (committed): see above. Problems are noted, never fatal (the new
 * checkpoint is in place); returns the number of directories removed. */
int ckpt_steps_prune(const char *base, int64_t keep, int64_t newest, tmpf_note_fn note, void *user);

#endif
