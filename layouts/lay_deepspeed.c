/* DeepSpeed ZeRO checkpoints in fsdp-run's layout (layouts/lay_deepspeed.h): the files, and the parameters'
 * list; layouts/lay_deepspeed_map.c maps each parameter onto the ranks' partitions. */
#include "layouts/lay_deepspeed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/reader_union.h"
#include "layouts/lay_deepspeed_impl.h"

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The model states file of tag directory dir (ZeRO-1/2's, else ZeRO-3's rank 0) into out; 0 when none. */
static int model_states(const char *dir, char *out, size_t cap) {
    snprintf(out, cap, "%s/mp_rank_00_model_states.pt", dir);
    if (is_file(out)) return 1;
    snprintf(out, cap, "%s/zero_pp_rank_0_mp_rank_00_model_states.pt", dir);
    return is_file(out);
}

/* Rank r's optimizer file of dir into out; 0 when none. */
static int optim_states(const char *dir, int r, char *out, size_t cap) {
    snprintf(out, cap, "%s/zero_pp_rank_%d_mp_rank_00_optim_states.pt", dir, r);
    if (is_file(out)) return 1;
    snprintf(out, cap, "%s/bf16_zero_pp_rank_%d_mp_rank_00_optim_states.pt", dir, r);
    return is_file(out);
}

/* The tag directory of path: path/<contents of path/latest>, else path itself. */
static void tag_dir(const char *path, char *out, size_t cap) {
    char latest[4200], tag[256] = "";
    snprintf(latest, sizeof latest, "%s/latest", path);
    FILE *f = fopen(latest, "r");
    if (f) {
        size_t n = fread(tag, 1, sizeof tag - 1, f);
        fclose(f);
        tag[n] = '\0';
        while (n && (tag[n - 1] == '\n' || tag[n - 1] == ' ' || tag[n - 1] == '\r')) tag[--n] = '\0';
    }
    if (tag[0] && !strchr(tag, '/')) snprintf(out, cap, "%s/%s", path, tag);
    else snprintf(out, cap, "%s", path);
}

int lay_ds_is(const char *path) {
    char dir[4400], f[4600];
    struct stat st;
    if (stat(path, &st) || !S_ISDIR(st.st_mode)) return 0;
    tag_dir(path, dir, sizeof dir);
    return model_states(dir, f, sizeof f) && optim_states(dir, 0, f, sizeof f);
}

/* Every file of the checkpoint as one union: "ms." the model states, "r<R>." rank R's optimizer state. */
int lay_ds_open_files(const char *path, ckpt_reader **out, int *ranks, fsdp_err *err) {
    char dir[4400], f[4600];
    tag_dir(path, dir, sizeof dir);
    if (!model_states(dir, f, sizeof f))
        return fsdp_err_set(err, FSDP_E_FORMAT, "DeepSpeed checkpoint %s: no mp_rank_00_model_states.pt nor "
                            "zero_pp_rank_0_mp_rank_00_model_states.pt in %s", path, dir);
    enum { MAX_RANKS = 4096 };
    ckpt_reader **parts = calloc(MAX_RANKS + 1, sizeof *parts);
    char(*pre)[16] = calloc(MAX_RANKS + 1, sizeof *pre);
    const char **pp = calloc(MAX_RANKS + 1, sizeof *pp);
    if (!parts || !pre || !pp) return free(parts), free(pre), free(pp), fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = ckpt_open(f, CKPT_PT, &parts[0], err);
    size_t n = rc ? 0 : 1;
    snprintf(pre[0], sizeof pre[0], "ms.");
    for (int r = 0; !rc && r < MAX_RANKS && optim_states(dir, r, f, sizeof f); r++) {
        if ((rc = ckpt_open(f, CKPT_PT, &parts[n], err))) break;
        snprintf(pre[n], sizeof pre[n], "r%d.", r);
        n++;
    }
    if (!rc && n < 2)
        rc = fsdp_err_set(err, FSDP_E_FORMAT, "DeepSpeed checkpoint %s: no zero_pp_rank_0_mp_rank_00_optim_states.pt in %s "
                          "(the weights and moments of a ZeRO checkpoint live there)", path, dir);
    for (size_t k = 0; k < n; k++) pp[k] = pre[k];
    *ranks = (int)n - 1;
    if (!rc) rc = ckpt_union_open(path, parts, pp, n, out, err);
    else
        for (size_t k = 0; k < n; k++) ckpt_close(parts[k]);
    free(parts), free(pre), free(pp);
    return rc;
}

/* "torch.Size((256, 64),)" -> shape */
static int parse_size(const char *t, int *ndim, int64_t *shape) {
    const char *p = t ? strstr(t, "((") : NULL;
    *ndim = 0;
    if (!p) return -1;
    p += 2;
    while (*p && *p != ')' && *ndim < FSDP_MAX_DIMS) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p) return -1;
        shape[(*ndim)++] = v;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    return *p == ')' ? 0 : -1;
}

/* param_shapes: every parameter, its group and shape, in the flat order. */
static int list_params(lay_ds *d, fsdp_err *err) {
    ckpt_reader *r = d->u;
    static const char pre[] = "ms.param_shapes.";
    d->p = calloc(ckpt_count(r) ? ckpt_count(r) : 1, sizeof *d->p);
    if (!d->p) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < ckpt_count(r); i++) {
        const char *name = ckpt_entry_at(r, i)->name;
        if (!strncmp(name, "ms.frozen_param_shapes.", 23) || !strncmp(name, "ms.shared_params.", 17))
            return fsdp_err_set(err, FSDP_E_FORMAT, "DeepSpeed checkpoint %s: %s: frozen or shared (tied) parameters are "
                                "not read yet", d->path, name + 3);
        if (strncmp(name, pre, sizeof pre - 1)) continue;
        char *end;
        long g = strtol(name + sizeof pre - 1, &end, 10);
        lay_ds_param *p = &d->p[d->n];
        if (*end != '.' || g < 0 || parse_size(ckpt_value_text(r, i), &p->ndim, p->shape))
            return fsdp_err_set(err, FSDP_E_FORMAT, "DeepSpeed checkpoint %s: %s: expected torch.Size((...)) of a "
                                "parameter", d->path, name + 3);
        p->group = (int)g;
        snprintf(p->name, sizeof p->name, "%s", end + 1);
        p->numel = fsdp_numel(p->ndim, p->shape);
        d->n++;
    }
    return d->n ? 0 : fsdp_err_set(err, FSDP_E_FORMAT, "DeepSpeed checkpoint %s: no param_shapes", d->path);
}

static int zero_stage(lay_ds *d, fsdp_err *err) {
    long i = ckpt_find(d->u, "r0.optimizer_state_dict.zero_stage");
    const char *t = i >= 0 ? ckpt_value_text(d->u, (size_t)i) : NULL;
    const char *p = t ? strstr(t, "ZeroStageEnum(") : NULL;
    d->stage = p ? atoi(p + 14) : 0;
    if (d->stage < 1 || d->stage > 3)
        return fsdp_err_set(err, FSDP_E_FORMAT, "DeepSpeed checkpoint %s: no ZeRO stage 1, 2 or 3 in "
                            "optimizer_state_dict.zero_stage (%s)", d->path, t ? t : "absent");
    /* every rank's file is there: partition_count (an int under ZeRO-3, a list of one per group under ZeRO-1/2) */
    i = ckpt_find(d->u, "r0.optimizer_state_dict.partition_count");
    t = i >= 0 ? ckpt_value_text(d->u, (size_t)i) : NULL;
    long n = t ? strtol(t + (t[0] == '[' ? 1 : 0), NULL, 10) : 0;
    if (n != d->ranks)
        return fsdp_err_set(err, FSDP_E_FORMAT, "DeepSpeed checkpoint %s: its partitions are %s of %ld ranks, and %d "
                            "rank%s optimizer file%s there (zero_pp_rank_R_mp_rank_00_optim_states.pt)", d->path,
                            t ? "those" : "(no partition_count)", n, d->ranks, d->ranks == 1 ? "'s" : "s'",
                            d->ranks == 1 ? " is" : "s are");
    return 0;
}

int lay_ds_open(const char *path, const lay_facts *f, ckpt_reader **out, fsdp_err *err) {
    *out = NULL;
    lay_ds d;
    memset(&d, 0, sizeof d);
    d.path = path;
    d.hf.n_heads = f ? f->n_heads : 0;
    d.hf.n_kv_heads = f ? f->n_kv_heads : 0;
    int rc = lay_ds_open_files(path, &d.u, &d.ranks, err);
    if (!rc) rc = zero_stage(&d, err);
    if (!rc) rc = list_params(&d, err);
    if (!rc && (rc = ckv_new(d.u, 1, &d.b, err))) ckpt_close(d.u);
    else if (rc && d.u) ckpt_close(d.u);
    if (!rc) {
        rc = lay_ds_map(&d, err);
        if (rc) ckv_free(d.b);
        else rc = ckv_finish(d.b, out, err);
    }
    free(d.p);
    free(d.pieces);
    free(d.opts);
    return rc;
}
