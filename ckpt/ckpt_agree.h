/* Opening one checkpoint on every rank of a job, all ranks reading one save (ckpt/ckpt_agree.c).
 *
 * Each rank's ckpt_open reads one save or fails (dcp_open), but two ranks may open the path at
 * different instants, around an overwrite (or a `DIR/latest` that moved on, or a step directory
 * pruned meanwhile): rank 0 would read step 1 and rank 1 step 3. ckpt_open_agreed compares the
 * ranks' ckpt_identity after they opened; when they differ, or some rank failed while the
 * checkpoint changed, every rank opens again (at most CKPT_AGREE_TRIES times in all), else every
 * rank returns the same verdict. */
#ifndef FSDP_CKPT_AGREE_H
#define FSDP_CKPT_AGREE_H

#include <stddef.h>

#include "ckpt/reader.h"
#include "runtime/comm.h"

#define CKPT_AGREE_TRIES 4

/* Finds the path to open into path (cap bytes), the same on every rank (called by every rank,
 * collectively, before each try: e.g. DIR/latest resolved by rank 0 and broadcast). */
typedef int (*ckpt_resolve_fn)(void *user, char *path, size_t cap, fsdp_err *err);

/* Every rank of c opens path (after resolve, when not NULL) and they agree on one save: *out open on
 * every rank, or an error on every rank (the failing rank's own message; the others name it). The
 * restarts of all tries (ckpt_restarts and the ranks' own) add up in *restarts. */
int ckpt_open_agreed(comm *c, ckpt_format fmt, ckpt_resolve_fn resolve, void *user, char *path, size_t cap,
                     ckpt_reader **out, int *restarts, fsdp_err *err);

#endif
