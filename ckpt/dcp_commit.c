/* Replacing a DCP checkpoint so that its directory holds one complete checkpoint at every instant.
 *
 * The choice: new data files under new names, `.metadata` replaced last by rename, the previous
 * generation's files removed only once the new `.metadata` is durable.
 *
 *   - The alternative, writing into a temporary directory and swapping it with the old one, needs
 *     renameat2(RENAME_EXCHANGE), which not every file system has (NFS, older kernels, FUSE);
 *     without it two plain renames leave an instant with no checkpoint at the path. A temporary
 *     directory must also sit on the same file system as the path, and a killed save leaves a
 *     whole directory of stray data beside it.
 *   - Generations need nothing but rename(2) of one file inside one directory, which is atomic on
 *     every POSIX file system. A reader that opened the old `.metadata` keeps its open data files
 *     (unlinking does not disturb open descriptors), and PyTorch reads any file name recorded as a
 *     storage's `relative_path`, so the names need not be torch's `__<rank>_<k>.distcp`.
 *
 * Names: generation 0 is torch's own `__<rank>_0.distcp`; generation g > 0 is
 * `__<rank>_0.g<g>.distcp`. A save into a directory without a checkpoint uses generation 0 (stray
 * data files there belong to no checkpoint and are replaced); a save over a checkpoint uses one
 * generation above the highest of any file (or temporary) there, so it never writes over a file
 * the current `.metadata` may reference, and a name, once replaced, does not come back while the
 * checkpoint exists: a reader that read an old `.metadata` finds its files gone, never another
 * save's under the same name. Each save also carries a random identity, in `.metadata` and in each
 * data file (ckpt/dcp_gen.h), which readers check (ckpt/dcp.h, dcp_open). The sequence, with its
 * crash points:
 *
 *   rank 0:     dcp_prepare_dir (save.prepared / convert.prepared once every rank knows the generation)
 *   every rank: data file -> `<name>.tmp` (dcp.data.item per item, dcp.data.written), fsync
 *               (dcp.data.synced), rename onto `<name>` (dcp.data.renamed), fsync of the directory
 *   rank 0:     gathers the records (save.gathered), `.metadata.tmp` (dcp.meta.written), fsync
 *               (dcp.meta.synced), rename onto `.metadata` (dcp.meta.renamed), fsync of the
 *               directory: the new checkpoint is in place (save.committed / convert.committed)
 *   rank 0:     remove the old generation (dcp.cleanup.unlink before each file): data files that
 *               the new `.metadata` does not reference and that are not of the new generation,
 *               rank-local `__<r>.metadata` files, stale temporaries (save.cleaned)
 *
 * (Crash points: runtime/crash.h; the names above in parentheses, dcp.data.* with the writing
 * rank, the others on rank 0.)
 *
 * A kill before the `.metadata` rename leaves the old checkpoint (plus new files that no
 * `.metadata` references, removed by the next save); a kill after it leaves the new one (plus old
 * files, likewise). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/dcp.h"
#include "runtime/crash.h"
#include "runtime/fileio.h"

#define GEN_LAST 0xfffffffeu /* the highest generation number a save may take */

void dcp_data_file_name(char *out, size_t cap, int rank, unsigned gen) {
    if (gen == 0) snprintf(out, cap, "__%d_0.distcp", rank);
    else snprintf(out, cap, "__%d_0.g%u.distcp", rank, gen);
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* the generation of a data file (or its temporary) named by dcp_data_file_name (its rank in *rank
 * when not NULL); -1 otherwise */
static long name_gen(const char *name, int *rank_out) {
    int rank, used = 0;
    if (sscanf(name, "__%d_0%n", &rank, &used) != 1 || used == 0 || rank < 0) return -1;
    const char *p = name + used;
    unsigned gen = 0;
    if (p[0] == '.' && p[1] == 'g') {
        char *end;
        unsigned long g = strtoul(p + 2, &end, 10);
        if (end == p + 2 || g == 0 || g > 0xffffffffu) return -1;
        gen = (unsigned)g;
        p = end;
    }
    if (rank_out) *rank_out = rank;
    return !strcmp(p, ".distcp") || !strcmp(p, ".distcp.tmp") ? (long)gen : -1;
}

/* `__<r>.metadata`: a rank-local metadata file */
static int is_rank_local_metadata(const char *name) {
    int r, used = 0;
    return sscanf(name, "__%d.metadata%n", &r, &used) == 1 && used && !name[used];
}

int dcp_is_data_file_name(const char *name) {
    return has_suffix(name, ".distcp") && name_gen(name, NULL) >= 0;
}

int dcp_tmp_owned(const char *name) { return has_suffix(name, ".distcp.tmp") || has_suffix(name, ".metadata.tmp"); }

int dcp_dir_has_checkpoint(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/.metadata", dir);
    struct stat st;
    if (lstat(p, &st) == 0) return 1;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    struct dirent *de;
    while (!found && (de = readdir(d))) found = is_rank_local_metadata(de->d_name);
    closedir(d);
    return found;
}

/* one above the highest generation of any data file (or temporary) in dir */
static int next_generation(const char *dir, unsigned *gen, fsdp_err *err) {
    DIR *d = opendir(dir);
    if (!d) return fsdp_err_set(err, FSDP_E_IO, "cannot list %s: %s", dir, strerror(errno));
    long top = -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        long g = name_gen(de->d_name, NULL);
        if (g > top) top = g;
    }
    closedir(d);
    if (top >= (long)GEN_LAST)
        return fsdp_err_set(err, FSDP_E_IO, "%s holds a data file of generation %ld, the last one: remove the stray "
                            "data files that .metadata does not name", dir, top);
    *gen = (unsigned)(top + 1);
    return 0;
}

static int mkdir_p(const char *path, const char *who, fsdp_err *err) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: path too long: %s", who, path);
    for (char *q = tmp + 1;; q++) {
        if (*q != '/' && *q) continue;
        char save = *q;
        *q = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return fsdp_err_set(err, FSDP_E_IO, "%s: cannot create %s: %s", who, tmp, strerror(errno));
        *q = save;
        if (!save) break;
    }
    struct stat st;
    if (stat(path, &st) != 0) return fsdp_err_set(err, FSDP_E_IO, "%s: cannot create %s: %s", who, path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: %s is a %s, not a directory", who, path, fio_type_name(st.st_mode));
    return 0;
}

int dcp_prepare_dir(const char *dir, int overwrite, const char *who, const char *hint, dcp_gen *gen,
                    tmpf_note_fn note, void *user, fsdp_err *err) {
    dcp_gen_new(gen, 0);
    if (!dir || !*dir) return fsdp_err_set(err, FSDP_E_INVALID, "%s: empty checkpoint path", who);
    int rc = mkdir_p(dir, who, err);
    if (rc) return rc;
    int exists = dcp_dir_has_checkpoint(dir);
    if (exists && !overwrite)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: %s already holds a checkpoint (%s)", who, dir, hint);
    tmpf_sweep(dir, dcp_tmp_owned, note, user);
    return exists ? next_generation(dir, &gen->num, err) : 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* the distinct relative paths of the records, sorted */
static const char **referenced(const dcp_record *recs, size_t n, size_t *nref) {
    const char **v = malloc((n ? n : 1) * sizeof *v);
    if (!v) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (recs[i].where.relative_path[0] && (k == 0 || strcmp(v[k - 1], recs[i].where.relative_path)))
            v[k++] = recs[i].where.relative_path;
    qsort(v, k, sizeof *v, cmp_str);
    *nref = k;
    return v;
}

/* 1 when name is a file of the replaced checkpoint (or a stray data file) */
static int is_old(const char *name, unsigned gen, int world, const char **ref, size_t nref) {
    if (is_rank_local_metadata(name)) return 1;
    if (!has_suffix(name, ".distcp")) return 0;
    int rank = -1;
    if (name_gen(name, &rank) == (long)gen && rank < world) return 0; /* this save's (a rank's may hold no record) */
    return !bsearch(&name, ref, nref, sizeof *ref, cmp_str);
}

int dcp_remove_old_generations(const char *dir, unsigned gen, int world, const dcp_record *recs, size_t n,
                               tmpf_note_fn note, void *user) {
    size_t nref = 0;
    const char **ref = referenced(recs, n, &nref);
    DIR *d = ref ? opendir(dir) : NULL;
    if (!d) {
        free(ref);
        tmpf_notef(note, user, "could not list %s to remove the replaced checkpoint's files", dir);
        return 0;
    }
    int removed = 0;
    long k = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (has_suffix(de->d_name, ".tmp")) {
            if (dcp_tmp_owned(de->d_name)) tmpf_remove_if_stale(p, note, user);
            continue;
        }
        if (!is_old(de->d_name, gen, world, ref, nref)) continue;
        crash_point("dcp.cleanup.unlink", ++k, 0);
        if (unlink(p) == 0) removed++;
        else tmpf_notef(note, user, "cannot remove %s of the replaced checkpoint: %s", p, strerror(errno));
    }
    closedir(d);
    free(ref);
    return removed;
}
