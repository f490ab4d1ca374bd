/* `fsdp-run ckpt clean PATH`: removes what interrupted saves left at a checkpoint path.
 *
 * Only files of the writers' own name patterns are candidates: the temporaries they create
 * (ckpt_stale_owned) and, in a DCP directory whose `.metadata` opens, the data files named as the
 * writers name them (`__<r>_0.distcp`, `__<r>_0.g<N>.distcp`) that `.metadata` does not reference.
 * A temporary whose writer holds its lock on this node is never removed; any candidate modified less
 * than --min-age seconds ago (a save on another node may be writing it) is kept unless --force. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt_stale.h"
#include "ckpt/dcp.h"
#include "cli/ckpt_tool.h"

#define CLEAN_MIN_AGE_DEFAULT 600.0

typedef struct clean_opts {
    const char *path;
    int force, dry_run;
    double min_age;
    int kept, removed, failed;
} clean_opts;

static int parse_clean(int argc, char **argv, clean_opts *o, FILE *log) {
    memset(o, 0, sizeof *o);
    o->min_age = CLEAN_MIN_AGE_DEFAULT;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--force")) o->force = 1;
        else if (!strcmp(argv[i], "--dry-run")) o->dry_run = 1;
        else if (!strcmp(argv[i], "--min-age") && i + 1 < argc) {
            char *end;
            o->min_age = strtod(argv[++i], &end);
            if (*end || end == argv[i] || o->min_age < 0) {
                fprintf(log, "fsdp-run ckpt clean: --min-age takes seconds (>= 0), not '%s'\n", argv[i]);
                return 2;
            }
        } else if (argv[i][0] == '-' || o->path) {
            fprintf(log, "fsdp-run ckpt clean: unexpected argument '%s'\n", argv[i]);
            return 2;
        } else o->path = argv[i];
    }
    if (!o->path) {
        fprintf(log, "usage: fsdp-run ckpt clean PATH [--dry-run] [--force] [--min-age SECONDS]\n");
        return 2;
    }
    return 0;
}

/* One candidate: kept (in use, too recent) or removed (or listed with --dry-run), said on out. */
static void clean_one(clean_opts *o, const char *p, int is_tmp, const char *why, FILE *out, FILE *log) {
    struct stat st;
    if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) return;
    double age = difftime(time(NULL), st.st_mtime);
    if (is_tmp && tmpf_in_use(p)) {
        fprintf(out, "kept %s: its writer is running (it holds the file's lock)\n", p);
        o->kept++;
        return;
    }
    if (age < o->min_age && !o->force) {
        fprintf(out, "kept %s: modified %.0f s ago, less than --min-age %.0f s (a save may be writing it; --force "
                "removes it)\n", p, age < 0 ? 0 : age, o->min_age);
        o->kept++;
        return;
    }
    if (o->dry_run) {
        fprintf(out, "would remove %s (%lld bytes): %s\n", p, (long long)st.st_size, why);
        o->removed++;
        return;
    }
    int ok = is_tmp ? tmpf_remove_if_stale(p, NULL, NULL) : unlink(p) == 0;
    if (ok) {
        fprintf(out, "removed %s (%lld bytes): %s\n", p, (long long)st.st_size, why);
        o->removed++;
    } else {
        fprintf(log, "fsdp-run ckpt clean: cannot remove %s: %s\n", p,
                is_tmp ? "its writer holds it" : strerror(errno));
        o->failed++;
    }
}

/* 1 with *c open when dir has a `.metadata` that opens (c->files: the data files it references);
 * 0 otherwise, and then no data file is a candidate. */
static int referenced_files(const char *dir, dcp_ckpt **c, FILE *out) {
    char p[4200];
    snprintf(p, sizeof p, "%s/.metadata", dir);
    struct stat st;
    if (lstat(p, &st) != 0) return 0;
    fsdp_err err;
    if (dcp_open(dir, c, &err)) {
        fprintf(out, "data files left as they are: %s (its .metadata does not open: %s)\n", dir, err.msg);
        *c = NULL;
        return 0;
    }
    return 1;
}

static int is_referenced(const dcp_ckpt *c, const char *name) {
    for (size_t i = 0; i < c->n_files; i++)
        if (!strcmp(c->files[i].rel, name)) return 1;
    return 0;
}

static void clean_dir(clean_opts *o, FILE *out, FILE *log) {
    dcp_ckpt *c = NULL;
    int have_meta = referenced_files(o->path, &c, out);
    DIR *d = opendir(o->path);
    if (!d) {
        fprintf(log, "fsdp-run ckpt clean: cannot list %s: %s\n", o->path, strerror(errno));
        o->failed++;
        dcp_close(c);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", o->path, de->d_name);
        if (ckpt_stale_owned(de->d_name))
            clean_one(o, p, 1, "temporary of an interrupted save", out, log);
        else if (have_meta && dcp_is_data_file_name(de->d_name) && !is_referenced(c, de->d_name))
            clean_one(o, p, 0, "data file the checkpoint's .metadata does not reference (of an interrupted or "
                      "replaced save)", out, log);
    }
    closedir(d);
    dcp_close(c);
}

int ckpt_cli_clean(int argc, char **argv, FILE *out, FILE *log) {
    clean_opts o;
    int rc = parse_clean(argc, argv, &o, log);
    if (rc) return rc;
    struct stat st;
    if (stat(o.path, &st) == 0 && S_ISDIR(st.st_mode)) {
        clean_dir(&o, out, log);
    } else {
        char p[4200];
        snprintf(p, sizeof p, "%s.tmp", o.path);
        const char *base = strrchr(p, '/');
        if (ckpt_stale_owned(base ? base + 1 : p)) clean_one(&o, p, 1, "temporary of an interrupted save", out, log);
    }
    fprintf(out, "%s: %d file%s %s, %d kept\n", o.path, o.removed, o.removed == 1 ? "" : "s",
            o.dry_run ? "to remove" : "removed", o.kept);
    return o.failed || (o.kept && !o.dry_run) ? 1 : 0;
}
