/* Files beside a DCP checkpoint's .metadata (see dcp_side.h). */
#include "ckpt/dcp_side.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/torchsave.h"
#include "runtime/crash.h"
#include "runtime/fileio.h"
#include "runtime/tmpfile.h"

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int dcp_side_name_ok(const char *name, const char **why) {
    const char *w = NULL;
    if (!name || !*name) w = "is empty (expected a file name such as metadata.pt)";
    else if (strchr(name, '/')) w = "is not a plain file name (it holds '/'; the files go beside .metadata)";
    else if (name[0] == '.') w = "starts with '.' (.metadata and the writers' temporaries are the checkpoint's own)";
    else if (has_suffix(name, ".distcp")) w = "is a DCP data file name (*.distcp)";
    else if (has_suffix(name, ".metadata")) w = "is a DCP metadata file name (*.metadata, e.g. rank-local __0.metadata)";
    else if (has_suffix(name, ".tmp")) w = "ends in .tmp (the writers' temporaries)";
    else if (strlen(name) > 255) w = "is longer than 255 bytes";
    if (why) *why = w;
    return w == NULL;
}

/* torch.save's archive name: the file name without its last extension */
static void archive_name(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s", name);
    char *dot = strrchr(out, '.');
    if (dot && dot != out) *dot = '\0';
}


int dcp_side_write(const char *dir, const char *name, const void *pickle, size_t len, fsdp_err *err) {
    const char *why;
    if (!dcp_side_name_ok(name, &why)) return fsdp_err_set(err, FSDP_E_INVALID, "file '%s' %s", name ? name : "", why);
    size_t plen = strlen(dir) + strlen(name) + 8;
    char *fin = malloc(plen), *tmp = malloc(plen), arch[256];
    if (!fin || !tmp) {
        free(fin);
        free(tmp);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    snprintf(fin, plen, "%s/%s", dir, name);
    snprintf(tmp, plen, "%s/%s.tmp", dir, name);
    archive_name(name, arch, sizeof arch);
    int fd;
    int rc = tmpf_create(tmp, &fd, NULL, NULL, err);
    FILE *f = rc ? NULL : fdopen(fd, "wb");
    if (!rc && !f) {
        rc = fsdp_err_set(err, FSDP_E_IO, "cannot write %s: %s", tmp, strerror(errno));
        unlink(tmp);
        close(fd);
    }
    uint64_t n;
    if (!rc) rc = ts_write_value_named(f, arch, pickle, len, &n, err);
    if (!rc && fflush(f) != 0) rc = fsdp_err_set(err, FSDP_E_IO, "cannot write %s: %s", tmp, strerror(errno));
    if (!rc && fsync(fileno(f)) != 0) rc = fsdp_err_set(err, FSDP_E_IO, "cannot write %s: %s", tmp, strerror(errno));
    if (!rc) crash_point("dcp.side.synced", 1, 0);
    /* renamed while still open: the lock covers the temporary until it has its final name */
    if (!rc && rename(tmp, fin) != 0) rc = fsdp_err_set(err, FSDP_E_IO, "cannot rename %s: %s", tmp, strerror(errno));
    if (!rc) crash_point("dcp.side.renamed", 1, 0);
    if (rc && f) unlink(tmp);
    if (f && fclose(f) != 0 && !rc) rc = fsdp_err_set(err, FSDP_E_IO, "%s: close failed: %s", fin, strerror(errno));
    /* not every file system syncs directories: the rename is done either way */
    int e = rc ? 0 : fio_fsync_dir(dir);
    if (e == ENOENT || e == ENOTDIR || e == EACCES) rc = fsdp_err_set(err, FSDP_E_IO, "%s: %s", dir, strerror(e));
    free(fin);
    free(tmp);
    return rc;
}
