/* Opening files that must be regular files, without ever blocking on a FIFO or a device.
 *
 * open(2) of a FIFO blocks until a writer (or reader) appears, so every file the project reads
 * (checkpoints, indexes, data, recipes) is opened with O_NONBLOCK first, checked with fstat, and
 * only then switched back to blocking I/O. A non-regular file is an error naming the file and
 * its type: "<label> is a FIFO, not a regular file". */
#ifndef FSDP_RUNTIME_FILEIO_H
#define FSDP_RUNTIME_FILEIO_H

#include <stdio.h>
#include <sys/types.h>

#include "fsdp/error.h"

/* "FIFO", "directory", "socket", "character device", "block device", "symbolic link",
 * "regular file" or "special file". */
const char *fio_type_name(mode_t mode);

/* The primitive: open(path, flags | O_NONBLOCK | O_CLOEXEC, 0644), require a regular file, clear
 * O_NONBLOCK. Returns 0 (*fd set), open's errno value, or -1 when path is not a regular file (its
 * mode in *mode; nothing stays open). For callers with messages of their own. */
int fio_open_raw(const char *path, int flags, int *fd, mode_t *mode);

/* Opens path read-only (O_CLOEXEC) after checking that it is a regular file. label names the file
 * in messages (NULL: the path): "<label> is a FIFO, not a regular file", "<label>: cannot open:
 * <strerror>" (FSDP_E_IO). On success *fd is a blocking descriptor. */
int fio_open_read(const char *path, const char *label, int *fd, fsdp_err *err);
/* The same as a stdio stream ("rb"). */
int fio_fopen_read(const char *path, const char *label, FILE **f, fsdp_err *err);
/* Opens path for appending (created 0644 when missing), refusing a FIFO or another special file
 * instead of blocking on it. */
int fio_fopen_append(const char *path, const char *label, FILE **f, fsdp_err *err);

/* Whether path names something that does not exist YET: it is missing, and so is the directory it
 * would be in (a source an earlier recipe of a chain writes). A missing file in an existing
 * directory (an HF directory without its config.json), an empty path, or any other error is not. */
int fio_not_there_yet(const char *path);

/* fsync of a directory (a rename or a new entry in it made durable): 0, or the errno of the open or of
 * the fsync (some file systems do not sync directories: callers may ignore it). */
int fio_fsync_dir(const char *dir);
/* The same for the directory a path is in ("." for a bare name). */
int fio_fsync_parent(const char *path);

/* ---- inside a checkpoint's directory (fileio_beneath.c) ---------------------------------- */

/* Removes path and, when it is a directory, everything under it (symlinks themselves, never what they point to):
 * a writer's staging directory after a failure. 0, or -1 when the tree could not be walked. */
int fio_remove_tree(const char *path);

/* Opens dir (a directory; it may itself be a symlink) as a descriptor for fio_open_beneath. */
int fio_open_dir(const char *dir, int *dfd, fsdp_err *err);
/* Opens name (relative to the directory open as dfd, named dir in messages) read-only, as a
 * blocking descriptor of a regular file, never leaving the directory: a symbolic link (of the name
 * or a component) is followed only while it stays beneath it (openat2 RESOLVE_BENEATH, else
 * realpath checked against the directory's and O_NOFOLLOW). A way out is FSDP_E_FORMAT naming the
 * link and where it points; a missing or unreadable file FSDP_E_IO "<dir>: cannot open <name>:
 * <strerror>"; a FIFO or another non-regular file FSDP_E_IO, without blocking on it. */
int fio_open_beneath(int dfd, const char *dir, const char *name, int *fd, fsdp_err *err);

#endif
