/* Temporaries left by interrupted checkpoint writers (module prefix ckpt_stale_).
 *
 * Every checkpoint writer of the project writes `<final>.tmp` files locked by their writer
 * (runtime/tmpfile.h); these are the names it owns: `*.distcp.tmp`, `*.metadata.tmp`,
 * `*.safetensors.tmp`, `*.safetensors.index.json.tmp`. */
#ifndef FSDP_CKPT_STALE_H
#define FSDP_CKPT_STALE_H

#include "runtime/tmpfile.h"

/* 1 when name (no directory) is a temporary a checkpoint writer of the project creates. */
int ckpt_stale_owned(const char *name);
/* Removes the stale temporaries of the checkpoint at path, each reported through note
 * ("removed stale temporary X (N bytes) left by an interrupted save"): in a directory, every owned
 * temporary; for a file (or a path that does not exist yet), `<path>.tmp`. Temporaries whose writer
 * is alive are left alone. Returns the number removed. */
int ckpt_stale_sweep(const char *path, tmpf_note_fn note, void *user);

/* The number of owned temporaries at path (as ckpt_stale_sweep looks for them), whether their writer
 * is alive or not: for the read-only commands, which never remove anything (a lock held on another
 * node of a shared file system is invisible here) and only report them. */
int ckpt_stale_count(const char *path);
/* "<path>: N temporar{y,ies} of an interrupted (or running) save; `fsdp-run ckpt clean <path>` removes
 * them" through note when ckpt_stale_count(path) > 0. Returns the count. */
int ckpt_stale_report(const char *path, tmpf_note_fn note, void *user);

#endif
