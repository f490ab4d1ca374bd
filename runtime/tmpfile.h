/* Temporary files of a writer that may die, and the removal of the ones it left.
 *
 * A writer creates `<final>.tmp`, writes and fsyncs it, and renames it onto the final name. While
 * the temporary exists under its .tmp name its writer holds an exclusive flock(2) on it (taken by
 * tmpf_create, kept until the file is closed, which is after the rename). The lock goes away with
 * the writer's process however it ends, so a later process that can take the lock knows that the
 * writer is gone and the temporary is stale; one that cannot knows that it is being written right
 * now and leaves it alone. (flock is per open file description: a second open in the same process
 * sees the lock as taken too.) */
#ifndef FSDP_RUNTIME_TMPFILE_H
#define FSDP_RUNTIME_TMPFILE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"

/* Where a sweep reports what it did (one line per file, no newline); may be NULL. */
typedef void (*tmpf_note_fn)(void *user, const char *msg);

/* Creates (or takes over a stale) tmp for writing: an empty regular file at path, locked by the
 * returned descriptor. A FIFO or another non-regular file at path is an error (never a blocking
 * open), and so is a temporary whose writer is still alive ("is being written by another process").
 * A stale one is removed first and reported through note. */
int tmpf_create(const char *path, int *fd, tmpf_note_fn note, void *user, fsdp_err *err);

/* Removes path when it is a stale temporary (a regular file nobody holds the lock of), reporting
 * "removed stale temporary <path> (<N> bytes) left by an interrupted save" through note.
 * Returns 1 when it was removed, 0 when it is in use, not there or not a regular file. */
int tmpf_remove_if_stale(const char *path, tmpf_note_fn note, void *user);

/* 1 when a process of this node holds the lock of the temporary at path (its writer is alive here);
 * a lock taken on another node of a shared file system may not be visible. Takes no lock itself
 * for longer than the probe. */
int tmpf_in_use(const char *path);

/* Every entry of dir whose name ends in ".tmp" and that owned(name) accepts is removed when it
 * is stale (tmpf_remove_if_stale). Returns the number removed (a missing directory: 0). */
int tmpf_sweep(const char *dir, int (*owned)(const char *name), tmpf_note_fn note, void *user);

/* Writes buf to tmp (tmpf_create), fsyncs it and renames it onto fin while still holding the lock;
 * on failure tmp is removed and fin untouched. The crash points <crash_prefix>.written,
 * <crash_prefix>.synced and <crash_prefix>.renamed (runtime/crash.h, rank -1) lie between the steps.
 * The caller fsyncs the directory. */
int tmpf_write_replace(const char *tmp, const char *fin, const void *buf, size_t len, const char *crash_prefix,
                       fsdp_err *err);

/* The stdio-free note helper: formats into a buffer and calls note (nothing when note is NULL). */
void tmpf_notef(tmpf_note_fn note, void *user, const char *fmt, ...) FSDP_PRINTF(3, 4);

#endif
