/* safetensors reader: resolving a path (file, directory, HF index) and validating an index. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors_internal.h"
#include "runtime/crash.h"
#include "runtime/fileio.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

void st_close(st_reader *r) {
    if (!r) return;
    for (size_t i = 0; i < r->nfiles; i++) {
        st_file *f = &r->files[i];
        if (f->map) munmap(f->map, f->size);
        if (f->fd >= 0) close(f->fd);
        free(f->meta); /* its strings and the tensor names are in strs */
        free(f->strs);
        free(f->path);
    }
    free(r->files);
    free(r->t);
    free(r->by_name);
    free(r->index_path);
    if (r->dfd >= 0) close(r->dfd);
    free(r->dir);
    free(r);
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int is_regular(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* A shard name from an index must stay inside the index's directory. */
static int safe_rel_name(const char *s) {
    if (!*s || s[0] == '/') return 0;
    for (const char *c = s; *c;) {
        const char *e = strchr(c, '/');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        if (n == 2 && c[0] == '.' && c[1] == '.') return 0;
        if (!e) break;
        c = e + 1;
    }
    return 1;
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    size_t n = (size_t)(slash - path);
    char *d = (char *)malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = '\0';
    return d;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int check_index_meta(st_reader *r, const json_t *root, const char *ip, fsdp_err *err) {
    const json_t *md = json_object_get(root, "metadata");
    r->total_size = -1;
    if (!md || json_is_null(md)) return FSDP_OK;
    if (!json_is_object(md))
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: \"metadata\" must be an object", ip);
    const json_t *ts = json_object_get(md, "total_size");
    if (!ts || json_is_null(ts)) return FSDP_OK;
    if (json_is_integer(ts) && json_integer_value(ts) >= 0) {
        r->total_size = (int64_t)json_integer_value(ts);
    } else if (json_is_real(ts) && json_real_value(ts) >= 0 && json_real_value(ts) < 9.2e18 &&
               json_real_value(ts) == (double)(int64_t)json_real_value(ts)) {
        r->total_size = (int64_t)json_real_value(ts);
    } else {
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: metadata.total_size must be a non-negative integer", ip);
    }
    return FSDP_OK;
}

/* Every weight_map entry must name a tensor of that shard, and every shard tensor must be listed. */
static int check_weight_map(const st_reader *r, const json_t *wm, const char *dir, const char *ip,
                            fsdp_err *err) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)wm, k, v) {
        const st_tensor_info *t = st_find(r, k);
        char *want = st_int_join(dir, json_string_value(v));
        if (!want) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", ip);
        int bad = !t || strcmp(r->files[t->file].path, want) != 0;
        if (bad) {
            int rc = t ? fsdp_err_set(err, FSDP_E_FORMAT,
                                      "%s: weight_map puts tensor '%s' in %s but it is in %s", ip, k,
                                      json_string_value(v), r->files[t->file].path)
                       : fsdp_err_set(err, FSDP_E_FORMAT,
                                      "%s: weight_map lists tensor '%s' in %s, which has no such tensor",
                                      ip, k, want);
            free(want);
            return rc;
        }
        free(want);
    }
    for (size_t i = 0; i < r->nt; i++)
        if (!json_object_get(wm, r->t[i].name))
            return fsdp_err_set(err, FSDP_E_FORMAT,
                                "%s: shard %s holds tensor '%s' that the weight_map does not list", ip,
                                r->files[r->t[i].file].path, r->t[i].name);
    return FSDP_OK;
}

/* Reads the index's JSON (beneath r->dir when rel is given, else at ip; never blocks on a FIFO). */
static int load_index_json(st_reader *r, const char *ip, const char *rel, json_t **root, fsdp_err *err) {
    json_error_t je;
    int fd;
    int frc = rel ? fio_open_beneath(r->dfd, r->dir, rel, &fd, err)
                  : fio_open_read(ip, NULL, &fd, err); /* never blocks on a FIFO */
    if (frc) return frc;
    *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
    close(fd);
    if (!*root) {
        if (!is_regular(ip)) return fsdp_err_set(err, FSDP_E_IO, "%s: cannot read the index: %s", ip, je.text);
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: invalid JSON index: %s (line %d, column %d)", ip,
                            je.text, je.line, je.column);
    }
    return FSDP_OK;
}

/* The index is an object with a weight_map object (*wm) and valid metadata. */
static int check_index_root(st_reader *r, const json_t *root, const char *ip, const json_t **wm, fsdp_err *err) {
    *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root)) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: the index is not a JSON object", ip);
    if (!*wm || !json_is_object(*wm))
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: %s", ip,
                            *wm ? "\"weight_map\" must be an object" : "missing \"weight_map\"");
    return check_index_meta(r, root, ip, err);
}

/* The weight_map's file names (each relative, inside the index's directory), sorted, with
 * repeats: *names (caller frees) holds *nu. */
static int index_shard_names(const json_t *wm, const char *ip, const char ***names, size_t *nu, fsdp_err *err) {
    size_t n = json_object_size(wm);
    *nu = 0;
    *names = (const char **)calloc(n + 1, sizeof **names);
    if (!*names) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", ip);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)wm, k, v) {
        if (!json_is_string(v) || !safe_rel_name(json_string_value(v)))
            return fsdp_err_set(err, FSDP_E_FORMAT,
                                "%s: weight_map entry '%s' must be a relative file name inside the index's "
                                "directory",
                                ip, k);
        (*names)[(*nu)++] = json_string_value(v);
    }
    qsort(*names, *nu, sizeof **names, cmp_str);
    return FSDP_OK;
}

/* The error of shard file p (named `name` in the weight_map) that is not a regular file: missing,
 * or of another type; names the first tensor listed in it. */
static int shard_not_regular(const json_t *wm, const char *ip, const char *p, const char *name, fsdp_err *err) {
    const char *who = "";
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)wm, k, v) {
        if (!strcmp(json_string_value(v), name)) {
            who = k;
            break;
        }
    }
    struct stat st;
    if (stat(p, &st) == 0)
        return fsdp_err_set(err, FSDP_E_IO, "%s: shard file %s (listed for tensor '%s') is a %s, not a regular file",
                            ip, p, who, fio_type_name(st.st_mode));
    return fsdp_err_set(err, FSDP_E_IO, "%s: shard file %s (listed for tensor '%s') is missing", ip, p, who);
}

/* Opens each distinct shard file (sorted names, in the index's directory) into the reader. */
static int add_index_shards(st_reader *r, const json_t *wm, const char *dir, const char *ip, const char **names,
                            size_t nu, fsdp_err *err) {
    for (size_t i = 0; i < nu; i++) {
        if (i && !strcmp(names[i], names[i - 1])) continue;
        char *p = st_int_join(dir, names[i]);
        if (!p) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", ip);
        if (!is_regular(p)) {
            int rc = shard_not_regular(wm, ip, p, names[i], err);
            free(p);
            return rc;
        }
        int rc = st_int_add_file(r, p, names[i], err);
        free(p);
        if (rc) return rc;
    }
    return FSDP_OK;
}

/* rel: the index's name in r->dir when it was found there (opened beneath it), NULL when named */
static int open_index(st_reader *r, const char *ip, const char *rel, fsdp_err *err) {
    r->index_path = strdup(ip);
    if (!r->index_path) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", ip);
    json_t *root = NULL;
    int rc = load_index_json(r, ip, rel, &root, err);
    if (rc) return rc;
    const char **names = NULL;
    size_t nu = 0;
    char *dir = dir_of(ip);
    const json_t *wm = NULL;
    if (!dir) rc = fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", ip);
    if (!rc) rc = check_index_root(r, root, ip, &wm, err);
    if (!rc) rc = index_shard_names(wm, ip, &names, &nu, err);
    if (!rc) {
        pause_point("st.open.index", 1); /* the tests of readers racing writers (runtime/crash.h) */
        rc = add_index_shards(r, wm, dir, ip, names, nu, err);
    }
    if (!rc) rc = st_int_finalize(r, err);
    if (!rc) rc = check_weight_map(r, wm, dir, ip, err);
    free(names);
    free(dir);
    json_decref(root);
    return rc;
}

/* The checkpoint file inside a directory (see safetensors.h); *is_index set accordingly. */
static int resolve_dir(const char *dir, char **out, int *is_index, fsdp_err *err) {
    char *p = st_int_join(dir, INDEX_NAME);
    if (!p) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (is_regular(p)) {
        *out = p;
        *is_index = 1;
        return FSDP_OK;
    }
    free(p);
    p = st_int_join(dir, SINGLE_NAME);
    if (!p) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (is_regular(p)) {
        *out = p;
        *is_index = 0;
        return FSDP_OK;
    }
    free(p);
    DIR *d = opendir(dir);
    if (!d) return fsdp_err_set(err, FSDP_E_IO, "%s: cannot list directory: %s", dir, strerror(errno));
    char *idx = NULL, *one = NULL;
    int nidx = 0, none = 0, rc = FSDP_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        int i = ends_with(de->d_name, ".safetensors.index.json"), s = ends_with(de->d_name, ".safetensors");
        if (!i && !s) continue;
        char *full = st_int_join(dir, de->d_name);
        if (!full) {
            rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            break;
        }
        if (!is_regular(full)) {
            free(full);
            continue;
        }
        char **slot = i ? &idx : &one;
        if (i) nidx++; else none++;
        if (!*slot || strcmp(full, *slot) < 0) {
            free(*slot);
            *slot = full;
        } else {
            free(full);
        }
    }
    closedir(d);
    if (!rc) {
        if (nidx == 1) {
            *out = idx, *is_index = 1, idx = NULL;
        } else if (nidx > 1) {
            rc = fsdp_err_set(err, FSDP_E_INVALID, "%s: %d *.safetensors.index.json files; name one", dir, nidx);
        } else if (none == 1) {
            *out = one, *is_index = 0, one = NULL;
        } else if (none > 1) {
            rc = fsdp_err_set(err, FSDP_E_INVALID,
                              "%s: %d .safetensors files and no " INDEX_NAME "; name the file to open", dir,
                              none);
        } else {
            rc = fsdp_err_set(err, FSDP_E_IO, "%s: no " INDEX_NAME ", " SINGLE_NAME " or other safetensors file",
                              dir);
        }
    }
    free(idx);
    free(one);
    return rc;
}

/* r->dir and r->dfd: the directory whose files r opens beneath it (path's own, or an index's) */
static int open_dir(st_reader *r, const char *dir, fsdp_err *err) {
    r->dir = strdup(dir);
    if (!r->dir) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", dir);
    return fio_open_dir(dir, &r->dfd, err);
}

int st_open(st_reader **out, const char *path, fsdp_err *err) {
    *out = NULL;
    if (!path || !*path) return fsdp_err_set(err, FSDP_E_INVALID, "safetensors: empty path");
    struct stat st;
    if (stat(path, &st) != 0)
        return fsdp_err_set(err, FSDP_E_IO, "%s: cannot open: %s", path, strerror(errno));
    st_reader *r = (st_reader *)calloc(1, sizeof *r);
    if (!r) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", path);
    r->total_size = -1;
    r->dfd = -1;
    char *file = NULL;
    const char *rel = NULL; /* file's name in r->dir, when found there */
    int is_index = 0, rc = FSDP_OK;
    if (S_ISDIR(st.st_mode)) {
        rc = open_dir(r, path, err);
        if (!rc) rc = resolve_dir(path, &file, &is_index, err);
        if (!rc) rel = strrchr(file, '/') ? strrchr(file, '/') + 1 : file; /* a name directly in path */
    } else {
        file = strdup(path);
        is_index = ends_with(path, ".json");
        if (!file) rc = fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", path);
        char *d = !rc && is_index ? dir_of(path) : NULL;
        if (d) rc = open_dir(r, d, err);
        free(d);
    }
    if (!rc) {
        if (is_index) {
            rc = open_index(r, file, rel, err);
        } else {
            rc = st_int_add_file(r, file, rel, err);
            if (!rc) rc = st_int_finalize(r, err);
        }
    }
    free(file);
    if (rc) {
        st_close(r);
        return rc;
    }
    *out = r;
    return FSDP_OK;
}
