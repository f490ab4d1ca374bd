/* Run under mpirun by tests/test_hf_grid.cc: trains every selected config of the Hugging Face grid
 * (tests/data/hf-grid-5.24, tools/gen/gen_hf_grid.py) on this world, as load-ckpt names: hf +
 * train-steps do (the state sharded over the ranks, the weights read by the loader, the batch split
 * over the ranks), and writes what it measured, one JSON line per config, to --out (rank 0):
 *
 *   {"name": C, "error": "...",                        (only when the run failed)
 *    "grads": {param: [max |g - g_ref|, max |g_ref|]},  step-0 gradients against grads_step0.safetensors
 *    "steps": [{"loss", "ce_loss", "aux_loss", "grad_norm"}], the 3 AdamW steps
 *    "weight_diff": max |w - w_ref|}                   after them, against model_step3.safetensors
 *
 * The test judges the numbers (tests/hf_grid_util.h); this program only runs and measures.
 *
 *   hf_grid_run --data DIR --out FILE [--device cpu|cuda] [--mixed none|bf16] [--ac none|full|selective|cycle]
 *               [--accum N|cycle] [--ep N|world] [--replicas R] [--tile K] [--only A,B,...] [--select all|moe|ep]
 *
 * --tile K repeats the batch K times along its rows (the same mean loss and gradients) so that
 * 6K rows split over the world; --ep world runs expert parallelism over the whole shard group on the
 * MoE configs whose experts it divides (the others without); --select moe keeps the configs with
 * experts, --select ep those that expert parallelism runs on; --replicas R is HSDP (R replicas of
 * world / R shards, runtime.mesh); cycle varies the option by config (config i:
 * ac none/full/selective by i % 3, accumulation 1/2 micro-batches by i % 2). Exit 0 when every
 * selected config ran (a config that failed is a line with its error, exit 0 as well: the test
 * reports it); 2 on bad arguments. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"
#include "ckpt/state_io.h"
#include "decoder/decoder_blocks.h"
#include "decoder/decoder_params.h"
#include "decoder/decoder_table.h"
#include "decoder/hf_config.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/mesh.h"
#include "runtime/state.h"
#include "train/train_fsdp.h"
#include "train/train_fsdp_cuda.h"

#define STEPS 3
#define MAXP 512

typedef struct opts {
    const char *data, *out, *only;
    int cuda, bf16, ac, ac_cycle, accum, accum_cycle, ep, ep_world, replicas, tile, select;
} opts;

typedef struct run {
    comm *world;
    mesh *m;
    dev_ctx *dev;
    const opts *o;
} run;

/* What one config measured. */
typedef struct result {
    char error[FSDP_ERR_MSG_MAX + 64];
    int np;
    char pname[MAXP][96];
    double gerr[MAXP], gmax[MAXP];
    double loss[STEPS], ce[STEPS], aux[STEPS], gn[STEPS];
    int steps;
    double wdiff;
    int n_micro, ac, ep, rows, world, tile; /* what ran */
} result;

static int parse(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->accum = o->ep = o->replicas = o->tile = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return fprintf(stderr, "hf_grid_run: %s needs a value\n", a), 2;
        i++;
        if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--only")) o->only = v;
        else if (!strcmp(a, "--device")) o->cuda = !strcmp(v, "cuda");
        else if (!strcmp(a, "--mixed")) o->bf16 = !strcmp(v, "bf16");
        else if (!strcmp(a, "--ac")) {
            o->ac_cycle = !strcmp(v, "cycle");
            o->ac = !strcmp(v, "full") ? MODEL_BLOCKS_AC_FULL : !strcmp(v, "selective") ? MODEL_BLOCKS_AC_SELECTIVE : 0;
        } else if (!strcmp(a, "--accum")) {
            o->accum_cycle = !strcmp(v, "cycle");
            o->accum = o->accum_cycle ? 1 : atoi(v);
        } else if (!strcmp(a, "--ep")) {
            o->ep_world = !strcmp(v, "world");
            o->ep = o->ep_world ? 1 : atoi(v);
        } else if (!strcmp(a, "--replicas")) o->replicas = atoi(v);
        else if (!strcmp(a, "--tile")) o->tile = atoi(v);
        else if (!strcmp(a, "--select")) {
            o->select = !strcmp(v, "moe") ? 1 : !strcmp(v, "ep") ? 2 : 0;
            if (strcmp(v, "all") && !o->select) return fprintf(stderr, "hf_grid_run: --select all|moe|ep\n"), 2;
        }
        else return fprintf(stderr, "hf_grid_run: unknown option %s\n", a), 2;
    }
    if (!o->data || !o->out || o->accum < 1 || o->ep < 1 || o->replicas < 1 || o->tile < 1)
        return fprintf(stderr, "hf_grid_run: --data and --out are needed; counts must be >= 1\n"), 2;
    return 0;
}

static void path_of(char *buf, size_t cap, const char *data, const char *name, const char *file) {
    snprintf(buf, cap, "%s/%s%s%s", data, name, file ? "/" : "", file ? file : "");
}

/* A state of cfg sharded over the mesh's shard group, loaded strictly under HF names from path. */
static int load_state(const run *r, const decoder_config *cfg, const char *path, fsdp_state **out, fsdp_err *err) {
    fsdp_state *s = calloc(1, sizeof *s);
    if (!s) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    s->layout = STATE_SHARDED;
    s->world = r->m->S;
    s->rank = r->m->shard_rank;
    decoder_params t;
    int rc = decoder_state_set_config(s, cfg, err);
    if (!rc) rc = decoder_params_build(cfg, &t, err);
    for (int i = 0; !rc && i < t.n; i++) rc = state_add_param(s, t.p[i].name, t.p[i].ndim, t.p[i].shape, t.p[i].layer, err);
    if (!rc) decoder_params_free(&t);
    sio_load_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.names = SIO_NAMES_HF;
    lo.strict = 1;
    sio_load_result res;
    if (!rc) rc = sio_load(s, path, &lo, &res, err);
    if (rc) {
        state_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* This rank's rows of the (tiled) batch: rows [rank * local, (rank + 1) * local) of the world. */
static int local_batch(const run *r, const char *path, int *rows, int *seq, int32_t **tok, int32_t **lab,
                       fsdp_err *err) {
    st_reader *rd;
    int rc = st_open(&rd, path, err);
    if (rc) return rc;
    const st_tensor_info *ti = st_find(rd, "input_ids");
    if (!ti || ti->ndim != 2 || !st_find(rd, "labels")) {
        st_close(rd);
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: no input_ids / labels [B, T]", path);
    }
    const int B = (int)ti->shape[0], T = (int)ti->shape[1], W = comm_size(r->world), total = B * r->o->tile;
    if (total % W) {
        st_close(rd);
        return fsdp_err_set(err, FSDP_E_INVALID, "%d rows (tile %d) do not split over %d ranks", total, r->o->tile, W);
    }
    int32_t *all = malloc(sizeof(int32_t) * 2 * B * T);
    *rows = total / W, *seq = T;
    *tok = malloc(sizeof(int32_t) * *rows * T), *lab = malloc(sizeof(int32_t) * *rows * T);
    if (!all || !*tok || !*lab) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (!rc) rc = st_read_named(rd, "input_ids", all, FSDP_DT_I32, err);
    if (!rc) rc = st_read_named(rd, "labels", all + B * T, FSDP_DT_I32, err);
    for (int i = 0; !rc && i < *rows; i++) {
        int g = (comm_rank(r->world) * *rows + i) % B;
        memcpy(*tok + (size_t)i * T, all + (size_t)g * T, sizeof(int32_t) * T);
        memcpy(*lab + (size_t)i * T, all + (size_t)(B + g) * T, sizeof(int32_t) * T);
    }
    free(all);
    st_close(rd);
    return rc;
}

/* The host copy of array a of parameter p (the device's when on the GPU). */
static float *host_array(fsdp_state *s, state_param *p, state_array a, fsdp_err *err) {
    size_t n = state_param_local_numel(p);
    float *v = malloc((n ? n : 1) * sizeof(float));
    if (!v) return NULL;
    if (state_param_get(s, p, a, v, err)) {
        free(v);
        return NULL;
    }
    return v;
}

/* max |a - b| and max |b| of array `which` of every parameter against the data of ref, over the world. */
static int compare(const run *r, fsdp_state *s, fsdp_state *ref, state_array which, result *out, int per_param,
                   fsdp_err *err) {
    if (per_param) out->np = 0;
    else out->wdiff = 0;
    for (size_t k = 0; k < s->n && k < MAXP; k++) {
        state_param *p = &s->p[k], *q = state_find(ref, p->name);
        float *a = host_array(s, p, which, err), *b = q ? host_array(ref, q, STATE_DATA, err) : NULL;
        double m[2] = {0, 0};
        size_t n = state_param_local_numel(p);
        for (size_t i = 0; a && b && i < n; i++) {
            m[0] = fmax(m[0], fabs((double)a[i] - b[i]));
            m[1] = fmax(m[1], fabs((double)b[i]));
        }
        int bad = !a || !b;
        free(a);
        free(b);
        if (bad) return err->code ? err->code : fsdp_err_set(err, FSDP_E_INVALID, "%s: no reference", p->name);
        int rc = comm_allreduce(r->world, m, 2, COMM_F64, COMM_MAX, err);
        if (rc) return rc;
        if (per_param) {
            snprintf(out->pname[k], sizeof out->pname[k], "%s", p->name);
            out->gerr[k] = m[0], out->gmax[k] = m[1];
            out->np = (int)k + 1;
        } else {
            out->wdiff = fmax(out->wdiff, m[0]);
        }
    }
    return 0;
}

/* The trainer of either device behind two calls. */
typedef struct trainer {
    train_fsdp *cpu;
    train_fsdp_cuda *gpu;
    int n_micro, ac, ep;
} trainer;

static int trainer_open(const run *r, fsdp_state *s, const decoder_config *cfg, int rows, int seq, int idx, trainer *t,
                        fsdp_err *err) {
    const opts *o = r->o;
    memset(t, 0, sizeof *t);
    t->n_micro = o->accum_cycle ? 1 + idx % 2 : o->accum;
    if (rows % t->n_micro) t->n_micro = 1;
    int ac = o->ac_cycle ? (int[]){MODEL_BLOCKS_AC_NONE, MODEL_BLOCKS_AC_FULL, MODEL_BLOCKS_AC_SELECTIVE}[idx % 3] : o->ac;
    int ep = o->ep_world ? (cfg->n_experts && cfg->n_experts % r->m->S == 0 ? r->m->S : 1) : o->ep, rc;
    t->ac = ac, t->ep = ep;
    if (!o->cuda) {
        rc = train_fsdp_create_ac(s, decoder_blocks_cpu(cfg), r->m->shard, rows / t->n_micro, seq, ac, &t->cpu, err);
        if (!rc && r->m->replicate) rc = train_fsdp_set_replicas(t->cpu, r->world, r->m->replicate, err);
        if (!rc && ep > 1) rc = train_fsdp_set_expert_parallel(t->cpu, ep, err);
        return rc;
    }
    train_fsdp_cuda_options co = {o->bf16 ? TRAIN_FSDP_MIXED_BF16 : TRAIN_FSDP_MIXED_NONE, (train_fsdp_ac)ac, 0, 0, 0, 0};
    if ((rc = state_to_device(s, r->dev, err))) return rc;
    rc = train_fsdp_cuda_create(s, decoder_blocks_cuda(cfg), r->m->shard, r->dev, rows / t->n_micro, seq, &co, &t->gpu,
                                err);
    if (!rc && r->m->replicate) rc = train_fsdp_cuda_set_replicas(t->gpu, r->world, r->m->replicate, err);
    if (!rc && ep > 1) rc = train_fsdp_cuda_set_expert_parallel(t->gpu, ep, err);
    return rc;
}

static int trainer_grads(trainer *t, const int32_t *tok, const int32_t *lab, train_fsdp_result *res, fsdp_err *err) {
    if (t->cpu) return train_fsdp_grads_accum(t->cpu, tok, lab, t->n_micro, res, err);
    return train_fsdp_cuda_grads_accum(t->gpu, tok, lab, t->n_micro, res, err);
}

static int trainer_step(trainer *t, const int32_t *tok, const int32_t *lab, const train_fsdp_hparams *hp,
                        train_fsdp_result *res, fsdp_err *err) {
    if (t->cpu) return train_fsdp_step_accum(t->cpu, tok, lab, t->n_micro, hp, res, err);
    return train_fsdp_cuda_step_accum(t->gpu, tok, lab, t->n_micro, hp, res, err);
}

static void trainer_close(trainer *t) {
    if (t->cpu) train_fsdp_free(t->cpu);
    if (t->gpu) train_fsdp_cuda_free(t->gpu);
}

/* The lr of each step (the reference's schedule). */
static int read_lrs(const char *data, const char *name, double *lr, fsdp_err *err) {
    char p[4200];
    path_of(p, sizeof p, data, name, "reference.json");
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: %s", p, je.text);
    json_t *st = json_object_get(j, "steps");
    const size_t n = json_array_size(st);
    for (int k = 0; k < STEPS; k++) lr[k] = json_number_value(json_object_get(json_array_get(st, (size_t)k), "lr"));
    json_decref(j);
    return n == STEPS ? 0 : fsdp_err_set(err, FSDP_E_FORMAT, "%s: %zu steps, expected %d", p, n, STEPS);
}

/* Trains one config on the world; every rank fills *res the same (the comparisons are all-reduced). */
static int train_config(const run *r, const char *name, const decoder_config *cfg, int idx, result *res,
                        fsdp_err *err) {
    char p[4200];
    fsdp_state *s = NULL, *g0 = NULL, *w3 = NULL;
    int32_t *tok = NULL, *lab = NULL;
    int rows = 0, seq = 0, rc, who;
    double lr[STEPS];
    trainer t = {0};
    path_of(p, sizeof p, r->o->data, name, NULL);
    rc = load_state(r, cfg, p, &s, err);
    path_of(p, sizeof p, r->o->data, name, "batch.safetensors");
    if (!rc) rc = local_batch(r, p, &rows, &seq, &tok, &lab, err);
    if (!rc) rc = read_lrs(r->o->data, name, lr, err);
    if (!rc) rc = trainer_open(r, s, cfg, rows, seq, idx, &t, err);
    /* a mixture of experts' accumulated micro-batches have their own reference (each its own aux loss) */
    const char *v = t.n_micro > 1 && cfg->n_experts ? "_accum" : "";
    char f[64];
    snprintf(f, sizeof f, "grads_step0%s.safetensors", v);
    path_of(p, sizeof p, r->o->data, name, f);
    if (!rc) rc = load_state(r, cfg, p, &g0, err);
    snprintf(f, sizeof f, "model_step3%s.safetensors", v);
    path_of(p, sizeof p, r->o->data, name, f);
    if (!rc) rc = load_state(r, cfg, p, &w3, err);
    res->n_micro = t.n_micro, res->ac = t.ac, res->ep = t.ep, res->rows = rows, res->world = comm_size(r->world);
    res->tile = r->o->tile;
    if (comm_agree(r->world, rc, &who, err) && !rc) rc = fsdp_err_set(err, FSDP_E_INVALID, "rank %d failed", who);
    train_fsdp_result tr;
    if (!rc) rc = trainer_grads(&t, tok, lab, &tr, err);
    if (!rc) rc = compare(r, s, g0, STATE_GRAD, res, 1, err);
    for (int k = 0; !rc && k < STEPS; k++) {
        train_fsdp_hparams hp = {lr[k], 0.9, 0.95, 1e-8, 0.1, 1.0, NULL, NULL, NULL};
        if ((rc = trainer_step(&t, tok, lab, &hp, &tr, err))) break;
        res->loss[k] = tr.loss, res->ce[k] = tr.ce_loss, res->aux[k] = tr.aux_loss, res->gn[k] = tr.grad_norm;
        res->steps = k + 1;
    }
    if (!rc) rc = compare(r, s, w3, STATE_DATA, res, 0, err);
    trainer_close(&t);
    free(tok), free(lab);
    if (s) state_free(s);
    if (g0) state_free(g0);
    if (w3) state_free(w3);
    return rc;
}

static void write_result(FILE *f, const char *name, const result *res, int rc) {
    json_t *o = json_object(), *g = json_object(), *st = json_array();
    json_object_set_new(o, "name", json_string(name));
    if (rc) json_object_set_new(o, "error", json_string(res->error));
    for (int k = 0; k < res->np; k++) {
        json_t *pair = json_array();
        json_array_append_new(pair, json_real(res->gerr[k]));
        json_array_append_new(pair, json_real(res->gmax[k]));
        json_object_set_new(g, res->pname[k], pair);
    }
    for (int k = 0; k < res->steps; k++)
        json_array_append_new(st, json_pack("{s:f,s:f,s:f,s:f}", "loss", res->loss[k], "ce_loss", res->ce[k], "aux_loss",
                                            res->aux[k], "grad_norm", res->gn[k]));
    json_object_set_new(o, "grads", g);
    json_object_set_new(o, "steps", st);
    json_object_set_new(o, "weight_diff", json_real(res->wdiff));
    /* the global batch rows of each micro-batch (rank q's local row i is row (q * rows + i) % B of the
     * batch file's B = rows * world / tile rows; micro-batch m holds rows [m, m + 1) * rows / n_micro) */
    json_t *mb = json_array();
    const int per = res->n_micro ? res->rows / res->n_micro : 0, B = res->tile ? res->rows * res->world / res->tile : 0;
    for (int m = 0; m < res->n_micro && B; m++) {
        json_t *g = json_array();
        for (int q = 0; q < res->world; q++)
            for (int i = m * per; i < (m + 1) * per; i++) json_array_append_new(g, json_integer((q * res->rows + i) % B));
        json_array_append_new(mb, g);
    }
    json_object_set_new(o, "micro_batches", mb);
    json_object_set_new(o, "ac", json_integer(res->ac));
    json_object_set_new(o, "expert_parallel", json_integer(res->ep));
    char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
    fprintf(f, "%s\n", line);
    fflush(f);
    free(line);
    json_decref(o);
}

/* Whether config `name` (config cfg) is selected on this world: --only, and --select moe (configs with
 * experts) or ep (those whose experts the shard group divides: expert parallelism runs on them). */
static int selected(const run *r, const char *name, const decoder_config *cfg) {
    const opts *o = r->o;
    if (o->only) {
        size_t n = strlen(name);
        const char *at = o->only;
        int found = 0;
        while ((at = strstr(at, name))) {
            if ((at == o->only || at[-1] == ',') && (at[n] == ',' || at[n] == '\0')) found = 1;
            at += n;
        }
        if (!found) return 0;
    }
    if (o->select >= 1 && cfg->n_experts == 0) return 0;
    if (o->select == 2 && cfg->n_experts % r->m->S) return 0;
    return 1;
}

static int run_all(const run *r, FILE *out, fsdp_err *err) {
    char p[4200];
    path_of(p, sizeof p, r->o->data, "grid.json", NULL);
    json_error_t je;
    json_t *g = json_load_file(p, 0, &je);
    if (!g) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: %s", p, je.text);
    json_t *cs = json_object_get(g, "configs");
    for (size_t i = 0; i < json_array_size(cs); i++) {
        const char *name = json_string_value(json_object_get(json_array_get(cs, i), "name"));
        decoder_config cfg;
        result *res = calloc(1, sizeof *res);
        path_of(p, sizeof p, r->o->data, name, NULL);
        fsdp_err e = {0};
        int rc = hf_config_read(p, &cfg, &e);
        if (!rc && !selected(r, name, &cfg)) {
            free(res);
            continue;
        }
        if (!rc) rc = train_config(r, name, &cfg, (int)i, res, &e);
        if (rc) snprintf(res->error, sizeof res->error, "%s", e.msg);
        if (out) write_result(out, name, res, rc);
        free(res);
    }
    json_decref(g);
    return 0;
}

int main(int argc, char **argv) {
    opts o;
    if (parse(argc, argv, &o)) return 2;
    run r = {NULL, NULL, NULL, &o};
    fsdp_err err = {0};
    int rc = comm_create(&r.world, &err);
    int W = rc ? 1 : comm_size(r.world);
    if (!rc && W % o.replicas) rc = fsdp_err_set(&err, FSDP_E_INVALID, "%d replicas do not divide %d ranks", o.replicas, W);
    if (!rc) rc = mesh_create(r.world, o.replicas, W / o.replicas, &r.m, &err);
    if (!rc && o.cuda) {
        dev_options d = {.local_rank = comm_local_rank(r.world), .blas_workspace_bytes = 0};
        if (!(r.dev = dev_ctx_create(&d, &err))) rc = err.code ? err.code : FSDP_E_DEVICE;
    }
    FILE *out = NULL;
    if (!rc && comm_rank(r.world) == 0 && !(out = fopen(o.out, "w")))
        rc = fsdp_err_set(&err, FSDP_E_IO, "cannot write %s", o.out);
    if (!rc) rc = run_all(&r, out, &err);
    if (out) fclose(out);
    if (rc) fprintf(stderr, "hf_grid_run: %s\n", err.msg);
    if (r.m) mesh_free(r.m);
    if (r.dev) dev_ctx_free(r.dev);
    if (r.world) comm_destroy(r.world);
    return rc ? 1 : 0;
}
