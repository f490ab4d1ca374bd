/* bench/scale_plan: what grows with scale in a DCP checkpoint of a Llama-3 405B and a DeepSeek-V3 671B
 * saved by 512 .. 4096 ranks, on metadata only (the data files are sparse: no payload is written or read).
 * For each model and world size N (the layouts are data: the MODELS rows below) it times, in this run:
 *   - writing `.metadata` from every rank's records (dcp_write_metadata; torch: pickle.dump + fsync of the
 *     Metadata, what FileSystemWriter.finish does),
 *   - parsing it (dcp_parse_metadata: every chunk's bounds and the tiling checked; torch:
 *     FileSystemReader.read_metadata),
 *   - opening the checkpoint (dcp_open: parse, check every storage range, open the N data files, index the
 *     chunks for planning; torch has no such step),
 *   - planning one rank's load onto 3N/4 and onto 2N ranks (dcp_plan_box for the rank's box of every tensor;
 *     torch: create_read_items_for_chunk_list per tensor, as _create_default_local_plan calls it),
 *   - the reshard plan: every rank of 3N/4 (what `ckpt convert --world` and reshard-dcp plan in one
 *     process; torch: create_read_items_for_chunk_list with the 3N/4 ranks' chunks of each tensor at once),
 *   - the inspect walk (every entry's dtype, shape, chunks and bytes, each key looked up) and the diff walk
 *     (every stored chunk of the checkpoint planned against a second open of it, as diff pairs the sides),
 * each with torch's time on the same metadata in the same run (bench/scale_plan_torch.py, through the
 * Python given by --python; without torch the torch column says n/a), the read items both planned (they
 * must agree), the ratio torch/fsdp-run, and the growth exponent of each over the 4 sizes (the slope of
 * log time against log chunks: 1 is linear). The planning process's peak RSS is printed per size.
 *
 *   build/bench/scale_plan [--sizes 512,1024,2048,4096] [--models llama3-405b,deepseek-v3-671b]
 *                          [--dir /tmp/fsdp-scale-plan] [--python /work/torchenv/bin/python|none] [--keep]
 *                          [--torch-all-ranks-max 1024]
 * Above --torch-all-ranks-max ranks torch's reshard plan and diff walk are not run (n/a): they grow as
 * chunks^1.6-1.8 there (measured), hours at 4096 ranks on 2 cores.
 * --keep leaves the checkpoints (DIR/<model>-<ranks>: .metadata and the sparse data files) in place. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "ckpt/dcp.h"
#include "ckpt/dcp_plan.h"
#include "runtime/shard.h"

/* How a parameter is split: rows over the shard group (FSDP2's Shard(0); with HSDP the group is one
 * replica's ranks, and replica 0 writes), or a stacked experts' grid: dim 0 over the expert-parallel
 * groups, dim 1 over the ranks of one group (expert parallelism with FSDP inside it). */
typedef enum sp_kind { SP_ROWS, SP_EXPERTS } sp_kind;

typedef struct sp_row {
    const char *name; /* "%d": the layer */
    int first, last;  /* layers [first, last]; -1: not per layer */
    int ndim;
    int64_t shape[3];
    sp_kind kind;
} sp_row;

typedef struct sp_model {
    const char *name, *layout;
    const sp_row *rows;
    size_t nrows;
    int replicas; /* HSDP replicas of the rows' parameters (1: FSDP over every rank) */
    int ep;       /* expert-parallel groups of the experts' grid */
} sp_model;

#define L405 125
static const sp_row LLAMA_405B[] = {
    {"tok_embeddings.weight", -1, -1, 2, {128256, 16384}, SP_ROWS},
    {"layers.%d.attention.wq.weight", 0, L405, 2, {16384, 16384}, SP_ROWS},
    {"layers.%d.attention.wk.weight", 0, L405, 2, {1024, 16384}, SP_ROWS},
    {"layers.%d.attention.wv.weight", 0, L405, 2, {1024, 16384}, SP_ROWS},
    {"layers.%d.attention.wo.weight", 0, L405, 2, {16384, 16384}, SP_ROWS},
    {"layers.%d.feed_forward.w1.weight", 0, L405, 2, {53248, 16384}, SP_ROWS},
    {"layers.%d.feed_forward.w2.weight", 0, L405, 2, {16384, 53248}, SP_ROWS},
    {"layers.%d.feed_forward.w3.weight", 0, L405, 2, {53248, 16384}, SP_ROWS},
    {"layers.%d.attention_norm.weight", 0, L405, 1, {16384}, SP_ROWS},
    {"layers.%d.ffn_norm.weight", 0, L405, 1, {16384}, SP_ROWS},
    {"norm.weight", -1, -1, 1, {16384}, SP_ROWS},
    {"output.weight", -1, -1, 2, {128256, 16384}, SP_ROWS},
};

/* torchtitan's DeepSeek-V3 names: MLA attention, 3 dense layers, 58 of 256 routed experts (stacked) and a
 * shared expert */
#define DS_LAST 60
static const sp_row DEEPSEEK_V3[] = {
    {"tok_embeddings.weight", -1, -1, 2, {129280, 7168}, SP_ROWS},
    {"layers.%d.attention.wq_a.weight", 0, DS_LAST, 2, {1536, 7168}, SP_ROWS},
    {"layers.%d.attention.q_norm.weight", 0, DS_LAST, 1, {1536}, SP_ROWS},
    {"layers.%d.attention.wq_b.weight", 0, DS_LAST, 2, {24576, 1536}, SP_ROWS},
    {"layers.%d.attention.wkv_a.weight", 0, DS_LAST, 2, {576, 7168}, SP_ROWS},
    {"layers.%d.attention.kv_norm.weight", 0, DS_LAST, 1, {512}, SP_ROWS},
    {"layers.%d.attention.wkv_b.weight", 0, DS_LAST, 2, {32768, 512}, SP_ROWS},
    {"layers.%d.attention.wo.weight", 0, DS_LAST, 2, {7168, 16384}, SP_ROWS},
    {"layers.%d.attention_norm.weight", 0, DS_LAST, 1, {7168}, SP_ROWS},
    {"layers.%d.ffn_norm.weight", 0, DS_LAST, 1, {7168}, SP_ROWS},
    {"layers.%d.feed_forward.w1.weight", 0, 2, 2, {18432, 7168}, SP_ROWS},
    {"layers.%d.feed_forward.w2.weight", 0, 2, 2, {7168, 18432}, SP_ROWS},
    {"layers.%d.feed_forward.w3.weight", 0, 2, 2, {18432, 7168}, SP_ROWS},
    {"layers.%d.moe.router.gate.weight", 3, DS_LAST, 2, {256, 7168}, SP_ROWS},
    {"layers.%d.moe.expert_bias", 3, DS_LAST, 1, {256}, SP_ROWS},
    {"layers.%d.moe.experts.w1", 3, DS_LAST, 3, {256, 2048, 7168}, SP_EXPERTS},
    {"layers.%d.moe.experts.w2", 3, DS_LAST, 3, {256, 7168, 2048}, SP_EXPERTS},
    {"layers.%d.moe.experts.w3", 3, DS_LAST, 3, {256, 2048, 7168}, SP_EXPERTS},
    {"layers.%d.moe.shared_experts.w1.weight", 3, DS_LAST, 2, {2048, 7168}, SP_ROWS},
    {"layers.%d.moe.shared_experts.w2.weight", 3, DS_LAST, 2, {7168, 2048}, SP_ROWS},
    {"layers.%d.moe.shared_experts.w3.weight", 3, DS_LAST, 2, {2048, 7168}, SP_ROWS},
    {"norm.weight", -1, -1, 1, {7168}, SP_ROWS},
    {"output.weight", -1, -1, 2, {129280, 7168}, SP_ROWS},
};

static const sp_model MODELS[] = {
    {"llama3-405b", "FSDP2 Shard(0) over every rank", LLAMA_405B, sizeof LLAMA_405B / sizeof *LLAMA_405B, 1, 1},
    {"deepseek-v3-671b", "HSDP (8 replicas) for the dense weights, experts on 64 EP groups x Shard(1)", DEEPSEEK_V3,
     sizeof DEEPSEEK_V3 / sizeof *DEEPSEEK_V3, 8, 64},
};

/* One tensor of a model: its name and row. */
typedef struct sp_tensor {
    char name[96];
    const sp_row *row;
} sp_tensor;

static void die(const char *what, const fsdp_err *err) {
    fprintf(stderr, "scale_plan: %s: %s\n", what, err ? err->msg : strerror(errno));
    exit(1);
}

static sp_tensor *model_tensors(const sp_model *m, size_t *n) {
    size_t cap = 0;
    for (size_t i = 0; i < m->nrows; i++) cap += m->rows[i].first < 0 ? 1 : (size_t)(m->rows[i].last - m->rows[i].first + 1);
    sp_tensor *t = calloc(cap, sizeof *t);
    if (!t) die("out of memory", NULL);
    *n = 0;
    /* layer-major, as a model's state dict lists them */
    for (size_t i = 0; i < m->nrows; i++)
        if (m->rows[i].first < 0 && strncmp(m->rows[i].name, "tok_", 4) == 0) t[(*n)].row = &m->rows[i],
            snprintf(t[(*n)++].name, sizeof t->name, "%s", m->rows[i].name);
    for (int l = 0; l <= 200; l++)
        for (size_t i = 0; i < m->nrows; i++)
            if (m->rows[i].first >= 0 && l >= m->rows[i].first && l <= m->rows[i].last) {
                t[*n].row = &m->rows[i];
                snprintf(t[(*n)++].name, sizeof t->name, m->rows[i].name, l);
            }
    for (size_t i = 0; i < m->nrows; i++)
        if (m->rows[i].first < 0 && strncmp(m->rows[i].name, "tok_", 4) != 0) t[(*n)].row = &m->rows[i],
            snprintf(t[(*n)++].name, sizeof t->name, "%s", m->rows[i].name);
    return t;
}

/* The box of a tensor that rank holds in a world of that size; 0 when the rank holds a replica it
 * does not write (HSDP's replicas above 0) and writing is asked. */
static int sp_box(const sp_model *m, const sp_row *r, int world, int rank, int writing, int64_t *off, int64_t *len) {
    for (int d = 0; d < r->ndim; d++) off[d] = 0, len[d] = r->shape[d];
    if (r->kind == SP_EXPERTS) {
        int per = world / m->ep;
        shard_rows(r->shape[0], m->ep, rank / per, &off[0], &len[0]);
        shard_rows(r->shape[1], per, rank % per, &off[1], &len[1]);
        return 1;
    }
    int group = world / m->replicas;
    if (writing && rank >= group) return 0;
    shard_rows(r->shape[0], group, rank % group, &off[0], &len[0]);
    return 1;
}

/* Every rank's records of a save on world ranks (the data file of rank r: `__r_0.distcp`, sparse). */
static dcp_record *save_records(const sp_model *m, const sp_tensor *t, size_t nt, int world, size_t *nrec,
                                uint64_t *file_bytes) {
    size_t cap = nt * (size_t)world, n = 0;
    dcp_record *recs = malloc(cap * sizeof *recs);
    if (!recs) die("out of memory for the records", NULL);
    for (int rank = 0; rank < world; rank++) {
        uint64_t pos = 0;
        for (size_t i = 0; i < nt; i++) {
            const sp_row *row = t[i].row;
            dcp_record *rec = &recs[n];
            if (!sp_box(m, row, world, rank, 1, rec->offsets, rec->sizes)) continue;
            snprintf(rec->fqn, sizeof rec->fqn, "%s", t[i].name);
            rec->is_tensor = 1, rec->dtype = FSDP_DT_BF16, rec->ndim = row->ndim;
            rec->nest = 0, rec->tail = 0, rec->int_mask = 0;
            memcpy(rec->shape, row->shape, sizeof row->shape);
            snprintf(rec->where.relative_path, sizeof rec->where.relative_path, "__%d_0.distcp", rank);
            rec->where.offset = pos;
            rec->where.length = (uint64_t)fsdp_numel(row->ndim, rec->sizes) * 2;
            pos += rec->where.length;
            n++;
        }
        file_bytes[rank] = pos;
    }
    *nrec = n;
    return recs;
}

/* ---- the planning process (--child): opens the checkpoint, plans, prints one JSON line ------------- */

typedef struct plan_count {
    size_t items;
} plan_count;

static int count_item(void *user, size_t chunk, const int64_t *at, const int64_t *len) {
    (void)chunk, (void)at, (void)len;
    ((plan_count *)user)->items++;
    return 0;
}

/* Plans the load of ranks [lo, hi) of a world of `world` (every tensor); the read items counted. */
static size_t plan_ranks(const sp_model *m, dcp_ckpt *c, const sp_tensor *t, size_t nt, const long *idx, int world,
                         int lo, int hi) {
    plan_count pc = {0};
    for (size_t i = 0; i < nt; i++) {
        const dcp_item *x = &c->items[idx[i]];
        for (int rank = lo; rank < hi; rank++) {
            int64_t off[3], len[3];
            sp_box(m, t[i].row, world, rank, 0, off, len);
            dcp_plan_box(x, &c->plan[idx[i]], off, len, count_item, &pc);
        }
    }
    return pc.items;
}

/* The inspect walk: each entry's summary line (what inspect prints) and a lookup of every key. */
static double inspect_walk(dcp_ckpt *c, size_t *chunks) {
    double t0 = bench_now();
    size_t n = 0, text = 0;
    for (size_t i = 0; i < c->n; i++) {
        const dcp_item *x = &c->items[i];
        char line[1400];
        uint64_t bytes = (uint64_t)fsdp_numel(x->ndim, x->shape) * fsdp_dtype_size(x->dtype);
        text += (size_t)snprintf(line, sizeof line, "%s %s %zu chunks %llu bytes", x->fqn, fsdp_dtype_name(x->dtype),
                                 x->n_chunks, (unsigned long long)bytes);
        n += x->n_chunks;
        if (dcp_find(c, x->fqn) != (long)i) die("dcp_find", NULL);
    }
    *chunks = n;
    double el = bench_now() - t0;
    (void)text;
    return el;
}

/* The diff walk: every stored chunk of a planned against b (a second open of the same checkpoint). */
static double diff_walk(dcp_ckpt *a, dcp_ckpt *b, size_t *items) {
    double t0 = bench_now();
    plan_count pc = {0};
    for (size_t i = 0; i < a->n; i++) {
        const dcp_item *x = &a->items[i];
        long j = dcp_find(b, x->fqn);
        if (j < 0) die("diff: a key missing from the other side", NULL);
        const dcp_item *y = &b->items[j];
        if (y->dtype != x->dtype || y->ndim != x->ndim || memcmp(y->shape, x->shape, sizeof x->shape)) die("diff", NULL);
        for (size_t k = 0; k < x->n_chunks; k++)
            dcp_plan_box(y, &b->plan[j], x->chunks[k].offsets, x->chunks[k].sizes, count_item, &pc);
    }
    *items = pc.items;
    return bench_now() - t0;
}

/* The process's peak RSS since the last call (MiB): VmHWM, then reset (clear_refs 5, Linux 4.0+). */
static long peak_rss_mib(void) {
    long kb = -1;
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    if ((f = fopen("/proc/self/clear_refs", "w"))) {
        fputs("5", f);
        fclose(f);
    }
    if (kb < 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        kb = ru.ru_maxrss;
    }
    return kb / 1024;
}

static int child(const sp_model *m, const char *dir, int world, const char *out_path) {
    size_t nt;
    sp_tensor *t = model_tensors(m, &nt);
    fsdp_err err;
    char path[4200];
    snprintf(path, sizeof path, "%s/.metadata", dir);
    size_t len;
    char *buf = bench_slurp(path, &len);
    if (!buf) exit(1);
    dcp_item *items;
    size_t n;
    char ver[32];
    double t0 = bench_now();
    if (dcp_parse_metadata(buf, len, path, &items, &n, ver, sizeof ver, &err)) die("dcp_parse_metadata", &err);
    double t_parse = bench_now() - t0;
    dcp_items_free(items, n);
    free(buf);
    long rss_parse = peak_rss_mib(); /* the parse of a buffer the caller keeps (not given back as read) */
    dcp_ckpt *c, *c2;
    t0 = bench_now();
    if (dcp_open(dir, &c, &err)) die("dcp_open", &err);
    double t_open = bench_now() - t0;
    long *idx = malloc(nt * sizeof *idx);
    for (size_t i = 0; i < nt; i++)
        if ((idx[i] = dcp_find(c, t[i].name)) < 0) die(t[i].name, NULL);
    int w_small = world * 3 / 4, w_big = world * 2;
    t0 = bench_now();
    size_t n_small = plan_ranks(m, c, t, nt, idx, w_small, w_small / 2, w_small / 2 + 1);
    double t_small = bench_now() - t0;
    t0 = bench_now();
    size_t n_big = plan_ranks(m, c, t, nt, idx, w_big, w_big / 2, w_big / 2 + 1);
    double t_big = bench_now() - t0;
    t0 = bench_now();
    size_t n_all = plan_ranks(m, c, t, nt, idx, w_small, 0, w_small);
    double t_all = bench_now() - t0;
    size_t chunks, n_diff;
    double t_inspect = inspect_walk(c, &chunks);
    long rss_plan = peak_rss_mib(); /* what one rank's planning holds: dcp_open and the plans */
    if (dcp_open(dir, &c2, &err)) die("dcp_open", &err);
    double t_diff = diff_walk(c, c2, &n_diff);
    dcp_close(c2);
    dcp_close(c);
    FILE *f = fopen(out_path, "w");
    if (!f) die(out_path, NULL);
    fprintf(f, "{\"chunks\": %zu, \"parse\": %.6f, \"open\": %.6f, \"plan_small\": %.6f, \"plan_small_items\": %zu, "
               "\"plan_big\": %.6f, \"plan_big_items\": %zu, \"reshard\": %.6f, \"reshard_items\": %zu, "
               "\"inspect\": %.6f, \"diff\": %.6f, \"diff_items\": %zu, \"rss_parse_mib\": %ld, \"rss_mib\": %ld, "
               "\"rss_diff_mib\": %ld}\n",
            chunks, t_parse, t_open, t_small, n_small, t_big, n_big, t_all, n_all, t_inspect, t_diff, n_diff,
            rss_parse, rss_plan, peak_rss_mib());
    fclose(f);
    free(idx);
    free(t);
    return 0;
}

/* ---- the driver ------------------------------------------------------------------------------------ */

enum { S_WRITE, S_PARSE, S_OPEN, S_SMALL, S_BIG, S_RESHARD, S_INSPECT, S_DIFF, N_STEPS };
static const char *STEP_NAME[N_STEPS] = {
    "write .metadata", "read .metadata", "open (parse, ranges, N files, index)", "plan 1 rank's load onto 3N/4",
    "plan 1 rank's load onto 2N", "reshard plan: every rank of 3N/4", "inspect walk", "diff walk"};
static const char *STEP_KEY[N_STEPS] = {"write", "parse", "open", "plan_small", "plan_big", "reshard", "inspect", "diff"};
static const char *ITEMS_KEY[N_STEPS] = {NULL, NULL, NULL, "plan_small_items", "plan_big_items", "reshard_items", NULL,
                                         "diff_items"};

#define MAX_SIZES 8
typedef struct sp_result {
    double fs[N_STEPS], th[N_STEPS]; /* seconds; th < 0: no torch figure */
    double fs_items[N_STEPS], th_items[N_STEPS];
    double chunks, rss_fs, rss_th, meta_mib, write_rss, gather_mib, rss_parse, rss_diff;
} sp_result;

static json_t *load_json(const char *path) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) fprintf(stderr, "scale_plan: %s: %s\n", path, je.text);
    return j;
}

static double jnum(json_t *j, const char *key) {
    json_t *v = j ? json_object_get(j, key) : NULL;
    return json_is_number(v) ? json_number_value(v) : -1;
}

static void make_sparse_files(const char *dir, const uint64_t *bytes, int world) {
    for (int r = 0; r < world; r++) {
        char p[4300];
        snprintf(p, sizeof p, "%s/__%d_0.distcp", dir, r);
        int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (fd < 0 || ftruncate(fd, (off_t)bytes[r]) != 0) die(p, NULL);
        close(fd);
    }
}

/* 1 when a world of that size, 3/4 of it and twice it split into the model's replicas and expert groups */
static int world_fits(const sp_model *m, int world) {
    int small = world * 3 / 4;
    return world % 4 == 0 && small % m->replicas == 0 && small % m->ep == 0 && world % m->replicas == 0 &&
           world % m->ep == 0;
}

/* What a run does: its Python (NULL: no torch side), the largest world torch plans every rank of, --keep. */
typedef struct sp_opts {
    const char *self, *python;
    int torch_all_max, keep;
} sp_opts;

static void run_size(const sp_opts *o, const sp_model *m, const char *base, int world, sp_result *res) {
    const char *self = o->self, *python = o->python;
    size_t nt, nrec;
    sp_tensor *t = model_tensors(m, &nt);
    char dir[4200], cmd[9000], out[4300];
    snprintf(dir, sizeof dir, "%s/%s-%d", base, m->name, world);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (bench_sh(cmd)) exit(1);
    uint64_t *fb = calloc((size_t)world, sizeof *fb);
    dcp_record *recs = save_records(m, t, nt, world, &nrec, fb);
    fsdp_err err;
    double t0 = bench_now();
    if (dcp_write_metadata(dir, recs, nrec, &err)) die("dcp_write_metadata", &err);
    res->fs[S_WRITE] = bench_now() - t0;
    res->write_rss = (double)nrec * sizeof *recs / 1048576.0;
    void *packed = NULL;
    size_t plen = 0;
    if (dcp_records_pack(recs, nrec, &packed, &plen, &err)) die("dcp_records_pack", &err);
    res->gather_mib = (double)plen / 1048576.0; /* what the coordinator of a save receives from all ranks */
    free(packed);
    free(recs);
    make_sparse_files(dir, fb, world);
    free(fb);
    snprintf(out, sizeof out, "%s/.fsdp.json", dir);
    snprintf(cmd, sizeof cmd, "'%s' --child %s '%s' %d '%s'", self, m->name, dir, world, out);
    bench_timed(cmd, NULL);
    json_t *j = load_json(out);
    if (!j) exit(1);
    for (int s = S_PARSE; s < N_STEPS; s++) res->fs[s] = jnum(j, STEP_KEY[s]);
    for (int s = 0; s < N_STEPS; s++) res->fs_items[s] = ITEMS_KEY[s] ? jnum(j, ITEMS_KEY[s]) : -1;
    res->chunks = jnum(j, "chunks");
    res->rss_fs = jnum(j, "rss_mib");
    res->rss_parse = jnum(j, "rss_parse_mib");
    res->rss_diff = jnum(j, "rss_diff_mib");
    json_decref(j);
    char mp[4300];
    snprintf(mp, sizeof mp, "%s/.metadata", dir);
    struct stat st;
    res->meta_mib = stat(mp, &st) == 0 ? (double)st.st_size / 1048576.0 : -1;
    for (int s = 0; s < N_STEPS; s++) res->th[s] = res->th_items[s] = -1;
    res->rss_th = -1;
    if (python) {
        snprintf(out, sizeof out, "%s/.torch.json", dir);
        snprintf(cmd, sizeof cmd, "'%s' bench/scale_plan_torch.py --model %s --dir '%s' --world %d --ep %d "
                 "--replicas %d --out '%s'%s", python, m->name, dir, world, m->ep, m->replicas, out,
                 world > o->torch_all_max ? " --no-all-ranks" : "");
        if (bench_sh(cmd) == 0 && (j = load_json(out))) {
            for (int s = 0; s < N_STEPS; s++) {
                res->th[s] = jnum(j, STEP_KEY[s]);
                res->th_items[s] = ITEMS_KEY[s] ? jnum(j, ITEMS_KEY[s]) : -1;
            }
            res->rss_th = jnum(j, "rss_mib");
            json_decref(j);
        }
    }
    if (!o->keep) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        bench_sh(cmd);
    }
    free(t);
}

/* least-squares slope of log(y) against log(x) over the sizes that have both */
static double exponent(const double *x, const double *y, int n) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (x[i] <= 0 || y[i] <= 0) continue;
        double a = log(x[i]), b = log(y[i]);
        sx += a, sy += b, sxx += a * a, sxy += a * b, k++;
    }
    if (k < 2 || k * sxx - sx * sx == 0) return NAN;
    return (k * sxy - sx * sy) / (k * sxx - sx * sx);
}

static void print_step(const sp_result *res, const int *sizes, int ns, int s) {
    printf("  %s\n    %6s %9s %11s %11s %8s %12s\n", STEP_NAME[s], "ranks", "chunks", "fsdp-run s", "torch s",
           "torch/fs", "read items");
    double x[MAX_SIZES], yf[MAX_SIZES], yt[MAX_SIZES];
    for (int i = 0; i < ns; i++) {
        const sp_result *r = &res[i];
        char th[32] = "n/a", ratio[32] = "", items[48] = "";
        if (r->th[s] >= 0) snprintf(th, sizeof th, "%.4f", r->th[s]);
        if (r->th[s] > 0 && r->fs[s] > 0) snprintf(ratio, sizeof ratio, "%.1f", r->th[s] / r->fs[s]);
        if (r->fs_items[s] >= 0)
            snprintf(items, sizeof items, "%.0f%s", r->fs_items[s],
                     r->th_items[s] < 0 ? "" : r->th_items[s] == r->fs_items[s] ? " (=)" : " (torch differs!)");
        printf("    %6d %9.0f %11.4f %11s %8s %12s\n", sizes[i], r->chunks, r->fs[s], th, ratio, items);
        x[i] = r->chunks, yf[i] = r->fs[s], yt[i] = r->th[s];
    }
    printf("    growth exponent (log time / log chunks): fsdp-run %.2f, torch %.2f\n", exponent(x, yf, ns),
           exponent(x, yt, ns));
}

static int parse_sizes(const char *s, int *sizes) {
    int n = 0;
    while (*s && n < MAX_SIZES) {
        sizes[n] = atoi(s);
        if (sizes[n] < 4) {
            fprintf(stderr, "scale_plan: --sizes: %d ranks: at least 4\n", sizes[n]);
            exit(2);
        }
        n++;
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}

static const sp_model *find_model(const char *name) {
    for (size_t i = 0; i < sizeof MODELS / sizeof *MODELS; i++)
        if (!strcmp(MODELS[i].name, name)) return &MODELS[i];
    fprintf(stderr, "scale_plan: no model %s (llama3-405b, deepseek-v3-671b)\n", name);
    exit(2);
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "--child")) return child(find_model(argv[2]), argv[3], atoi(argv[4]), argv[5]);
    const char *dir = "/tmp/fsdp-scale-plan", *models = "llama3-405b,deepseek-v3-671b", *sizes_s = "512,1024,2048,4096";
    const char *python = access("/work/torchenv/bin/python", X_OK) == 0 ? "/work/torchenv/bin/python" : NULL;
    int keep = 0, torch_all_max = 1024;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--keep")) {
            keep = 1, i--;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "scale_plan: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--models")) models = argv[i + 1];
        else if (!strcmp(argv[i], "--sizes")) sizes_s = argv[i + 1];
        else if (!strcmp(argv[i], "--python")) python = strcmp(argv[i + 1], "none") ? argv[i + 1] : NULL;
        else if (!strcmp(argv[i], "--torch-all-ranks-max")) torch_all_max = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "scale_plan: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    int sizes[MAX_SIZES], ns = parse_sizes(sizes_s, sizes);
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) die("/proc/self/exe", NULL);
    self[sl] = 0;
    sp_opts opts = {self, python, torch_all_max, keep};
    char names[512];
    snprintf(names, sizeof names, "%s", models);
    for (char *sv, *name = strtok_r(names, ",", &sv); name; name = strtok_r(NULL, ",", &sv)) {
        const sp_model *m = find_model(name);
        sp_result res[MAX_SIZES];
        size_t nt;
        free(model_tensors(m, &nt));
        for (int i = 0; i < ns; i++)
            if (!world_fits(m, sizes[i])) {
                fprintf(stderr, "scale_plan: --sizes: %d ranks: %s needs N, 3N/4 and 2N divisible by %d replicas and %d "
                        "expert groups (N a multiple of %d)\n", sizes[i], m->name, m->replicas, m->ep,
                        4 * (m->ep > m->replicas ? m->ep : m->replicas));
                return 2;
            }
        for (int i = 0; i < ns; i++) run_size(&opts, m, dir, sizes[i], &res[i]);
        printf("scale_plan: %s, %zu tensors, %s; bf16, metadata only (sparse data files)%s\n", m->name, nt, m->layout,
               python ? "" : "; no torch (--python)");
        for (int s = 0; s < N_STEPS; s++) print_step(res, sizes, ns, s);
        printf("  per size: .metadata MiB, the writer's records MiB, the records gathered from every rank MiB; peak RSS "
               "MiB: fsdp-run's open + plans (one rank's planning), its parse of a kept buffer, a second open beside the "
               "first (diff); torch's process\n");
        for (int i = 0; i < ns; i++)
            printf("    %6d %9.1f %9.1f %9.1f %9.0f %9.0f %9.0f %9.0f\n", sizes[i], res[i].meta_mib, res[i].write_rss,
                   res[i].gather_mib, res[i].rss_fs, res[i].rss_parse, res[i].rss_diff, res[i].rss_th);
        fflush(stdout);
    }
    return 0;
}
