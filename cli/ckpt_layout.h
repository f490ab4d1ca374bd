/* Layouts in the ckpt tools (layouts/layout.h): convert --from/--to, inspect's and diff's detection. */
#ifndef FSDP_CLI_CKPT_LAYOUT_H
#define FSDP_CLI_CKPT_LAYOUT_H

#include <stddef.h>
#include <stdio.h>

#include "ckpt/ckpt_reshard.h"
#include "ckpt/reader.h"
#include "layouts/layout.h"

/* What --from / --to asked for: names (or NULL / "auto") and the model's head counts. */
typedef struct ckcl_req {
    const char *from, *to;
    int n_heads, n_kv_heads;
    const char *const *group_opt; /* --option NAME=VALUE, n_group_opt of them */
    size_t n_group_opt;
} ckcl_req;

/* *r seen as fsdp-run's layout (from: "auto" or NULL detects, a name takes that one), then, when to is set,
 * in layout `to`; *r is replaced by the view (which owns it), *canon is the view in fsdp-run's layout (owned
 * by *r when to is set). On failure *r is closed (NULL). said (cap bytes): "torchtitan-0.3 -> olmo-core-3"
 * for the report. A layout name fsdp-run does not know is FSDP_E_INVALID listing them. */
int ckcl_wrap(ckpt_reader **r, const ckcl_req *q, ckpt_reader **canon, char *said, size_t cap, fsdp_err *err);
/* Layout `to`'s side file (lay_side_write) into the DCP directory dst, from canon. */
int ckcl_side_write(const char *to, ckpt_reader *canon, const char *dst, fsdp_err *err);
/* A name --to names a layout by (1), or a format (0). */
int ckcl_is_layout(const char *name);
/* e's planner_data nesting as layout `to`'s own save writes key (lay_nest); nothing without a layout. */
void ckcl_nest(const char *to, const char *key, ckrs_entry *e);
/* A DeepSpeed ZeRO checkpoint directory (layouts/lay_deepspeed.h), and it opened in fsdp-run's layout (an error
 * printed to log: 1). */
int ckcl_is_deepspeed(const char *path);
int ckcl_open_deepspeed(const char *path, int heads, int kv_heads, ckpt_reader **r, FILE *log);
/* --to deepspeed-zero1|deepspeed-zero2: the stage (0: not such a name). */
int ckcl_deepspeed_stage(const char *to);
/* Writing one (layouts/lay_deepspeed.h lay_ds_write) from fsdp-run's layout r; gradient_clipping from the options. */
typedef struct ckcl_ds_req {
    int stage, world, n_heads, n_kv_heads;
    const char *const *opt; /* --option NAME=VALUE */
    size_t n_opt;
    int overwrite;
} ckcl_ds_req;
int ckcl_write_deepspeed(ckpt_reader *r, const ckcl_ds_req *q, const char *dst, size_t *written, uint64_t *bytes,
                         fsdp_err *err);
/* A layout's container of several DCP directories at path (lay_container_open): *r the parts as one and *layout
 * its name, or nothing opened (*layout NULL); 0, or 1 after printing an error. */
int ckcl_open_container(const char *path, ckpt_reader **r, const char **layout, FILE *log);
/* The parts of a layout written as directories or files of their own: how many, and part k's name and key prefix;
 * whether it is a torch.save file (else a DCP directory), and writing such a part from r (a view in the layout). */
size_t ckcl_n_parts(const char *layout);
void ckcl_part(const char *layout, size_t k, const char **name, const char **prefix);
int ckcl_part_is_pt(const char *layout, size_t k);
int ckcl_part_write_pt(const char *layout, ckpt_reader *r, size_t k, const char *path, fsdp_err *err);
/* What `inspect` and `diff` open beyond ckpt_open: 2 a DeepSpeed ZeRO directory's files as one (*said: what it is),
 * 3 a layout's container of parts as one (*said: the layout's name), 0 neither (nothing opened), 1 an error
 * (printed). */
int ckcl_open_inspect(const char *path, ckpt_reader **r, char *said, size_t cap, FILE *log);
/* A checkpoint whose tensors are placeholders for values kept elsewhere (lay_check_placeholders): an error. */
int ckcl_check(ckpt_reader *r, fsdp_err *err);
/* inspect's line: "layout: NAME (SYSTEM; covers ...)", or why none / which candidates. json: the name or null. */
void ckcl_print_layout(ckpt_reader *r, FILE *out);
const char *ckcl_layout_name(ckpt_reader *r);
/* The same line for a layout known by name (a container's, ckcl_open_inspect's 3). */
void ckcl_print_layout_named(const char *name, FILE *out);

#endif
