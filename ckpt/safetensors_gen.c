/* Hugging Face sharded safetensors output over an existing one: shard generations.
 *
 * The directory's `<base>.safetensors.index.json` is its commit point: loaders (ours, transformers)
 * read the index and open the shards its weight_map names. Renaming new shards over the old ones
 * before the new index is in place would leave the old index over a mix of old and new shards (or
 * over shards of another split), so when the directory already holds an index the new shards get
 * names of their own, `<base>-0000k-of-0000n.g<g>.safetensors` (g: one above the highest generation
 * of any shard there, so a name never comes back while the directory holds a checkpoint), the index
 * is replaced last by rename, and only then are the replaced
 * checkpoint's shards removed. A directory without an index gets the usual
 * `<base>-0000k-of-0000n.safetensors` names (generation 0). The same choice as for DCP (see
 * ckpt/dcp_commit.c): renames of single files inside one directory, atomic everywhere.
 *
 * Crash points (runtime/crash.h), per shard file as for a single .safetensors file: st.data.tensor
 * (the n-th tensor of a file complete), st.data.written, st.data.synced, st.data.renamed; then for
 * the index: st.index.written, st.index.synced, st.index.renamed, st.index.durable, and
 * st.cleanup.unlink before each old shard removed. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_stale.h"
#include "ckpt/safetensors_internal.h"
#include "runtime/crash.h"

#define GEN_LAST 0xfffffffeu /* the highest generation a split may take */

char *st_int_shard_name(const char *base, size_t k, size_t ns, unsigned gen) {
    char g[16] = "";
    if (gen) snprintf(g, sizeof g, ".g%u", gen);
    int len = snprintf(NULL, 0, "%s-%05zu-of-%05zu%s.safetensors", base, k + 1, ns, g);
    char *s = malloc((size_t)len + 1);
    if (s) snprintf(s, (size_t)len + 1, "%s-%05zu-of-%05zu%s.safetensors", base, k + 1, ns, g);
    return s;
}

/* 1 when name is a shard file of base (any split, any generation): *k, *n, *gen filled */
static int parse_shard_name(const char *name, const char *base, size_t *k, size_t *n, unsigned *gen) {
    size_t bl = strlen(base);
    int used = 0;
    if (strncmp(name, base, bl) || sscanf(name + bl, "-%5zu-of-%5zu%n", k, n, &used) != 2 || !used) return 0;
    const char *p = name + bl + used;
    *gen = 0;
    if (p[0] == '.' && p[1] == 'g') {
        char *end;
        unsigned long g = strtoul(p + 2, &end, 10);
        if (end == p + 2 || g == 0 || g > 0xffffffffu) return 0;
        *gen = (unsigned)g;
        p = end;
    }
    return !strcmp(p, ".safetensors");
}

static int exists_in(const char *dir, const char *name, const char *suffix) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s%s", dir, name, suffix);
    struct stat st;
    return lstat(p, &st) == 0;
}

int st_output_exists(const char *path, const char *base) {
    if (!base) {
        struct stat st;
        return lstat(path, &st) == 0;
    }
    char index[4400];
    snprintf(index, sizeof index, "%s.safetensors.index.json", base);
    return exists_in(path, index, "");
}

int st_export_file(const char *path, int hf, char *out, size_t cap) {
    size_t n = strlen(path), k = strlen(".safetensors");
    int dir = hf && !(n >= k && !strcmp(path + n - k, ".safetensors"));
    snprintf(out, cap, dir ? "%s/model.safetensors" : "%s", path);
    return dir;
}

int st_int_shard_gen(const char *dir, const char *base, size_t ns, unsigned *gen, fsdp_err *err) {
    (void)ns;
    *gen = 0;
    char index[4400];
    snprintf(index, sizeof index, "%s.safetensors.index.json", base);
    if (!exists_in(dir, index, "")) return FSDP_OK;
    /* one above the highest generation of any shard of base there (any split): a name, once
     * replaced, does not come back, so a reader of the old index never maps another save's shard */
    DIR *d = opendir(dir);
    if (!d) return fsdp_err_set(err, FSDP_E_IO, "cannot list %s: %s", dir, strerror(errno));
    long top = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t k, n, len = strlen(de->d_name);
        unsigned g;
        char name[1024];
        snprintf(name, sizeof name, "%.*s", (int)(len > 4 && !strcmp(de->d_name + len - 4, ".tmp") ? len - 4 : len),
                 de->d_name);
        if (parse_shard_name(name, base, &k, &n, &g) && (long)g > top) top = g;
    }
    closedir(d);
    if (top >= (long)GEN_LAST)
        return fsdp_err_set(err, FSDP_E_IO, "%s holds a shard of generation %ld, the last one: remove the stray shards",
                            dir, top);
    *gen = (unsigned)top + 1;
    return FSDP_OK;
}

void st_int_shard_cleanup(const char *dir, const char *base, size_t ns, unsigned gen) {
    DIR *d = opendir(dir);
    if (!d) return;
    long removed = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        size_t k, n;
        unsigned g;
        if (ckpt_stale_owned(de->d_name)) {
            tmpf_remove_if_stale(p, NULL, NULL);
        } else if (parse_shard_name(de->d_name, base, &k, &n, &g) && !(n == ns && g == gen && k >= 1 && k <= ns)) {
            crash_point("st.cleanup.unlink", ++removed, -1);
            unlink(p);
        }
    }
    closedir(d);
}
