/* fsdp-run plot METRICS.jsonl [MORE.jsonl ...] -o OUT.png|OUT.svg */
#include <stdlib.h>
#include <string.h>

#include "cli/plot.h"

static void plot_usage(FILE *f) {
    fputs("usage: fsdp-run plot METRICS.jsonl [MORE.jsonl ...] -o OUT.png|OUT.svg\n"
          "  draws loss, lr, grad norm and tokens/s against step, one line per run (train-steps' metrics files;\n"
          "  a file holding several runs, told apart by their run_id, gives one line per run)\n",
          f);
}

int plot_cli_main(int argc, char **argv, FILE *out, FILE *log) {
    const char *dst = NULL;
    const char **files = argc > 0 ? calloc((size_t)argc, sizeof *files) : NULL;
    size_t nf = 0;
    if (argc > 0 && !files) {
        fputs("fsdp-run: error: out of memory\n", log);
        return 1;
    }
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            plot_usage(out);
            free(files);
            return 0;
        }
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (i + 1 >= argc) break;
            dst = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(log, "fsdp-run: error: plot: unknown option '%s'\n", argv[i]);
            free(files);
            return 2;
        } else {
            files[nf++] = argv[i];
        }
    }
    if (!dst || !nf) {
        fprintf(log, "fsdp-run: error: plot: %s\n", !dst ? "-o OUT.png|OUT.svg is required" : "no metrics file given");
        plot_usage(log);
        free(files);
        return 2;
    }
    plot_set set = {0};
    fsdp_err err;
    fsdp_err_clear(&err);
    int rc = 0;
    for (size_t i = 0; i < nf && !rc; i++) rc = plot_read(files[i], &set, &err);
    if (!rc) rc = plot_draw(&set, dst, &err);
    if (rc) fprintf(log, "fsdp-run: error: %s\n", err.msg);
    else fprintf(out, "plot: wrote %s (%zu run%s)\n", dst, set.n, set.n == 1 ? "" : "s");
    plot_set_free(&set);
    free(files);
    return rc ? (rc == FSDP_E_INVALID ? 2 : 1) : 0;
}
