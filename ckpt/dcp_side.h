/* Small torch.save files beside a DCP checkpoint's `.metadata` (module prefix dcp_side_), such as the
 * `metadata.pt` (torch.save({"train_step": 0})) and `scheduler.pt` that Bagel's save_checkpoint puts
 * in its step directory: written by rank 0 after every data file and before `.metadata` commits the
 * checkpoint, each atomically (`<name>.tmp`, locked by its writer as runtime/tmpfile.h describes,
 * fsynced, renamed onto the name; a stale one of an interrupted save is taken over). A file of that
 * name already there (of a replaced checkpoint, or a stray one) is replaced by the rename. */
#ifndef FSDP_CKPT_DCP_SIDE_H
#define FSDP_CKPT_DCP_SIDE_H

#include <stddef.h>

#include "fsdp/error.h"

/* 1 when name may be such a file: a plain file name (no '/', not "." or ".."), not starting with '.'
 * (`.metadata` and its temporaries), not a data file (`*.distcp`), a metadata file (`*.metadata`: a
 * rank-local `__<r>.metadata` makes a directory a checkpoint) nor a writer's temporary (`*.tmp`); else 0 with *why saying what it is ("is not a plain file name (it holds '/')"). */
int dcp_side_name_ok(const char *name, const char **why);

/* torch.save(VALUE) as dir/name, where pickle (PROTO ... STOP) pickles VALUE: an archive whose
 * records are named after name without its extension, as torch.save names them ("metadata/data.pkl"
 * for metadata.pt), that torch.load(..., weights_only=True) reads for a plain value. The directory
 * is fsynced after the rename. */
int dcp_side_write(const char *dir, const char *name, const void *pickle, size_t len, fsdp_err *err);

#endif
