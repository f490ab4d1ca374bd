/* A union: one checkpoint reader over several (module prefix ckpt_union_): every entry of part k under
 * prefix[k] + its name, read from part k. For a checkpoint of several files that are one save (DeepSpeed's
 * model_states.pt and its ranks' *_optim_states.pt): a view (ckpt/reader_view.h) then shows it in fsdp-run's
 * layout. Values, pickles, checksums and streaming go to the part. */
#ifndef FSDP_CKPT_READER_UNION_H
#define FSDP_CKPT_READER_UNION_H

#include <stddef.h>

#include "ckpt/reader.h"
#include "fsdp/error.h"

/* The union of parts[0..n) (owned: closed with it, also on failure) with name prefixes (copied); path names
 * it in messages. Two entries of one name are an error naming it. */
int ckpt_union_open(const char *path, ckpt_reader **parts, const char *const *prefix, size_t n, ckpt_reader **out,
                    fsdp_err *err);

#endif
