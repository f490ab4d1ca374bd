/* bench/scale_dcp: growth of the DCP metadata and sharded-state bookkeeping with their size.
 * For n, 2n, 4n and 8n it times, in this one run:
 *   - writing (dcp_write_metadata) and parsing (dcp_parse_metadata) a .metadata of n keys (one
 *     chunk each); "of which pickle" is pkl_parse alone on the same bytes,
 *   - parsing a .metadata with one tensor of n chunks (Shard(0) rows), and one of n chunks in a
 *     2-D grid (n/16 x 16 blocks),
 *   - opening a rank-local checkpoint (4 files `__<r>.metadata`, n keys each split in 4 rows) and
 *     looking every key up (dcp_open + dcp_find),
 *   - declaring n parameters in a state and finding each (state_add_param + state_find),
 * and prints time(2n)/time(n) per doubling: about 2 means linear, 4 quadratic.
 *
 *   build/bench/scale_dcp [--n 5000] [--dir /tmp/fsdp-scale-dcp] */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "ckpt/dcp.h"
#include "ckpt/pickle.h"
#include "runtime/state.h"

#define ROUNDS 4

typedef struct row {
    const char *name;
    double t[ROUNDS];
} row;

static void die(const char *what, const fsdp_err *err) {
    fprintf(stderr, "scale_dcp: %s: %s\n", what, err ? err->msg : "failed");
    exit(1);
}

static void tensor_rec(dcp_record *r, const char *fqn, int ndim, const int64_t *shape, const int64_t *off,
                       const int64_t *sz, const char *file, uint64_t at) {
    memset(r, 0, sizeof *r);
    snprintf(r->fqn, sizeof r->fqn, "%s", fqn);
    r->is_tensor = 1;
    r->dtype = FSDP_DT_F32;
    r->ndim = ndim;
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        r->shape[d] = shape[d], r->offsets[d] = off[d], r->sizes[d] = sz[d];
        numel *= sz[d];
    }
    snprintf(r->where.relative_path, sizeof r->where.relative_path, "%s", file);
    r->where.offset = at;
    r->where.length = (uint64_t)numel * 4;
}

/* Seconds to parse dir/.metadata (best of 2); *pickle: pkl_parse alone. */
static double time_parse(const char *dir, double *pickle) {
    char path[4200];
    snprintf(path, sizeof path, "%s/.metadata", dir);
    size_t len;
    char *buf = bench_slurp(path, &len);
    if (!buf) exit(1);
    double best = 1e30, best_p = 1e30;
    for (int rep = 0; rep < 2; rep++) {
        fsdp_err err;
        pkl_doc *doc;
        const pkl_obj *root;
        double t0 = bench_now();
        if (pkl_parse(buf, len, path, &doc, &root, &err)) die("pkl_parse", &err);
        pkl_free(doc);
        double t1 = bench_now();
        dcp_item *items;
        size_t n;
        char ver[32];
        if (dcp_parse_metadata(buf, len, path, &items, &n, ver, sizeof ver, &err)) die("dcp_parse_metadata", &err);
        dcp_items_free(items, n);
        double t2 = bench_now();
        if (t2 - t1 < best) best = t2 - t1;
        if (t1 - t0 < best_p) best_p = t1 - t0;
    }
    free(buf);
    if (pickle) *pickle = best_p;
    return best;
}

static double write_meta(const char *dir, const dcp_record *recs, size_t n) {
    fsdp_err err;
    double t0 = bench_now();
    if (dcp_write_metadata(dir, recs, n, &err)) die("dcp_write_metadata", &err);
    return bench_now() - t0;
}

static void keys_case(const char *dir, size_t n, double *t_write, double *t_parse, double *t_pickle) {
    dcp_record *recs = calloc(n, sizeof *recs);
    int64_t shape[1] = {4}, off[1] = {0};
    for (size_t i = 0; i < n; i++) {
        char fqn[64];
        snprintf(fqn, sizeof fqn, "layers.%zu.attention.wq.weight", i);
        tensor_rec(&recs[i], fqn, 1, shape, off, shape, "__0_0.distcp", 16 * i);
    }
    *t_write = write_meta(dir, recs, n);
    *t_parse = time_parse(dir, t_pickle);
    free(recs);
}

static double chunks_case(const char *dir, size_t n, int grid) {
    size_t cols = grid ? 16 : 1, rows = n / cols;
    n = rows * cols;
    dcp_record *recs = calloc(n, sizeof *recs);
    int64_t shape[2] = {(int64_t)rows, grid ? (int64_t)cols : 4};
    for (size_t i = 0; i < n; i++) {
        int64_t off[2] = {(int64_t)(i / cols), grid ? (int64_t)(i % cols) : 0}, sz[2] = {1, grid ? 1 : 4};
        tensor_rec(&recs[i], "w", 2, shape, off, sz, "__0_0.distcp", 16 * i);
    }
    write_meta(dir, recs, n);
    free(recs);
    return time_parse(dir, NULL);
}

/* 4 rank-local metadata files, n keys each of shape [4, 4] split in rows by rank */
static double rank_local_case(const char *dir, size_t n) {
    dcp_record *recs = calloc(n, sizeof *recs);
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "rm -f '%s'/__*.metadata '%s/.metadata'", dir, dir);
    bench_sh(cmd);
    for (int r = 0; r < 4; r++) {
        char file[64], path[4300], to[4300];
        snprintf(file, sizeof file, "__%d_0.distcp", r);
        int64_t shape[2] = {4, 4}, off[2] = {r, 0}, sz[2] = {1, 4};
        for (size_t i = 0; i < n; i++) {
            char fqn[64];
            snprintf(fqn, sizeof fqn, "layers.%zu.w", i);
            tensor_rec(&recs[i], fqn, 2, shape, off, sz, file, 16 * i);
        }
        snprintf(path, sizeof path, "%s/%s", dir, file);
        int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (fd < 0 || ftruncate(fd, (off_t)(16 * n)) != 0) die(path, NULL);
        close(fd);
        write_meta(dir, recs, n);
        snprintf(path, sizeof path, "%s/.metadata", dir);
        snprintf(to, sizeof to, "%s/__%d.metadata", dir, r);
        if (rename(path, to) != 0) die(to, NULL);
    }
    fsdp_err err;
    double t0 = bench_now();
    dcp_ckpt *c;
    if (dcp_open(dir, &c, &err)) { /* (a build whose merge refuses per-rank chunk lists) */
        fprintf(stderr, "scale_dcp: rank-local open failed: %s\n", err.msg);
        free(recs);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (dcp_find(c, recs[i].fqn) < 0) die("dcp_find", NULL);
    dcp_close(c);
    double t = bench_now() - t0;
    snprintf(cmd, sizeof cmd, "rm -f '%s'/__*.metadata '%s'/__*.distcp", dir, dir);
    bench_sh(cmd);
    free(recs);
    return t;
}

static double state_case(size_t n) {
    fsdp_state *s = calloc(1, sizeof *s);
    s->layout = STATE_SHARDED;
    s->world = 1;
    fsdp_err err;
    int64_t shape[1] = {2};
    char name[64];
    double t0 = bench_now();
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "layers.%zu.feed_forward.w%zu.weight", i / 9, i % 9);
        if (state_add_param(s, name, 1, shape, (int)(i / 9), &err)) die("state_add_param", &err);
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "layers.%zu.feed_forward.w%zu.weight", i / 9, i % 9);
        if (!state_find(s, name)) die("state_find", NULL);
    }
    double t = bench_now() - t0;
    state_free(s);
    return t;
}

static void print_row(const row *r, const size_t *ns) {
    printf("%-44s", r->name);
    for (int k = 0; k < ROUNDS; k++) r->t[k] < 0 ? printf("    failed") : printf(" %9.4f", r->t[k]);
    printf("   ");
    for (int k = 1; k < ROUNDS; k++) printf(" %5.2f", r->t[k - 1] > 0 && r->t[k] > 0 ? r->t[k] / r->t[k - 1] : 0.0);
    printf("\n");
    (void)ns;
}

int main(int argc, char **argv) {
    size_t n0 = 5000;
    const char *dir = "/tmp/fsdp-scale-dcp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--n")) n0 = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
    }
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (bench_sh(cmd)) return 1;
    size_t ns[ROUNDS];
    row rows[8] = {{"write .metadata, n keys", {0}},
                   {"parse .metadata, n keys", {0}},
                   {"  of which pickle (pkl_parse)", {0}},
                   {"parse .metadata, 1 tensor of n row chunks", {0}},
                   {"parse .metadata, 1 tensor of n grid chunks", {0}},
                   {"rank-local open + dcp_find, 4 x n keys", {0}},
                   {"state declare + find, n params", {0}},
                   {"state declare + find, 4.5n params", {0}}};
    for (int k = 0; k < ROUNDS; k++) {
        size_t n = n0 << k;
        ns[k] = n;
        keys_case(dir, n, &rows[0].t[k], &rows[1].t[k], &rows[2].t[k]);
        rows[3].t[k] = chunks_case(dir, n, 0);
        rows[4].t[k] = chunks_case(dir, n, 1);
        rows[5].t[k] = rank_local_case(dir, n);
        rows[6].t[k] = state_case(n);
        rows[7].t[k] = state_case(n * 9 / 2);
    }
    printf("scale_dcp: seconds for n = %zu, %zu, %zu, %zu; then time(2n)/time(n) per doubling (2 = linear, "
           "4 = quadratic)\n", ns[0], ns[1], ns[2], ns[3]);
    for (int r = 0; r < 8; r++) print_row(&rows[r], ns);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    bench_sh(cmd);
    return 0;
}
