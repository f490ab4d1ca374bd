/* Internals of the layout views (layouts/lay_view.c, layouts/lay_groups.c). */
#ifndef FSDP_LAYOUTS_LAY_VIEW_IMPL_H
#define FSDP_LAYOUTS_LAY_VIEW_IMPL_H

#include "ckpt/namemap.h"
#include "ckpt/reader_view.h"
#include "layouts/layout.h"

#define LAY_CANON_OPTIM "optimizer."
#define LAY_NAME_CAP NMAP_NAME_MAX

typedef struct lay_pair {
    size_t src;
    int64_t s, v; /* source row s fills view row v */
} lay_pair;

typedef struct lay_job {
    ckpt_reader *src;
    const lay_layout *L;
    lay_dir dir;
    const lay_facts *f;
    ckv_builder *b;
    lay_pair *p; /* scratch for one tensor's rows */
    size_t p_cap;
    /* LAY_IDS_MODULE_ORDER: the trainer's parameter names by id */
    char **id_name;
    size_t n_ids;
} lay_job;

/* what a key is: a weight, a moment (state.<fqn>.<kind>), an option (param_groups.<fqn>.<opt>), other */
typedef enum lay_kkind { LAY_K_WEIGHT = 0, LAY_K_MOMENT, LAY_K_OPTION, LAY_K_OTHER } lay_kkind;

/* Splits key (of the trainer's side when native, else fsdp-run's) into its kind, fqn (LAY_NAME_CAP bytes) and
 * last component (128 bytes: the moment's kind, the option). */
lay_kkind lay_classify(const lay_job *J, int native, const char *key, char *fqn, char *last);
/* The whole key of fqn of kind k on a side (LAY_NAME_CAP bytes). */
int lay_full_name(const lay_job *J, int native, lay_kkind k, const char *fqn, const char *last, char *out,
                  fsdp_err *err);
/* The canonical names of the trainer's parameter fqn (its parts when fused), in order; *n of them. */
int lay_canon_fqns(const lay_job *J, const char *fqn, unsigned what, char (*out)[LAY_NAME_CAP], int *n, fsdp_err *err);
/* The trainer's name of canonical parameter fqn; *secondary 1 when it is a fused tensor's part other than the
 * first (the fused tensor is named with its first part). */
int lay_native_fqn(const lay_job *J, const char *fqn, unsigned what, char *out, int *secondary, fsdp_err *err);

/* LAY_IDS_MODULE_ORDER (layouts/lay_ids.c): the ids of the trainer's parameters, from the model keys of the
 * source (its own side's when TO_CANON, mapped to its names when FROM_CANON); the name of id i ("" when none); the
 * id of a trainer's name (-1). */
int lay_ids_build(lay_job *J, fsdp_err *err);
void lay_ids_free(lay_job *J);
const char *lay_id_name(const lay_job *J, long i);
long lay_name_id(const lay_job *J, const char *native_fqn);

/* Param groups of an indexed layout (layouts/lay_groups.c). TO_CANON: option opt of the trainer's group g
 * (source entry i) given to every parameter of the group's list. FROM_CANON: after every key, the groups of
 * the canonical options, each with its list of parameter names. */
int lay_group_to_canon(lay_job *J, size_t i, const char *g, const char *opt, fsdp_err *err);
int lay_groups_from_canon(lay_job *J, fsdp_err *err);

/* The layout's side file (layouts/lay_side.c) into the view: its values under fsdp-run's names. */
int lay_side_read(lay_job *J, fsdp_err *err);

#endif
