/* The generic model (module prefix mt_): a model is a TABLE OF NAMED TENSORS. Every stage but
 * train-steps works on this table and nothing else; a trainer is an optional property of it.
 *
 * Design
 * ------
 *   mt_param   one tensor: full name (prefix included), global shape (0..8 dims), dtype (f32, bf16 or
 *              f16: the dtype the parameter keeps end to end and is written with), init rule
 *              (model/init_rule.h; INIT_NONE = it must be loaded or copied) and the part it came from.
 *   mt_part    a source the table was composed of: a name (unique), the prefix its names got, what it
 *              is ("HF directory DIR", "table file F", "llama3 (preset tiny)", ...) and where the recipe
 *              declared it (file:line:col).
 *   mt_table   the parameters in declaration order, a name index (runtime/name_index.h: O(log n)
 *              lookups, so an n-tensor table costs O(n log n) to build), the parts, and the trainer:
 *              MT_TRAIN_DECODER with the decoder family's config (opaque here: decoder/decoder_table.h
 *              reads it) when the whole model is one built-in arch, MT_TRAIN_NONE otherwise (train-steps
 *              refuses such a model in `validate`, naming mt_kind). model/ names no architecture.
 *
 * Producers (each adds the parameters of one part to a table; composition is just several of them
 * adding into the same table, with a name collision or a shape conflict an error naming both parts):
 *   decoder/decoder_table.c   a decoder_config (decoder_params_build: the single source of the decoder
 *                         family's names, shapes and init rules) -> its parameters; the model's trainer
 *                         when alone (given to mt_spec_build as an mt_arch)
 *   model/mt_ckpt.c       what a checkpoint holds (DCP, safetensors file / HF directory / index, .pt):
 *                         names, shapes, dtypes from its header only (ckpt_open, no tensor data read),
 *                         with key filters, a stripped and an added prefix
 *   model/mt_yaml.c       the table syntax (a table file or an inline list): names with ranges that
 *                         expand (`layers.{0..L-1}.q_proj.weight`, `{q,k,v}`), shapes over named dims
 *                         (`[heads*head_dim, hidden]`, model/mt_dims.h), dtype and init rule per entry,
 *                         and `like:` entries that derive new parameters from declared ones by a glob
 *                         rewrite (Bagel's `_moe_gen` experts)
 *   model/mt_spec.c       the recipe's `model:` section: the built-in arch form (arch/preset/...), the
 *                         table forms (params / table / from) and `parts:` composing several of them
 *
 * After the producers, mt_finalize fills what needs the whole table (default_linear biases take the
 * fan_in of their sibling `<module>.weight`) and checks every init rule against its full shape, so a
 * bad rule is an error before anything is allocated.
 *
 * The runtime state (runtime/state.h) is built from a table (stages/common.c) and keeps it as the
 * model's description beside the values (fsdp_state.model, freed with mt_destroy); the state's
 * trainer_cfg is a copy of the table's, set only when the table's trainer is MT_TRAIN_DECODER. */
#ifndef FSDP_MODEL_MODEL_TABLE_H
#define FSDP_MODEL_MODEL_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/tensor.h"
#include "model/init_fill.h"
#include "model/init_rule.h"
#include "runtime/name_index.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The longest parameter name a table accepts (a longer one is refused by name): DCP's keys hold 511
 * bytes, and a parameter's optimizer keys add up to 36 to its name. */
#define MT_NAME_MAX 400
/* The most parameters a table holds (the largest real models have a few thousand tensors; a bound
 * keeps a mistyped range from exhausting memory). */
#define MT_PARAMS_MAX (1 << 22)

typedef struct mt_param {
    char *name;                   /* owned; never moves (the index points at it) */
    int ndim;
    int64_t shape[FSDP_MAX_DIMS]; /* global (unsharded) shape */
    fsdp_dtype dtype;             /* FSDP_DT_F32, FSDP_DT_BF16 or FSDP_DT_F16 */
    init_rule init;               /* INIT_NONE: loaded or copied, never drawn */
    int part;                     /* index in mt_table.parts */
    int layer;                    /* transformer layer of a Llama-family table, else -1 */
    int frozen;                   /* trainable: false (the entry's or its part's): a buffer, never trained */
    /* How the part's source stores the tensor when a `transform:` of the part changed it (src_ndim
     * > 0): the source tensor has shape src_shape, and the parameter is
     * source.permute(src_perm).reshape(shape) (torch's semantics). A load from the part's source
     * (load-ckpt `parts:` without `path`) applies it; src_ndim 0: stored as declared. */
    int src_ndim;
    int64_t src_shape[FSDP_MAX_DIMS];
    int src_perm[FSDP_MAX_DIMS];
} mt_param;

typedef struct mt_part {
    char *name;   /* unique within the table */
    char *prefix; /* prepended to every name of the part ("" for none) */
    char *source; /* what it is, for messages: "HF directory /x", "table file t.yaml", "inline table" */
    char *where;  /* file:line:col of its declaration in the recipe ("" when not from a recipe) */
    /* A part declared `from:` a checkpoint (mt_part_set_source): where its values are, and which of
     * the source's keys it takes, so that load-ckpt `parts:` without `path` reads them from there,
     * every key the part left out being dropped on purpose. from NULL: the part has no source. */
    char *from;
    int format;            /* ckpt_format of the source (CKPT_AUTO: detected) */
    char **strip;          /* prefix alternatives: the first one a key starts with is removed (a key */
    size_t n_strip;        /* that starts with none is not the part's); none: keys as they are */
    char **keys;           /* globs on the stripped keys: the part takes only these (keys_given) */
    size_t n_keys;
    int keys_given;        /* 1: `keys:` was given (even when its ranges expanded to no glob) */
    char **exclude;        /* globs on the stripped keys: the part leaves these out */
    size_t n_exclude;
} mt_part;

typedef enum mt_trainer { MT_TRAIN_NONE = 0, MT_TRAIN_DECODER = 1 } mt_trainer;

typedef struct mt_table {
    mt_param *p;
    size_t n, cap;
    nidx names; /* name -> index in p */
    mt_part *parts;
    size_t n_parts, cap_parts;
    mt_trainer trainer;
    void *trainer_cfg; /* the trainer's config (a decoder_config when trainer == MT_TRAIN_DECODER), owned */
    char kind[256];   /* what the model is, for messages ("llama3 (preset debugmodel)", "composed model ...") */
    int incomplete;   /* validate only: a source could not be read yet, the table lacks its parameters */
} mt_table;

/* An empty table (a zeroed mt_table is one too). */
void mt_init(mt_table *t);
void mt_free(mt_table *t);
/* mt_free, then free(t): for a table that was malloc'd (the state's model_free). */
void mt_destroy(mt_table *t);
/* Moves src into dst (dst must be empty or freed); src is left empty. */
void mt_move(mt_table *dst, mt_table *src);

/* Adds a part; *idx receives its index. A part name used twice is FSDP_E_INVALID naming both
 * declarations. */
int mt_add_part(mt_table *t, const char *name, const char *prefix, const char *source, const char *where, int *idx,
                fsdp_err *err);

/* Adds a parameter (p->name is copied; p->part must be a part of t). Checks: a non-empty name of at
 * most MT_NAME_MAX bytes, 0..FSDP_MAX_DIMS dims, no negative dim, a numel that fits int64, dtype
 * f32/bf16/f16, at most MT_PARAMS_MAX parameters in all. A name already in the table is FSDP_E_INVALID naming both parts and, when the shapes
 * differ, both shapes ("shape conflict"). */
int mt_add(mt_table *t, const mt_param *p, fsdp_err *err);
/* Removes parameter i (the ones after it move down by one). */
int mt_remove(mt_table *t, size_t i, fsdp_err *err);
/* The index of the part named `name`, or -1. */
long mt_find_part(const mt_table *t, const char *name);

/* Index of a name, -1 when absent: O(log n). */
long mt_find(const mt_table *t, const char *name);
/* Elements of p (1 for 0-d). */
int64_t mt_param_numel(const mt_param *p);
/* Elements per dim-0 row (1 for 0-d and 1-d). */
int64_t mt_param_row_numel(const mt_param *p);
/* Total elements of the table; -1 when it overflows int64. */
int64_t mt_total(const mt_table *t);
/* Elements rank 0 holds when every parameter is Shard(0) over world ranks (ceil(rows / world) rows
 * each, 0-d values replicated): the largest shard. -1 on overflow or world < 1. */
int64_t mt_shard_numel(const mt_table *t, int world);

/* The source of part `part`: its path, format, prefix alternatives and key globs (copied). */
int mt_part_set_source(mt_table *t, int part, const char *from, int format, const char *const *strip, size_t n_strip,
                       const char *const *keys, size_t n_keys, int keys_given, const char *const *exclude,
                       size_t n_exclude, fsdp_err *err);
/* Whether the stripped source key `key` is one part `part` takes (its keys and exclude globs). */
int mt_part_takes(const mt_part *p, const char *key);

/* "the model's parts: a (HF directory x, r.yaml:3:5), b (...)" style description of part i. */
void mt_part_describe(const mt_table *t, int part, char *buf, size_t cap);
/* The model kind for messages (t->kind, or "empty model"). */
const char *mt_kind(const mt_table *t);
/* 1 when train-steps can train the model (trainer MT_TRAIN_DECODER). */
int mt_can_train(const mt_table *t);

/* Fills default_linear biases' fan_in from their sibling `<module>.weight` and checks every init
 * rule against its parameter's full shape (FSDP_E_INVALID naming the parameter and its part). */
int mt_finalize(mt_table *t, fsdp_err *err);

/* The rng distribution of p's init rule (FSDP_E_INVALID for INIT_NONE, a fixed table or a bad rule,
 * naming p). */
int mt_param_dist(const mt_param *p, rng_dist *d, fsdp_err *err);
/* What fills p from its init rule: j's stream and its dist or fixed table (init_job_for_rule);
 * the element range and output are left to the caller. FSDP_E_INVALID as mt_param_dist, for a fixed
 * table when p's shape is not the one it needs. */
int mt_param_init_job(const mt_param *p, init_job *j, fsdp_err *err);

/* dtype names a table accepts: "f32" / "float32", "bf16" / "bfloat16", "f16" / "float16";
 * FSDP_DT_INVALID otherwise. */
fsdp_dtype mt_dtype_from_name(const char *name);

#ifdef __cplusplus
}
#endif
#endif
