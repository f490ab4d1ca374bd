/* Layouts in the ckpt tools (cli/ckpt_layout.h). */
#include "cli/ckpt_layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/lay_deepspeed.h"

static int pick(const char *name, ckpt_reader *r, const lay_layout **L, fsdp_err *err) {
    char names[512];
    if (!name || !strcmp(name, "auto")) return lay_detect(r, lay_find("torchtitan"), L, err);
    if ((*L = lay_find(name))) return 0;
    return fsdp_err_set(err, FSDP_E_INVALID, "no layout named %s (layouts: %s, or auto)", name,
                        lay_names(names, sizeof names));
}

int ckcl_is_layout(const char *name) { return name && lay_find(name) != NULL; }

int ckcl_wrap(ckpt_reader **r, const ckcl_req *q, ckpt_reader **canon, char *said, size_t cap, fsdp_err *err) {
    const lay_layout *from, *to = NULL;
    int rc = pick(q->from, *r, &from, err);
    if (!rc && q->to) rc = pick(q->to, *r, &to, err);
    if (!rc && to && to->no_write)
        rc = fsdp_err_set(err, FSDP_E_INVALID, "fsdp-run does not write layout %s: %s", to->name, to->no_write);
    if (rc) {
        ckpt_close(*r);
        *r = NULL;
        return rc;
    }
    for (size_t k = 0; to && k < q->n_group_opt && !rc; k++) { /* a setting the layout does not keep is a mistake */
        if (!lay_option_known(to, q->group_opt[k], strcspn(q->group_opt[k], "=")))
            rc = fsdp_err_set(err, FSDP_E_INVALID, "--option %s: %s keeps no such setting in its checkpoint", q->group_opt[k],
                              to->name);
    }
    if (rc) {
        ckpt_close(*r);
        *r = NULL;
        return rc;
    }
    lay_facts f = {q->n_heads, q->n_kv_heads, ckpt_reader_path(*r), q->group_opt, q->n_group_opt};
    ckpt_reader *v;
    if ((rc = lay_view(*r, 1, from, LAY_TO_CANON, &f, &v, NULL, err))) {
        *r = NULL; /* closed by lay_view */
        return rc;
    }
    *r = v;
    *canon = v;
    size_t left = 0;
    if (to) {
        if ((rc = lay_view(*r, 1, to, LAY_FROM_CANON, &f, &v, &left, err))) {
            *r = NULL;
            return rc;
        }
        *r = v;
    }
    int n = snprintf(said, cap, "%s -> %s", from->name, to ? to->name : "torchtitan-0.2 (fsdp-run's own)");
    if (left && n > 0 && (size_t)n < cap)
        snprintf(said + n, cap - (size_t)n, " (left out %zu entries of train_state.*, lr_scheduler.*, dataloader.*: "
                 "%s holds none of them%s%s%s)", left, to->name, to->side ? "; its " : "", to->side ? to->side->file : "",
                 to->side ? " has the step and tokens seen" : "");
    n = (int)strlen(said);
    if (to && to->values_file && (size_t)n < cap)
        snprintf(said + n, cap - (size_t)n, " (%s* in its %s)", to->values_prefix, to->values_file);
    return 0;
}

void ckcl_print_layout(ckpt_reader *r, FILE *out) {
    const lay_layout *L;
    fsdp_err err;
    char names[512];
    size_t n = 0;
    for (size_t i = 0; i < lay_count(); i++) n += (size_t)lay_matches(r, lay_at(i));
    if (!n) fprintf(out, "layout: none of fsdp-run's (%s)\n", lay_names(names, sizeof names));
    else if (lay_detect(r, NULL, &L, &err)) fprintf(out, "layout: ambiguous: %s\n", err.msg);
    else fprintf(out, "layout: %s (%s; %s)\n", L->name, L->system, L->covers);
}

void ckcl_print_layout_named(const char *name, FILE *out) {
    const lay_layout *L = lay_find(name);
    if (L) fprintf(out, "layout: %s (%s; %s)\n", L->name, L->system, L->covers);
}

const char *ckcl_layout_name(ckpt_reader *r) {
    const lay_layout *L;
    fsdp_err err;
    return lay_detect(r, NULL, &L, &err) ? NULL : L->name;
}

int ckcl_side_write(const char *to, ckpt_reader *canon, const char *dst, fsdp_err *err) {
    const lay_layout *L = lay_find(to);
    return L && canon ? lay_side_write(L, canon, dst, err) : 0;
}

void ckcl_nest(const char *to, const char *key, ckrs_entry *e) {
    int nest, tail;
    unsigned mask;
    if (!to || !lay_nest(lay_find(to), key, &nest, &tail, &mask)) return;
    e->nest = (int16_t)nest, e->tail = (int16_t)tail, e->int_mask = (uint16_t)mask;
}

int ckcl_check(ckpt_reader *r, fsdp_err *err) { return lay_check_placeholders(r, err); }

int ckcl_is_deepspeed(const char *path) { return lay_ds_is(path); }

int ckcl_open_deepspeed(const char *path, int heads, int kv_heads, ckpt_reader **r, FILE *log) {
    lay_facts f = {heads, kv_heads > 0 ? kv_heads : heads, path, NULL, 0};
    fsdp_err err;
    int rc = lay_ds_open(path, &f, r, &err);
    if (rc) fprintf(log, "fsdp-run ckpt: error: %s\n", err.msg);
    return rc ? 1 : 0;
}

int ckcl_deepspeed_stage(const char *to) { return lay_ds_stage_of(to); }

int ckcl_write_deepspeed(ckpt_reader *r, const ckcl_ds_req *q, const char *dst, size_t *written, uint64_t *bytes,
                         fsdp_err *err) {
    lay_ds_wopts o = {q->stage, q->world, -1, 0, NULL, q->overwrite, written, bytes};
    int rc = lay_ds_wopts_options(q->opt, q->n_opt, &o, err);
    if (rc) return rc;
    lay_facts f = {q->n_heads, q->n_kv_heads > 0 ? q->n_kv_heads : q->n_heads, NULL, NULL, 0};
    return lay_ds_write(r, &f, dst, &o, err);
}

int ckcl_open_container(const char *path, ckpt_reader **r, const char **layout, FILE *log) {
    const lay_layout *L;
    fsdp_err err;
    *layout = NULL;
    int rc = lay_container_open(path, &L, r, &err);
    if (rc < 0) {
        fprintf(log, "fsdp-run ckpt: error: %s\n", err.msg);
        return 1;
    }
    if (rc) *layout = L->name;
    return 0;
}

size_t ckcl_n_parts(const char *layout) {
    const lay_layout *L = lay_find(layout);
    return L ? L->n_parts : 0;
}

void ckcl_part(const char *layout, size_t k, const char **name, const char **prefix) {
    const lay_layout *L = lay_find(layout);
    *name = L->parts[k], *prefix = L->part_keys[k];
}

int ckcl_part_is_pt(const char *layout, size_t k) { return lay_part_is_file(lay_find(layout), k); }

int ckcl_part_write_pt(const char *layout, ckpt_reader *r, size_t k, const char *path, fsdp_err *err) {
    return lay_part_write_file(lay_find(layout), r, k, path, err);
}

int ckcl_open_inspect(const char *path, ckpt_reader **r, char *said, size_t cap, FILE *log) {
    fsdp_err err;
    said[0] = '\0';
    if (lay_ds_is(path)) {
        int ranks;
        if (lay_ds_open_files(path, r, &ranks, &err)) {
            fprintf(log, "fsdp-run ckpt: error: %s\n", err.msg);
            return 1;
        }
        snprintf(said, cap, "a DeepSpeed ZeRO checkpoint of %d rank%s: its files below (ms. the model states, r<R>. "
                 "rank R's optimizer state); load-ckpt and convert read it in fsdp-run's layout", ranks,
                 ranks == 1 ? "" : "s");
        return 2;
    }
    const char *layout;
    if (ckcl_open_container(path, r, &layout, log)) return 1;
    if (layout) snprintf(said, cap, "%s", layout); /* told apart by its files (olmo-0.6-st's keys are olmo-0.6's) */
    return layout ? 3 : 0;
}
