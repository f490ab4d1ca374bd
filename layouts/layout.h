/* Trainers' checkpoint layouts as data (module prefix lay_).
 *
 * fsdp-run's own layout, the "canonical" one every load and save speaks, is torchtitan's classic one
 * (ckpt/namemap.h: `tok_embeddings.weight`, `layers.{i}.attention.wq.weight`, ..., `output.weight`; q/k rows
 * in interleaved RoPE order) with its training entries: `optimizer.state.<fqn>.<kind>` (AdamW's exp_avg,
 * exp_avg_sq, step), `optimizer.param_groups.<fqn>.<option>`, `train_state.*`, `lr_scheduler.*`,
 * `dataloader.*`. A trainer's layout is one lay_layout row (a file per trainer, layouts/lay_<trainer>.c):
 *   - the prefix of its weights and of its optimizer state (`<optim>state.<fqn>.<kind>`,
 *     `<optim>param_groups.<fqn>.<option>`: a moment or an option follows its parameter's name);
 *   - name rules: glob pairs (ckpt/namemap.h's `*` and `**`), canonical <-> its own, e.g.
 *     "layers.*.attention.wq.weight" <-> "blocks.*.attention.w_q.weight";
 *   - fused tensors: one of its tensors whose rows are several canonical tensors' (torchtitan 0.3's wqkv,
 *     fms's qkv_fused), with their order (one after another, or torchtitan 0.3's GQA interleave
 *     [n_kv, heads_per_kv + 2, head_dim]) and whether the weights, the moments or both are fused; a moment
 *     of a fused tensor is split and fused with it, its 0-d `step` and its options copied to every part;
 *   - the RoPE row order its q/k weights expect (interleaved, or rotate-half: the rows of wq, wk, their
 *     biases and the q/k-norm weights are permuted inside each head, as `names: hf` does);
 *   - marks: keys that tell its checkpoints apart (`auto` detection).
 * A view (ckpt/reader_view.h) shows a checkpoint of one layout in the other without copying it:
 * LAY_TO_CANON reads a trainer's checkpoint as fsdp-run's (load-ckpt, convert --from), LAY_FROM_CANON shows
 * a canonical checkpoint in the trainer's names (convert --to, save in a layout). A key no rule maps passes
 * through under its own name (a strict load then names it unexpected), so nothing is dropped silently. */
#ifndef FSDP_LAYOUTS_LAYOUT_H
#define FSDP_LAYOUTS_LAYOUT_H

#include <stddef.h>

#include "ckpt/reader.h"
#include "fsdp/error.h"

typedef enum lay_rope { LAY_ROPE_INTERLEAVED = 0, LAY_ROPE_HALF = 1 } lay_rope;
typedef enum lay_dir { LAY_TO_CANON = 0, LAY_FROM_CANON = 1 } lay_dir;

typedef struct lay_name {
    const char *canon, *native; /* globs with the same wildcards */
} lay_name;

typedef enum lay_fuse_kind {
    LAY_FUSE_QKV = 0, /* q rows (n_heads heads), then k (n_kv heads), then v (n_kv heads) */
    LAY_FUSE_GQA = 1, /* per kv head j: its heads_per_kv q heads, then k head j, then v head j */
    LAY_FUSE_EQUAL = 2 /* the parts one after another, of equal rows (fms's wg1_fused: gate, then up) */
} lay_fuse_kind;

#define LAY_FUSE_WEIGHTS 1u
#define LAY_FUSE_MOMENTS 2u
#define LAY_MAX_PARTS 3

typedef struct lay_fuse {
    const char *native;                   /* its fused tensor (a glob) */
    const char *part[LAY_MAX_PARTS];      /* the canonical tensors, in order (globs with the same wildcards) */
    int n_part;
    lay_fuse_kind kind;
    unsigned what;                        /* LAY_FUSE_WEIGHTS | LAY_FUSE_MOMENTS */
} lay_fuse;

/* How its optimizer's param groups are keyed: by parameter (`<optim>param_groups.<fqn>.<option>`, torchtitan's
 * flattened form, fsdp-run's), or by index as torch's Optimizer.state_dict() nests them
 * (`<optim>param_groups.<i>.<option>` and `<optim>param_groups.<i>.params`, the list of the group's parameter
 * names: OLMo-core's save_model_and_optim_state). Reading the indexed form gives every parameter of group i
 * group i's options; writing it makes one group per set of equal options, in the parameters' order. */
typedef enum lay_groups { LAY_GROUPS_BY_FQN = 0, LAY_GROUPS_INDEXED = 1 } lay_groups;

/* How its optimizer state names a parameter: by name, or by integer id (torch's plain optimizer.state_dict():
 * `<optim>state.<i>.<kind>`, the ids in the params lists of the groups) in the order of the model's
 * named_parameters(), which is the order of the layout's name rules (layer by layer; rules without a layer
 * before the layers when they come before them in the table, after them otherwise). */
typedef enum lay_ids { LAY_IDS_NONE = 0, LAY_IDS_MODULE_ORDER = 1 } lay_ids;

/* A torch.save file of plain values beside the checkpoint (fms-fsdp's metadata.pth: {"tokens_seen": N,
 * "step": N}): its dict keys and the fsdp-run entries they are. Read into the view (LAY_TO_CANON, when
 * lay_facts.dir names the checkpoint's directory); written by lay_side_write. */
#define LAY_SIDE_MAX 4
typedef struct lay_side {
    const char *file;
    const char *key[LAY_SIDE_MAX];
    const char *canon[LAY_SIDE_MAX];
    int n;
    const char *empty_list[LAY_SIDE_MAX]; /* keys written as [] (OLMo's train.pt lists of earlier checkpoints) */
    int n_empty;
    /* not read: the trainer's own file holds objects outside the pickle allow-list (OLMo's numpy RNG states) */
    int write_only;
} lay_side;

/* A param-group option the trainer's groups need and fsdp-run's lack (OLMo's max_grad_norm, which its clipping
 * reads from the loaded groups): written into every group with its value from `--option NAME=VALUE`, else
 * def (a Python literal); def NULL: the option must be given. */
typedef struct lay_add_option {
    const char *name, *def;
} lay_add_option;

typedef struct lay_layout {
    const char *name;     /* "torchtitan-0.3" */
    const char *system;   /* "torchtitan 0.3.0 (CheckpointManager)", for the log and the README */
    const char *covers;   /* "weights, optimizer, train_state, lr_scheduler, dataloader" */
    const char *model;    /* prefix of its weights ("" top level) */
    const char *optim;    /* prefix of its optimizer state ("optimizer.") */
    lay_rope rope;
    const lay_name *names;
    size_t n_names;
    const lay_fuse *fuse;
    size_t n_fuse;
    const char *const *marks; /* globs of keys only its checkpoints have (any one: this layout) */
    size_t n_marks;
    lay_groups groups;
    /* fsdp-run's training entries besides the weights and the optimizer (train_state.*, lr_scheduler.*,
     * dataloader.*) it keeps, as globs; the others are left out of a view in its layout (and counted) */
    const char *const *extra;
    size_t n_extra;
    const lay_side *side; /* NULL: none */
    lay_ids ids;
    /* A container of several DCP directories under the checkpoint's (accelerate's pytorch_model_fsdp_0 and
     * optimizer_0): their names and the prefix of the keys each holds; read as one (lay_container_open). */
    const char *const *parts;
    const char *const *part_keys;
    size_t n_parts;
    const char *const *part_prefix; /* NULL: the parts' keys as they are; else put before each part's keys */
    int parts_stkey; /* the parts are safetensors files named in OLMo's key encoding (layouts/lay_stkey.h) */
    /* Why fsdp-run does not write this layout (NULL: it does): convert --to refuses it with this. */
    const char *no_write;
    /* Param-group options of fsdp-run's its groups do not have (NULL-terminated; a plain AdamW without a scheduler
     * has no initial_lr): left out when writing it */
    const char *const *no_options;
    const lay_add_option *add_options; /* NULL-name-terminated; NULL: none */
    /* another key of each indexed group holding the same list as its `params` (OLMo's param_names); NULL: none */
    const char *params_also;
    /* A torch.save dict beside the checkpoint holding fsdp-run's entries under values_prefix (accelerate's
     * scheduler.bin: torch's LambdaLR.state_dict(), fsdp-run's lr_scheduler.*): read into them, written from them
     * (nothing written when the checkpoint has none). NULL: none. */
    const char *values_file, *values_prefix;
} lay_layout;

/* What a view needs of the model: head counts for q/k row orders and fused q/k/v (0: unknown; a view
 * that needs them then fails naming the tensor). */
typedef struct lay_facts {
    int n_heads, n_kv_heads;
    const char *dir; /* the checkpoint's directory, where the layout's side file is looked for (NULL: none) */
    const char *const *group_opt; /* "NAME=VALUE" options for the layout's add_options (LAY_FROM_CANON) */
    size_t n_group_opt;
} lay_facts;

/* 1 when name (len bytes) is one of L's add_options (a setting --option / save-dcp options: may give). */
int lay_option_known(const lay_layout *L, const char *name, size_t len);
/* Every layout, in the order `auto` tries them. */
size_t lay_count(void);
const lay_layout *lay_at(size_t i);
/* A layout by name (or alias: "torchtitan" is "torchtitan-0.2"); NULL when none. */
const lay_layout *lay_find(const char *name);
/* The names of every layout into buf, ", " between ("torchtitan-0.2, torchtitan-0.3, ..."). */
const char *lay_names(char *buf, size_t cap);

/* The layout of r's keys: the one whose marks match; none is FSDP_E_FORMAT saying so (unless
 * fallback is not NULL: then *out = fallback); two or more is FSDP_E_FORMAT listing the candidates with a
 * key of each. */
int lay_detect(ckpt_reader *r, const lay_layout *fallback, const lay_layout **out, fsdp_err *err);
/* 1 when r has a key matching one of L's marks. */
int lay_matches(ckpt_reader *r, const lay_layout *L);

/* A view of src in direction dir (src kept open; closed with the view when own). A layout whose
 * rules are all the identity gives a view of src's own entries. *omitted (may be NULL): how many of fsdp-run's
 * training entries L does not hold were left out (LAY_FROM_CANON). */
int lay_view(ckpt_reader *src, int own, const lay_layout *L, lay_dir dir, const lay_facts *f, ckpt_reader **out,
             size_t *omitted, fsdp_err *err);
/* L's side file into dir, from canonical reader r's entries (a missing train_state.step: the optimizer's
 * step; a missing count: 0), and its values file (lay_layout.values_file). Nothing when L has neither. */
int lay_side_write(const lay_layout *L, ckpt_reader *r, const char *dir, fsdp_err *err);
/* Part `part` of L that is one file (lay_part_is_file) from r, a view in L's names: the keys of the part's prefix
 * nested as the trainer's own file nests them, written to path (its temporary renamed at the end): a torch.save file
 * (.pt), or OLMo's safetensors twin of one (.safetensors of a row with parts_stkey: layouts/lay_stkey.h). */
int lay_part_write_file(const lay_layout *L, ckpt_reader *r, size_t part, const char *path, fsdp_err *err);
int lay_part_write_pt(const lay_layout *L, ckpt_reader *r, size_t part, const char *path, fsdp_err *err);
int lay_part_write_st(const lay_layout *L, ckpt_reader *r, size_t part, const char *path, fsdp_err *err);
/* 1 when part `part` of L is one file (a torch.save .pt, a .safetensors twin), 0 when a DCP directory. */
int lay_part_is_file(const lay_layout *L, size_t part);
/* When path is a directory holding a layout's parts (lay_layout.parts): *L that layout and *r its parts read as
 * one checkpoint (its keys as the layout names them), 1; else 0 (nothing opened) or an error opening them (-1). */
int lay_container_open(const char *path, const lay_layout **L, ckpt_reader **r, fsdp_err *err);
/* How L's own save nests key of its layout in the state dict (a DCP's planner_data path; dcp_record's nest,
 * tail and int_mask): the model prefix a level of its own, and an indexed layout's optimizer torch's nested
 * state_dict ((optim, "state", fqn, kind), (optim, "param_groups", i, option)). 0 (nest 0): torchtitan's
 * flattened sections. */
int lay_nest(const lay_layout *L, const char *key, int *nest, int *tail, unsigned *int_mask);
/* The order of n parameter names of L (its own names) in the model's module order (named_parameters(): the order of
 * its name rules, layer by layer): order[k] is the index of the k-th. A name no rule matches is FSDP_E_INVALID. */
int lay_module_order(const lay_layout *L, const char *const *names, size_t n, size_t *order, fsdp_err *err);
/* FSDP_E_FORMAT when r holds placeholders for values that live elsewhere (a DeepSpeed ZeRO-3
 * model_states.pt: [0]-shaped weights beside param_shapes), naming the tensor: never read or written as the
 * weights. */
int lay_check_placeholders(ckpt_reader *r, fsdp_err *err);
/* 1 when key is one of fsdp-run's training entries besides the weights and the optimizer. */
int lay_canon_extra(const char *key);

#endif
