/* Stage `save-safetensors`: consolidated weights in one safetensors file (or HF shards with
 * an index). Rank 0 gathers one tensor at a time, so memory stays near the largest tensor.
 * Optional Hugging Face names (with the q/k RoPE row permutation) and bf16. Shards on the GPU are
 * downloaded one parameter at a time. An existing file is replaced atomically (written as `.tmp`,
 * renamed over it); over an existing HF directory the new shards get names of their own and the
 * index is replaced last (ckpt/safetensors_gen.c). Stale temporaries of interrupted saves there are
 * removed and logged.
 *
 * Any model: the parameters under their own names (names: hf needs a Llama-family model), each in its
 * own dtype unless `dtype` says otherwise; every parameter must hold a value. With names: hf a stack of
 * experts (layers.L.moe.experts.w1|w2|w3 [E, ...], ckpt/namemap.h) is written as its E per-expert HF
 * tensors (Mixtral's names when state.hf_moe.moe_style says so).
 * With Hugging Face names the model's config.json is written next to the weights (atomically, after
 * them), so that transformers' from_pretrained opens the directory as it is.
 *
 * `overwrite: false` refuses an output that exists (the file, or the HF directory's index; and any of
 * the copies), at validation (run/checks_outputs.c) and here before anything is written; the
 * default, true, replaces it as above. The directory of a file (and of each copy) is created when
 * it does not exist. `copies: [PATH, ...]` puts the same file at these paths too
 * (Bagel HEAD's ema.safetensors beside model.safetensors): once the file is written and durable,
 * each copy is made atomically with copy_file_range (ckpt/file_copy.h), so it holds the old file or
 * all of the new one; one file only (not with shard_mb > 0).
 *
 * With names: hf a path that does not end in .safetensors is the export's directory (path/model.safetensors
 * and path/config.json: from_pretrained(path) opens it); see st_export_file.
 *
 * with: path (required; a .safetensors file, or a directory when shard_mb > 0 or names: hf),
 *       names (torchtitan|hf), dtype (auto|f32|bf16), shard_mb (int, 0 = one file),
 *       overwrite (bool, true), copies (list of paths) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_pwrite.h"
#include "ckpt/file_copy.h"
#include "ckpt/namemap.h"
#include "ckpt/state_load_parts.h"
#include "ckpt/safetensors.h"
#include "decoder/hf_config.h"
#include "stages/stages.h"
#include "model/mt_state.h"

static const char *const NAMES[] = {"torchtitan", "hf", NULL};
static const char *const DTYPES[] = {"auto", "f32", "bf16", NULL};
static const fsdp_param_spec PARAMS[] = {
    {"path", FSDP_T_STRING, 1, NULL, NULL,
     "output file (a directory when shard_mb > 0, or with names: hf when it does not end in .safetensors)"},
    {"names", FSDP_T_STRING, 0, "torchtitan", NAMES, "tensor names (hf: Hugging Face Llama)"},
    {"dtype", FSDP_T_STRING, 0, "auto", DTYPES, "dtype written (auto: each parameter's dtype)"},
    {"shard_mb", FSDP_T_INT, 0, "0", NULL, "split into model-0000k-of-0000n files of at most this many MB"},
    {"overwrite", FSDP_T_BOOL, 0, "true", NULL,
     "replace an existing output (false: an existing file, or HF directory index, is an error)"},
    {"copies", FSDP_T_LIST, 0, NULL, NULL,
     "more paths that get the same file, each copied atomically once it is written (one file only)"},
    {NULL, 0, 0, NULL, NULL, NULL}};
static const char *const NEEDS[] = {"params|full_params", NULL};

/* config.json next to the weights (in the directory of a file, or in the shards' directory), for
 * the dtype the weights were written in (the first parameter's). */
static int sst_write_config(const fsdp_state *s, const char *dts, const char *path, int is_dir, fsdp_err *err) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", path);
    if (!is_dir) {
        char *slash = strrchr(dir, '/');
        if (!slash) snprintf(dir, sizeof dir, ".");
        else if (slash == dir) dir[1] = '\0';
        else *slash = '\0';
    }
    fsdp_dtype dt = !strcmp(dts, "auto") ? s->p[0].dtype : fsdp_dtype_from_name(dts);
    int rc = hf_config_write(decoder_state_config(s), dt, dir, err);
    return rc ? fsdp_err_prefix(err, "save-safetensors: %s", path) : 0;
}

/* overwrite: false and an output already there (rank 0 decides, everyone learns it) */
static int sst_refuse_existing(comm *c, const fsdp_value *with, const char *path, int sharded, fsdp_err *err) {
    int rc = 0;
    if (comm_rank(c) == 0 && !fsdp_arg_bool(with, "overwrite", 1)) {
        const fsdp_value *cp = fsdp_value_get(with, "copies");
        const char *hit = st_output_exists(path, sharded ? "model" : NULL) ? path : NULL;
        for (size_t i = 0; !hit && i < fsdp_value_size(cp); i++)
            if (st_output_exists(fsdp_value_text(fsdp_value_item(cp, i)), NULL)) hit = fsdp_value_text(fsdp_value_item(cp, i));
        if (hit)
            rc = fsdp_err_set(err, FSDP_E_INVALID,
                              "save-safetensors: %s already exists and overwrite is false: remove it, set overwrite: "
                              "true to replace it, or give another path",
                              hit);
    }
    int who;
    fsdp_err e2;
    int st = comm_agree(c, rc, &who, &e2);
    if (st && !rc) rc = fsdp_err_set(err, st, "save-safetensors: rank %d refused to write %s", who, path);
    return rc;
}

/* The directory a file goes into, created (rank 0, before the file and each copy is written). */
static int sst_parent_dir(const char *file, fsdp_err *err) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", file);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = '\0';
    int rc = st_mkdirs(dir, err);
    return rc ? fsdp_err_prefix(err, "save-safetensors: %s", file) : 0;
}

/* rank 0, once the file is written and durable: the copies */
static int sst_copies(fsdp_ctx *ctx, const fsdp_value *with, const char *path, fsdp_err *err) {
    const fsdp_value *cp = fsdp_value_get(with, "copies");
    for (size_t i = 0; i < fsdp_value_size(cp); i++) {
        const char *dst = fsdp_value_text(fsdp_value_item(cp, i));
        uint64_t bytes = 0;
        int rc = sst_parent_dir(dst, err);
        if (!rc) rc = fcopy_atomic(path, dst, &bytes, err);
        if (rc) return fsdp_err_prefix(err, "save-safetensors: copies: %s", dst);
        fsdp_log(ctx, FSDP_LOG_INFO, "copied %s to %s (%.1f MB)", path, dst, (double)bytes / 1e6);
    }
    return 0;
}

/* What sst_run carries between its steps: the settings, the writer (one file) or the shards, each
 * parameter's tensor index and name mapping, and the bytes written. */
typedef struct sst_job {
    fsdp_ctx *ctx;
    const fsdp_value *with;
    fsdp_state *s;
    comm *c;  /* the world: agreement, rank 0 writes */
    comm *sc; /* the shard group the rows are gathered over */
    int rank, hf, hf_dir;
    const char *dts, *path;
    int64_t shard_mb;
    char file[4200]; /* one file: path, or path/model.safetensors for an HF directory */
    st_writer *w;
    st_shards *sh;
    size_t *idx;
    size_t **part_idx; /* a stacked parameter (HF experts): the tensor index of each part */
    nmap_info *info;
    uint64_t bytes;
    size_t streamed; /* parameters written from their producer (sst_stream_param) */
} sst_job;

/* The dtype a parameter is written in (dtype: auto keeps its own). */
static fsdp_dtype sst_dtype(const char *dts, const state_param *p) {
    return !strcmp(dts, "auto") ? p->dtype : fsdp_dtype_from_name(dts);
}

/* Rank 0, names: hf: a model transformers cannot describe fails before any weight is written. */
static int sst_check_hf_config(const sst_job *j, fsdp_err *err) {
    char *text = NULL;
    int rc = hf_config_to_json(decoder_state_config(j->s), sst_dtype(j->dts, &j->s->p[0]), &text, err);
    free(text);
    if (rc) fsdp_err_prefix(err, "save-safetensors: %s", j->path);
    return rc;
}

/* Rank 0: the parts of stacked parameter i (its experts, shape[1:] each) declared under their HF names. */
static int sst_declare_parts(sst_job *j, size_t i, const nmap_hf *hf, fsdp_dtype dt, fsdp_err *err) {
    state_param *p = &j->s->p[i];
    if (p->ndim < 2)
        return fsdp_err_set(err, FSDP_E_INVALID, "save-safetensors: %s is a stack of experts and has shape of %d dims "
                            "(expected [experts, ...])", p->name, p->ndim);
    j->part_idx[i] = calloc((size_t)p->shape[0] + 1, sizeof *j->part_idx[i]);
    if (!j->part_idx[i]) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = 0;
    for (int64_t e = 0; e < p->shape[0] && !rc; e++) {
        char name[1024];
        if ((rc = nmap_stack_part_name(p->name, (int)e, hf, name, sizeof name, err))) break;
        rc = j->sh ? st_shards_declare(j->sh, name, dt, p->ndim - 1, p->shape + 1, &j->part_idx[i][e], err)
                   : st_writer_declare(j->w, name, dt, p->ndim - 1, p->shape + 1, &j->part_idx[i][e], err);
    }
    return rc;
}

/* Rank 0: opens the file or shards, declares every tensor (under its HF name with names: hf)
 * and begins the data. */
static int sst_declare(sst_job *j, fsdp_err *err) {
    fsdp_state *s = j->s;
    int rc = j->shard_mb > 0 ? st_shards_new(&j->sh, j->path, "model", (uint64_t)j->shard_mb << 20, err)
                             : st_writer_new(&j->w, j->file, err);
    if (!rc)
        rc = j->sh ? st_shards_set_metadata(j->sh, "format", "pt", err) : st_writer_set_metadata(j->w, "format", "pt", err);
    nmap_hf hf;
    sio_hf_facts(s, &hf);
    for (size_t i = 0; i < s->n && !rc; i++) {
        state_param *p = &s->p[i];
        char name[1024];
        snprintf(name, sizeof name, "%s", p->name);
        if (j->hf && (rc = nmap_map_hf(NMAP_TT_TO_HF, p->name, &hf, name, sizeof name, &j->info[i], err))) break;
        fsdp_dtype dt = sst_dtype(j->dts, p);
        if (j->hf && j->info[i].stacked) { /* grouped experts: one HF tensor per expert */
            rc = sst_declare_parts(j, i, &hf, dt, err);
            continue;
        }
        rc = j->sh ? st_shards_declare(j->sh, name, dt, p->ndim, p->shape, &j->idx[i], err)
                   : st_writer_declare(j->w, name, dt, p->ndim, p->shape, &j->idx[i], err);
    }
    if (!rc) rc = j->sh ? st_shards_begin(j->sh, err) : st_writer_begin(j->w, err);
    return rc;
}

/* Rank 0: parameter i's full values converted to its dtype, q/k rows permuted for HF, written. */
static int sst_write_tensor(sst_job *j, size_t i, const float *full, fsdp_err *err) {
    state_param *p = &j->s->p[i];
    int64_t n = state_param_numel(p);
    fsdp_dtype dt = sst_dtype(j->dts, p);
    size_t esz = fsdp_dtype_size(dt);
    void *out = malloc((size_t)(n ? n : 1) * esz), *perm = NULL;
    int rc = 0;
    if (!out) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (!rc) rc = fsdp_convert(out, dt, full, FSDP_DT_F32, (size_t)n, err);
    if (!rc && j->info[i].qk != NMAP_QK_NONE) {
        perm = malloc((size_t)n * esz);
        if (!perm) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        else rc = nmap_permute_rows(NMAP_TT_TO_HF, perm, out, p->shape[0], p->row_numel, esz, j->info[i].heads, err);
    }
    /* a stack of experts: expert e is rows [e, e+1) of dim 0 */
    size_t nparts = j->part_idx[i] ? (size_t)p->shape[0] : 1, part_bytes = (size_t)n * esz / (nparts ? nparts : 1);
    for (size_t e = 0; e < nparts && !rc; e++) {
        const char *src = (const char *)(perm ? perm : out) + e * part_bytes;
        size_t at = j->part_idx[i] ? j->part_idx[i][e] : j->idx[i];
        rc = j->sh ? st_shards_write(j->sh, at, src, part_bytes, err) : st_writer_write(j->w, at, src, part_bytes, err);
    }
    j->bytes += (uint64_t)n * esz;
    free(out);
    free(perm);
    return rc;
}

static int sst_gen(void *user, uint64_t e0, size_t n, float *dst, fsdp_err *err) {
    return state_param_fill(user, (int64_t)e0, n, dst, err);
}

/* A deferred parameter whose rows are all this rank's (one rank), written to one file as it is stored
 * (no q/k permutation, not a stack of parts): its pieces produced into the write buffers on the
 * writing threads (ckpt_pwrite_gen), never held whole. 1 when not such a parameter (nothing done). */
static int sst_stream_param(sst_job *j, size_t i, fsdp_err *err) {
    state_param *p = &j->s->p[i];
    int64_t n = state_param_numel(p);
    if (!p->deferred || !j->w || j->part_idx[i] || j->info[i].qk != NMAP_QK_NONE ||
        (int64_t)state_param_local_numel(p) != n)
        return 1;
    fsdp_dtype dt = sst_dtype(j->dts, p);
    int fd;
    uint64_t off;
    int rc = st_writer_target(j->w, j->idx[i], &fd, &off, err);
    if (rc) return rc;
    ckpt_pio_opts o;
    ckpt_pwrite_opts_env(&o);
    rc = ckpt_pwrite_gen(fd, sst_gen, p, dt, (size_t)n, off, NULL, p->name, &o, err);
    fsdp_err e2;
    int wrc = st_writer_wrote(j->w, j->idx[i], (uint64_t)n * fsdp_dtype_size(dt), rc != 0, rc ? &e2 : err);
    j->bytes += (uint64_t)n * fsdp_dtype_size(dt);
    j->streamed += !rc;
    return rc ? rc : wrc;
}

/* Every rank: parameter i gathered whole on rank 0 (unsharded, or its host rows), then written. */
static int sst_gather_param(sst_job *j, size_t i, fsdp_err *err) {
    fsdp_state *s = j->s;
    state_param *p = &s->p[i];
    if (s->layout != STATE_FULL && j->rank == 0 && comm_size(j->sc) == 1) {
        int rc = sst_stream_param(j, i, err);
        if (rc != 1) return rc;
    }
    int64_t n = state_param_numel(p);
    float *full = NULL, *local = NULL;
    /* the local rows in host memory (downloaded when the state is on the GPU) */
    int rc = state_param_map(s, p, STATE_DATA, &local, err);
    if (rc) return rc;
    if (s->layout == STATE_FULL) {
        full = j->rank == 0 ? local : NULL;
    } else {
        full = malloc((size_t)(n ? n : 1) * sizeof *full);
        if (!full) {
            state_param_unmap(s, p, STATE_DATA, local, 0, err);
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory gathering %s", p->name);
        }
        rc = state_unshard(p, local, j->sc, full, err);
    }
    if (!rc && j->rank == 0) rc = sst_write_tensor(j, i, full, err);
    if (s->layout != STATE_FULL) free(full);
    fsdp_err e3;
    state_param_unmap(s, p, STATE_DATA, local, 0, &e3);
    return rc;
}

/* Rank 0, after the data: the file or index finished, the copies, and config.json for HF names. */
static int sst_finish_outputs(sst_job *j, fsdp_err *err) {
    fsdp_state *s = j->s;
    int rc = j->sh ? st_shards_finish(j->sh, err) : st_writer_finish(j->w, err);
    if (!rc) rc = sst_copies(j->ctx, j->with, j->file, err);
    /* Hugging Face names: the config.json transformers opens the directory with */
    if (!rc && j->hf && s->trainer_cfg && s->n > 0)
        rc = sst_write_config(s, j->dts, j->path, j->sh != NULL || j->hf_dir, err);
    return rc;
}

/* Before any data: values checked, an existing output refused (overwrite: false), and names: hf
 * only for a Llama-family model. */
static int sst_preflight(sst_job *j, fsdp_err *err) {
    fsdp_state *s = j->s;
    int rc = mt_state_check_values(s, "save-safetensors", err);
    if (!rc) rc = sst_refuse_existing(j->c, j->with, j->shard_mb > 0 ? j->path : j->file, j->shard_mb > 0, err);
    if (rc) return rc;
    if (j->hf && !s->trainer_cfg && !s->hf.has)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "save-safetensors: names: hf maps Llama-family names, and the model is a %s (its names are "
                            "written as they are without names: hf)",
                            s->model ? mt_kind(s->model) : "model without a Llama config");
    return 0;
}

/* Rank 0 declares every tensor (after the config check and the parent directory); every rank
 * learns whether it started. */
static int sst_start(sst_job *j, int rc, fsdp_err *err) {
    fsdp_state *s = j->s;
    if (!rc && j->rank == 0 && j->hf && s->trainer_cfg && s->n > 0) rc = sst_check_hf_config(j, err);
    if (!rc && j->rank == 0 && j->shard_mb <= 0) rc = sst_parent_dir(j->file, err);
    if (!rc && j->rank == 0) rc = sst_declare(j, err);
    /* a failure on rank 0 must not leave the others in a gather */
    int who;
    fsdp_err e2;
    int st = comm_agree(j->c, rc, &who, &e2);
    if (st && !rc) rc = fsdp_err_set(err, st, "save-safetensors: rank %d failed to start %s", who, j->path);
    return rc;
}

static int sst_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    fsdp_state *s = state_get(ctx);
    if (!s) return fsdp_err_set(err, FSDP_E_INVALID, "save-safetensors: no model in the context");
    sst_job j;
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    j.with = with;
    j.s = s;
    j.c = stage_comm(ctx);
    j.sc = stage_shard_comm(ctx);
    j.rank = comm_rank(j.c);
    j.hf = !strcmp(fsdp_arg_str(with, "names", "torchtitan"), "hf");
    j.dts = fsdp_arg_str(with, "dtype", "auto");
    j.path = fsdp_arg_str(with, "path", "");
    j.shard_mb = fsdp_arg_int(with, "shard_mb", 0);
    j.hf_dir = j.shard_mb <= 0 && st_export_file(j.path, j.hf, j.file, sizeof j.file);
    int rc = sst_preflight(&j, err);
    if (rc) return rc;
    j.idx = calloc(s->n ? s->n : 1, sizeof *j.idx);
    j.info = calloc(s->n ? s->n : 1, sizeof *j.info);
    j.part_idx = calloc(s->n ? s->n : 1, sizeof *j.part_idx);
    if (!j.idx || !j.info || !j.part_idx) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    /* rank 0 declares every tensor; every rank takes part in the gathers */
    stage_sweep_stale(ctx, j.path);
    rc = sst_start(&j, rc, err);
    for (size_t i = 0; i < s->n && !rc; i++) rc = sst_gather_param(&j, i, err);
    if (!rc && j.rank == 0) rc = sst_finish_outputs(&j, err);
    if (j.w) st_writer_free(j.w);
    if (j.sh) st_shards_free(j.sh);
    free(j.idx);
    free(j.info);
    for (size_t i = 0; j.part_idx && i < s->n; i++) free(j.part_idx[i]);
    free(j.part_idx);
    int who;
    fsdp_err e2;
    int st = comm_agree(j.c, rc, &who, &e2);
    if (st && !rc) rc = fsdp_err_set(err, st, "save-safetensors: rank %d failed writing %s", who, j.path);
    if (!rc) {
        fsdp_ctx_metric(ctx, "bytes_written", (double)j.bytes);
        fsdp_ctx_metric(ctx, "params_streamed", (double)j.streamed);
        fsdp_log(ctx, FSDP_LOG_INFO, "wrote %s (%.1f MB%s)", j.path, (double)j.bytes / 1e6,
                 j.hf ? ", Hugging Face names" : "");
    }
    return rc;
}

/* copies: paths (strings), one file only, none the path itself or listed twice */
static int sst_check(const fsdp_value *with, fsdp_err *err) {
    const fsdp_value *cp = fsdp_value_get(with, "copies");
    const char *path = fsdp_arg_str(with, "path", "");
    if (fsdp_value_size(cp) && fsdp_arg_int(with, "shard_mb", 0) > 0)
        return fsdp_err_at(err, FSDP_E_INVALID, cp,
                           "save-safetensors: copies: a sharded output (shard_mb > 0) is a directory; copies are of "
                           "one .safetensors file");
    for (size_t i = 0; i < fsdp_value_size(cp); i++) {
        const fsdp_value *v = fsdp_value_item(cp, i);
        const char *t = fsdp_value_text(v);
        if (!t || !*t) return fsdp_err_at(err, FSDP_E_INVALID, v, "save-safetensors: copies: expected file paths");
        if (!strcmp(t, path))
            return fsdp_err_at(err, FSDP_E_INVALID, v, "save-safetensors: copies: %s is the path itself", t);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(t, fsdp_value_text(fsdp_value_item(cp, j))))
                return fsdp_err_at(err, FSDP_E_INVALID, v, "save-safetensors: copies: %s is listed twice", t);
    }
    return 0;
}

const fsdp_stage_desc stage_save_safetensors = {
    FSDP_STAGE_DESC_INIT,
    "save-safetensors",
    "consolidated safetensors (rank 0 gathers tensor by tensor); optional HF names, bf16, shards",
    PARAMS,
    NEEDS,
    NULL,
    sst_run,
    sst_check,
};
