/* bench/ckpt_state: save and load of a whole model state (the code behind save-dcp and
 * load-ckpt, one rank) for a model preset, next to `cp -r` + sync of the same checkpoint and a
 * `cat > /dev/null` of it (page cache), all measured in the same run, with ratios.
 *
 * Like PyTorch's figures of ../shared/bench/torch_baseline.py --part dcp: the save is timed up
 * to durable files (fsync) and the bytes are the sizes of the checkpoint's files; the load reads
 * into an already allocated state (torch loads into allocated tensors) right after the save, so
 * from the page cache. Host side only: no device copies.
 *
 * --pipeline 1 also runs the staged paths of a state on the GPU (ckpt/ckpt_pipe.h) with the host
 * sink standing in for the device (3 buffers of 16 MiB, copies completed late like a stream): the
 * staged save must write the same data file and the staged load must give the same state; their
 * times show the pipeline's host-side cost (one more copy of every byte than the host paths).
 *
 *   build/bench/ckpt_state [--preset llama3_1b] [--layers N] [--optimizer 0|1] [--dir DIR]
 *                          [--reps N] [--torch-save-gbps X --torch-load-gbps Y] [--pipeline 0|1]
 *
 * Default: llama3_1b with 1 layer, no optimizer moments (~2.3 GB; under a minute on a small
 * host). --layers 0 keeps the preset's layer count (llama3_1b: 16, ~6 GB of fp32 weights). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/state_io.h"
#include "decoder/decoder_table.h"
#include "decoder/decoder_params.h"
#include "runtime/comm.h"
#include "runtime/state.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double sh_timed(const char *cmd) {
    double t0 = now();
    int rc = system(cmd);
    if (rc != 0) {
        fprintf(stderr, "ckpt_state: '%s' failed (%d)\n", cmd, rc);
        exit(1);
    }
    return now() - t0;
}

/* kB value of a /proc/self/status field */
static long proc_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') v = atol(line + n + 1);
    if (f) fclose(f);
    return v;
}

/* resets VmHWM to the current RSS (Linux >= 4.0) */
static void reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

static int build_state(const decoder_config *cfg, int opt, uint64_t salt, fsdp_state **out, double *bytes) {
    decoder_params t;
    fsdp_err err;
    if (decoder_params_build(cfg, &t, &err)) {
        fprintf(stderr, "ckpt_state: %s\n", err.msg);
        return 1;
    }
    fsdp_state *s = calloc(1, sizeof *s);
    s->layout = STATE_SHARDED;
    s->world = 1;
    s->beta1 = 0.9;
    s->beta2 = 0.95;
    s->eps = 1e-8;
    s->lr = 3e-4;
    decoder_state_set_config(s, cfg, &err);
    *bytes = 0;
    for (int i = 0; i < t.n; i++)
        if (state_add_param(s, t.p[i].name, t.p[i].ndim, t.p[i].shape, t.p[i].layer, &err)) {
            fprintf(stderr, "ckpt_state: %s\n", err.msg);
            return 1;
        }
    decoder_params_free(&t);
    if (opt && state_alloc_optimizer(s, &err)) {
        fprintf(stderr, "ckpt_state: %s\n", err.msg);
        return 1;
    }
    s->has_optimizer = opt;
    s->opt_step = 7;
    s->train_step = 7;
    for (size_t i = 0; i < s->n; i++) {
        state_param *p = &s->p[i];
        size_t n = state_param_local_numel(p);
        float *bufs[3] = {p->data, p->exp_avg, p->exp_avg_sq};
        for (int b = 0; b < 3; b++) {
            if (!bufs[b]) continue;
            float *d = bufs[b];
#pragma omp parallel for schedule(static)
            for (size_t k = 0; k < n; k++) {
                uint32_t x = (uint32_t)(k * 2654435761u) ^ (uint32_t)(i * 40503u + (size_t)b * 977u + salt);
                d[k] = (float)(x >> 8) * (1.0f / 16777216.0f) - 0.5f;
            }
            *bytes += (double)n * 4;
        }
    }
    *out = s;
    return 0;
}

static int same_state(const fsdp_state *a, const fsdp_state *b);

/* host arrays <-> "device" slots (the same memory), for the staged paths with the host sink */
static void swap_slots(fsdp_state *s, int to_dev) {
    for (size_t i = 0; i < s->n; i++)
        for (int a = 0; a < STATE_ARRAYS; a++) {
            float **h = state_param_host_slot(&s->p[i], (state_array)a), **d = state_param_dev_slot(&s->p[i], (state_array)a);
            float **from = to_dev ? h : d, **to = to_dev ? d : h;
            if (*from) {
                *to = *from;
                *from = NULL;
            }
        }
}

/* staged save and load through the host sink; 0 when both match the host paths */
static int run_pipeline(fsdp_state *s, fsdp_state *s2, comm *c, const char *ck, const char *dir, int opt,
                        double file_bytes) {
    fsdp_err err;
    ckpt_host_sink hs;
    if (ckpt_host_sink_init(&hs, 3, (size_t)16 << 20, 0, &err)) {
        fprintf(stderr, "ckpt_state: %s\n", err.msg);
        return 1;
    }
    char ck2[4300], cmd[9000];
    snprintf(ck2, sizeof ck2, "%s/ckpt-staged", dir);
    sio_load_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.strict = 1;
    lo.load_optimizer = opt ? 1 : 0;
    lo.sink = &hs.sink;
    sio_load_result res;
    for (size_t i = 0; i < s2->n; i++) s2->p[i].data[0] = -1.0f; /* must be restored */
    swap_slots(s2, 1);
    double t0 = now();
    int rc = sio_load(s2, ck, &lo, &res, &err);
    double tl = now() - t0;
    swap_slots(s2, 0);
    if (rc) {
        fprintf(stderr, "ckpt_state: staged load: %s\n", err.msg);
        ckpt_host_sink_free(&hs);
        return 1;
    }
    sio_save_opts so = {.optimizer = opt, .overwrite = 1};
    swap_slots(s, 1);
    t0 = now();
    rc = sio_save_staged(s, c, ck2, &so, &hs.sink, &err);
    double ts = now() - t0;
    swap_slots(s, 0);
    if (rc) {
        fprintf(stderr, "ckpt_state: staged save: %s\n", err.msg);
        ckpt_host_sink_free(&hs);
        return 1;
    }
    snprintf(cmd, sizeof cmd, "cmp -s '%s/__0_0.distcp' '%s/__0_0.distcp'", ck, ck2);
    int same_file = system(cmd) == 0;
    int in_flight = hs.max_in_flight;
    ckpt_host_sink_free(&hs);
    int same = same_state(s, s2);
    double gb = file_bytes / 1e9;
    printf("staged save %5.2f s  %6.2f GB/s  (host sink, %d transfers in flight at most)  data file %s\n", ts,
           gb / ts, in_flight, same_file ? "identical" : "DIFFERS");
    printf("staged load %5.2f s  %6.2f GB/s  (host sink)  loaded state %s\n", tl, gb / tl,
           same ? "identical" : "DIFFERS");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ck2);
    sh_timed(cmd);
    return same && same_file ? 0 : 1;
}

static int same_state(const fsdp_state *a, const fsdp_state *b) {
    for (size_t i = 0; i < a->n; i++) {
        size_t n = state_param_local_numel(&a->p[i]) * sizeof(float);
        if (memcmp(a->p[i].data, b->p[i].data, n)) return 0;
        if (a->p[i].exp_avg && (memcmp(a->p[i].exp_avg, b->p[i].exp_avg, n) || memcmp(a->p[i].exp_avg_sq, b->p[i].exp_avg_sq, n)))
            return 0;
    }
    return a->opt_step == b->opt_step && a->train_step == b->train_step;
}

int main(int argc, char **argv) {
    const char *preset = "llama3_1b", *dir = "/tmp/fsdp-ckpt-state";
    int layers = 1, opt = 0, reps = 1, pipeline = 0;
    double torch_save = 0, torch_load = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--preset")) preset = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--optimizer")) opt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--pipeline")) pipeline = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--torch-save-gbps")) torch_save = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--torch-load-gbps")) torch_load = atof(argv[i + 1]);
        else {
            fprintf(stderr, "ckpt_state: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    fsdp_err err;
    decoder_config cfg;
    if (decoder_config_preset(&cfg, preset, &err)) {
        fprintf(stderr, "ckpt_state: %s\n", err.msg);
        return 1;
    }
    if (layers > 0) {
        cfg.n_layers = layers;
        if (decoder_config_finalize(&cfg, &err)) {
            fprintf(stderr, "ckpt_state: %s\n", err.msg);
            return 1;
        }
    }
    fsdp_state *s, *s2;
    double state_bytes, b2;
    if (build_state(&cfg, opt, 0, &s, &state_bytes) || build_state(&cfg, opt, 99, &s2, &b2)) return 1;
    comm *c;
    if (comm_create_single(&c, &err)) {
        fprintf(stderr, "ckpt_state: %s\n", err.msg);
        return 1;
    }
    char ck[4200], cmd[9000];
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    sh_timed(cmd);
    printf("ckpt_state: %s, %d layers, %s: %.2f GB of state, %d rep(s)\n", preset, cfg.n_layers,
           opt ? "weights + AdamW moments" : "weights only", state_bytes / 1e9, reps);
    double best_mem = 1e30, best_save = 1e30, best_load = 1e30, best_cp = 1e30, best_cat = 1e30, file_bytes = 0;
    long save_peak_mib = 0, load_peak_mib = 0;
    int equal = 1;
    for (int r = 0; r < reps; r++) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.copy' && sync", ck, ck);
        sh_timed(cmd);
        sio_save_opts so = {.optimizer = opt, .overwrite = 1};
        long rss0 = proc_kb("VmRSS");
        reset_peak();
        double t0 = now();
        if (sio_save(s, c, ck, &so, &err)) {
            fprintf(stderr, "ckpt_state: save: %s\n", err.msg);
            return 1;
        }
        double ts = now() - t0;
        long pk = (proc_kb("VmHWM") - rss0) / 1024;
        if (pk > save_peak_mib) save_peak_mib = pk;
        if (ts < best_save) best_save = ts;
        snprintf(cmd, sizeof cmd, "du -sb --apparent-size '%s' | cut -f1 > '%s/bytes'", ck, dir);
        sh_timed(cmd);
        snprintf(cmd, sizeof cmd, "%s/bytes", dir);
        FILE *bf = fopen(cmd, "r");
        if (!bf || fscanf(bf, "%lf", &file_bytes) != 1) file_bytes = 0;
        if (bf) fclose(bf);
        /* page-cache read of the same files */
        snprintf(cmd, sizeof cmd, "cat '%s'/* '%s'/.metadata > /dev/null", ck, ck);
        double tc = sh_timed(cmd);
        if (tc < best_cat) best_cat = tc;
        /* load into the allocated second state (from the page cache) */
        sio_load_opts lo;
        memset(&lo, 0, sizeof lo);
        lo.strict = 1;
        lo.load_optimizer = opt ? 1 : 0;
        sio_load_result res;
        rss0 = proc_kb("VmRSS");
        reset_peak();
        t0 = now();
        if (sio_load(s2, ck, &lo, &res, &err)) {
            fprintf(stderr, "ckpt_state: load: %s\n", err.msg);
            return 1;
        }
        double tl = now() - t0;
        pk = (proc_kb("VmHWM") - rss0) / 1024;
        if (pk > load_peak_mib) load_peak_mib = pk;
        if (tl < best_load) best_load = tl;
        if (!same_state(s, s2)) equal = 0;
        /* one thread's memcpy of the state into the loaded one (the bytes a load moves) */
        t0 = now();
        for (size_t i = 0; i < s->n; i++) {
            size_t n = state_param_local_numel(&s->p[i]) * sizeof(float);
            memcpy(s2->p[i].data, s->p[i].data, n);
            if (opt) {
                memcpy(s2->p[i].exp_avg, s->p[i].exp_avg, n);
                memcpy(s2->p[i].exp_avg_sq, s->p[i].exp_avg_sq, n);
            }
        }
        double tm = now() - t0;
        if (tm < best_mem) best_mem = tm;
        /* cp of the same checkpoint, durable (sync), like the save */
        snprintf(cmd, sizeof cmd, "cp -r '%s' '%s.copy' && sync", ck, ck);
        double tcp = sh_timed(cmd);
        if (tcp < best_cp) best_cp = tcp;
        snprintf(cmd, sizeof cmd, "rm -rf '%s.copy'", ck);
        sh_timed(cmd);
    }
    int pipe_rc = pipeline ? run_pipeline(s, s2, c, ck, dir, opt, file_bytes) : 0;
    double gb = file_bytes / 1e9;
    double save_gbps = gb / best_save, load_gbps = gb / best_load, cp_gbps = gb / best_cp, cat_gbps = gb / best_cat;
    printf("files      %.3f GB\n", gb);
    printf("save       %6.2f s  %6.2f GB/s  (%.2fx cp)   peak RSS above the state: %ld MiB\n", best_save, save_gbps,
           save_gbps / cp_gbps, save_peak_mib);
    printf("load       %6.2f s  %6.2f GB/s  (%.2fx cat)  peak RSS above the state: %ld MiB  loaded state %s\n",
           best_load, load_gbps, load_gbps / cat_gbps, load_peak_mib, equal ? "identical" : "DIFFERS");
    printf("cp -r+sync %6.2f s  %6.2f GB/s\n", best_cp, cp_gbps);
    printf("cat        %6.2f s  %6.2f GB/s  (page cache)\n", best_cat, cat_gbps);
    printf("memcpy     %6.2f s  %6.2f GB/s  (one thread, state to state)\n", best_mem, state_bytes / 1e9 / best_mem);
    if (torch_save > 0) printf("vs torch dcp.save %.2f GB/s: %.2fx\n", torch_save, save_gbps / torch_save);
    if (torch_load > 0) printf("vs torch dcp.load (warm cache) %.2f GB/s: %.2fx\n", torch_load, load_gbps / torch_load);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    sh_timed(cmd);
    comm_destroy(c);
    state_free(s);
    state_free(s2);
    return equal && !pipe_rc ? 0 : 1;
}
