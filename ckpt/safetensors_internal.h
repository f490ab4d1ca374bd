/* Internals shared by the safetensors reader files (not a public API). */
#ifndef FSDP_CKPT_SAFETENSORS_INTERNAL_H
#define FSDP_CKPT_SAFETENSORS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/safetensors.h"

typedef struct st_file {
    char *path;
    int fd; /* kept open (-1 none): the file mapped and checked, for whoever streams its bytes */
    unsigned char *map; /* the whole file, PROT_READ */
    size_t size;
    uint64_t data_start; /* 8 + N */
    size_t nmeta;
    char **meta;   /* 2 * nmeta strings in strs: key, value, key, value ... */
    char *strs;    /* one arena: the names of the file's tensors and its __metadata__ strings */
    size_t t0, nt; /* its tensors: r->t[t0, t0 + nt), in data-offset order */
} st_file;

struct st_reader {
    char *index_path;   /* NULL for a single file */
    int dfd;            /* the checkpoint's directory, open (-1: a file named alone): its files are opened
                         * beneath it (runtime/fileio.h) */
    char *dir;
    int64_t total_size; /* index metadata.total_size, or -1 */
    st_file *files;
    size_t nfiles;
    st_tensor_info *t;
    size_t nt, tcap;
    size_t *by_name; /* indices into t sorted by name (after st_int_finalize) */
};

/* Maps path, reads its header and appends the file and its tensors to r. */
/* With rel (its name in r->dir), the file is opened beneath r->dfd: a symlink out of the directory is
 * refused. */
int st_int_add_file(st_reader *r, const char *path, const char *rel, fsdp_err *err);
/* Builds the by-name index (a name seen twice, in one file or across shards, is an error), then
 * checks that each file's tensors tile its data buffer. */
int st_int_finalize(st_reader *r, fsdp_err *err);

/* The header's objects (safetensors_entry.c), read at the cursor of j (safetensors_json.h):
 * a tensor object into t (t->name set by the caller; offset absolute, f->data_start + begin),
 * and the __metadata__ object into f->meta (its strings in j's arena). */
struct stj;
int st_int_parse_entry(struct stj *j, const st_file *f, st_tensor_info *t, fsdp_err *err);
int st_int_parse_metadata(struct stj *j, st_file *f, fsdp_err *err);

/* Joins dir and name with one '/'; NULL when out of memory. */
char *st_int_join(const char *dir, const char *name);
/* fsyncs the directory holding path (best effort is not enough: errors are reported). */
int st_int_fsync_dir_of(const char *path, fsdp_err *err);

/* Shard generations of an HF directory (safetensors_gen.c): the file name of shard k (0-based) of
 * ns in generation gen (malloc'd; NULL when out of memory); the generation for a new split of ns
 * shards (0 when dir holds no `<base>.safetensors.index.json`); after the new index is in place,
 * removal of every other shard file of base and of stale temporaries. */
char *st_int_shard_name(const char *base, size_t k, size_t ns, unsigned gen);
int st_int_shard_gen(const char *dir, const char *base, size_t ns, unsigned *gen, fsdp_err *err);
void st_int_shard_cleanup(const char *dir, const char *base, size_t ns, unsigned gen);

#endif
