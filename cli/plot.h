/* `fsdp-run plot METRICS.jsonl [MORE.jsonl ...] -o OUT.png|OUT.svg`: loss, lr, grad-norm and tokens/s
 * against step, one line per run (a file's lines grouped by their run_id; lines without one are one
 * run), drawn with cairo (PNG or SVG by the output's extension). */
#ifndef FSDP_CLI_PLOT_H
#define FSDP_CLI_PLOT_H

#include <stddef.h>
#include <stdio.h>

#include "fsdp/error.h"

/* The panels' metrics, then the eval loss (eval lines of an eval_every run), drawn on the loss panel as
 * its own series: dashed, a marker at each of its steps. The last two panels are a mixture of experts'
 * (drawn when a run has them): its load-balancing loss and the balance of its experts (the smallest over
 * the MoE layers of the least over the most loaded expert's tokens: 1 = balanced). */
enum { PLOT_LOSS = 0, PLOT_LR, PLOT_GRAD_NORM, PLOT_TOKENS_PER_S, PLOT_AUX_LOSS, PLOT_EXPERT_BALANCE, PLOT_N_METRICS,
       PLOT_EVAL_LOSS = PLOT_N_METRICS, PLOT_N_VALUES };
/* The panels every plot has (the MoE ones come after them). */
#define PLOT_N_BASIC PLOT_AUX_LOSS

/* The JSON keys of the values: the metrics in panel order, then "eval_loss" ("expert_load_min_max" is an
 * object of layers: its smallest value is taken). */
extern const char *const PLOT_KEYS[PLOT_N_VALUES];

typedef struct plot_series {
    char label[256];  /* file name, and the run id when the file holds several runs */
    char run_id[64];
    size_t n, cap;
    double *step;
    double *val[PLOT_N_VALUES]; /* NaN where a line lacks the value (a training line has no eval_loss, an eval
                                 * line only that: each curve joins the points that have its value) */
} plot_series;

typedef struct plot_set {
    plot_series *s;
    size_t n, cap;
} plot_set;

/* Reads one metrics file into set (one series per run id). Errors name the file and the line. */
int plot_read(const char *path, plot_set *set, fsdp_err *err);
void plot_set_free(plot_set *set);

/* Draws the panels into out (.png or .svg): four, or six when a run has a mixture of experts' metrics. */
int plot_draw(const plot_set *set, const char *out, fsdp_err *err);

/* The subcommand: argv[0] is the first argument after `plot`. Returns the exit code. */
int plot_cli_main(int argc, char **argv, FILE *out, FILE *log);

#endif
