/* Internal representation of recipe values (the public view is include/fsdp/value.h). */
#ifndef FSDP_PIPELINE_VALUE_IMPL_H
#define FSDP_PIPELINE_VALUE_IMPL_H

#include <stddef.h>

#include "fsdp/value.h"
#include "pipeline/strmap.h"

/* Maps of at least this many keys carry a hash index of their keys (smaller ones are scanned). */
#define VAL_INDEX_MIN 16

/* What one recipe (the file, its includes and their expansions) may grow to: values copied by YAML
 * aliases and by ${var} references to lists and maps (each use copies), and values read from the
 * files. Far above any real recipe; a "billion laughs" file hits the first within a million copies. */
#define VAL_MAX_COPIES 1000000
#define VAL_MAX_VALUES 16777216
typedef struct val_budget {
    size_t copies; /* values copied so far (aliases, ${var} lists and maps) */
    size_t values; /* values read from YAML so far */
} val_budget;

struct fsdp_value {
    fsdp_value_kind kind;
    char *text;     /* scalar text (FSDP_V_SCALAR) */
    int quoted;     /* scalar was quoted in YAML (never null / never a number by style) */
    size_t n, cap;
    char **keys;    /* map keys (FSDP_V_MAP) */
    fsdp_value **items; /* list items or map values */
    int *key_line, *key_col; /* map key positions */
    strmap *index;  /* key -> position, for maps of VAL_INDEX_MIN keys or more (else NULL) */
    char *file;
    int line, col;  /* 1-based position of the value */
    int is_default; /* filled in from a schema default */
    int cwd_only;   /* a relative path here resolves against the working directory only: the text came from
                     * --set or starts with a ${var} (or ${env:...}) whose value did (see recipe_paths.c) */
    char *from_var; /* the value was exactly "${NAME}": NAME, the recipe var a user sets (--set vars.NAME=...) */
};

fsdp_value *val_new(fsdp_value_kind kind, const char *file, int line, int col);
/* The recipe var a value was given by whole ("${NAME}"), or NULL: what a message tells the user to set. */
const char *val_from_var(const fsdp_value *v);
fsdp_value *val_scalar(const char *text, int quoted, const char *file, int line, int col);
void val_free(fsdp_value *v);
fsdp_value *val_clone(const fsdp_value *v);
/* Number of values in v's tree (v itself included; 0 for NULL) and its height (0 for a scalar). */
size_t val_count(const fsdp_value *v, int *height);
/* Append to a list; takes ownership. Returns 0 or -1 (out of memory). */
int val_list_push(fsdp_value *list, fsdp_value *item);
/* Set key in a map (replacing and freeing an existing value); takes ownership of item. */
int val_map_set(fsdp_value *map, const char *key, fsdp_value *item, int key_line, int key_col);
/* Index of key in a map, or -1. */
long val_map_find(const fsdp_value *map, const char *key);
/* Remove key from a map (freeing its value); returns 1 if it was there. */
int val_map_remove(fsdp_value *map, const char *key);
/* Replace the scalar text of v. */
int val_set_text(fsdp_value *v, const char *text);
/* Deep merge src into dst (maps merge recursively, everything else is replaced).
 * `stages` lists at the top level merge by stage id (see recipe.c). Takes ownership of src. */
fsdp_value *val_merge(fsdp_value *dst, fsdp_value *src);
/* Mutable child access. */
fsdp_value *val_get_mut(fsdp_value *map, const char *key);
/* Writes the value as compact YAML flow text (for --dry-run and reports). Returns malloc'd string. */
char *val_to_flow(const fsdp_value *v);
/* YAML 1.2 core-schema null test for a plain scalar text. */
int val_text_is_null(const char *text);
/* Whether a text read from a file may be quoted in an error before the file is known to be a
 * recipe: 1 to VAL_WORD_MAX letters, digits and `_.-*` `/` (a key such as `lr` or `layers.*.w`; not
 * a line of some other file, e.g. a password entry with its `:` and `$`). */
#define VAL_WORD_MAX 64
int val_text_is_word(const char *text);
/* fsdp_value_bool / fsdp_value_float of a text (NULL: -1). */
int val_text_bool(const char *text, int *out);
int val_text_float(const char *text, double *out);

#endif
