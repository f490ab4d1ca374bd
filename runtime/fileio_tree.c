/* Removing a directory tree a writer staged (runtime/fileio.h). */
#include <ftw.h>
#include <stdio.h>

#include "runtime/fileio.h"

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

int fio_remove_tree(const char *path) { return nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS); }
