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

#endif
