/* The plot's drawing with cairo: four panels (loss, lr, grad-norm, tokens/s against step; six with a
 * mixture of experts' aux loss and expert balance), a line
 * per series in its colour, ticks, labels and a legend; PNG or SVG by the output's extension. */
#include <cairo-svg.h>
#include <cairo.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/plot.h"

#define PLOT_W 1200
#define PLOT_H 800

typedef struct {
    double x, y, w, h;
} plot_rect;

typedef struct {
    double lo, hi;
} plot_range;

static const double PALETTE[][3] = {{0.12, 0.47, 0.71}, {1.00, 0.50, 0.05}, {0.17, 0.63, 0.17}, {0.84, 0.15, 0.16},
                                    {0.58, 0.40, 0.74}, {0.55, 0.34, 0.29}, {0.89, 0.47, 0.76}, {0.50, 0.50, 0.50}};
#define N_PALETTE (sizeof PALETTE / sizeof *PALETTE)
static const char *const TITLES[PLOT_N_METRICS] = {"loss",     "lr", "grad norm", "tokens/s", "aux loss (experts)",
                                                   "expert balance (min/max tokens)"};

/* The range of the finite values of metric k (k < 0: the steps) over every series, the loss panel's
 * with the eval loss; 0 when there are none. */
static int range_of(const plot_set *set, int k, plot_range *r) {
    r->lo = INFINITY;
    r->hi = -INFINITY;
    for (size_t i = 0; i < set->n; i++)
        for (size_t j = 0; j < set->s[i].n; j++)
            for (int e = 0; e < (k == PLOT_LOSS ? 2 : 1); e++) {
                double v = k < 0 ? set->s[i].step[j] : set->s[i].val[e ? PLOT_EVAL_LOSS : k][j];
                if (!isfinite(v)) continue;
                if (v < r->lo) r->lo = v;
                if (v > r->hi) r->hi = v;
            }
    if (r->lo > r->hi) return 0;
    if (r->hi - r->lo < 1e-12 * fmax(1.0, fabs(r->hi))) {
        double d = fabs(r->lo) > 0 ? fabs(r->lo) * 0.1 : 1.0;
        r->lo -= d;
        r->hi += d;
    }
    return 1;
}

/* A step of 1, 2 or 5 x 10^k giving about n ticks over r. */
static double tick_step(plot_range r, int n) {
    double raw = (r.hi - r.lo) / n, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static double map(double v, plot_range r, double a, double b) { return a + (v - r.lo) / (r.hi - r.lo) * (b - a); }

static void text_at(cairo_t *cr, double x, double y, const char *s, double align_x) {
    cairo_text_extents_t te;
    cairo_text_extents(cr, s, &te);
    cairo_move_to(cr, x - te.width * align_x - te.x_bearing, y);
    cairo_show_text(cr, s);
}

/* The frame, the ticks and their labels of one panel. */
static void draw_axes(cairo_t *cr, const plot_rect *p, plot_range xr, plot_range yr, const char *title) {
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, p->x, p->y, p->w, p->h);
    cairo_stroke(cr);
    cairo_set_font_size(cr, 15);
    text_at(cr, p->x + p->w / 2, p->y - 10, title, 0.5);
    cairo_set_font_size(cr, 11);
    char buf[64];
    double sx = tick_step(xr, 5), sy = tick_step(yr, 5);
    for (double t = ceil(xr.lo / sx) * sx; t <= xr.hi + sx * 1e-9; t += sx) {
        double x = map(t, xr, p->x, p->x + p->w);
        cairo_move_to(cr, x, p->y + p->h);
        cairo_line_to(cr, x, p->y + p->h + 5);
        snprintf(buf, sizeof buf, "%.6g", fabs(t) < sx * 1e-9 ? 0.0 : t);
        text_at(cr, x, p->y + p->h + 18, buf, 0.5);
    }
    for (double t = ceil(yr.lo / sy) * sy; t <= yr.hi + sy * 1e-9; t += sy) {
        double y = map(t, yr, p->y + p->h, p->y);
        cairo_move_to(cr, p->x - 5, y);
        cairo_line_to(cr, p->x, y);
        snprintf(buf, sizeof buf, "%.4g", fabs(t) < sy * 1e-9 ? 0.0 : t);
        text_at(cr, p->x - 8, y + 4, buf, 1.0);
    }
    cairo_stroke(cr);
    text_at(cr, p->x + p->w / 2, p->y + p->h + 34, "step", 0.5);
}

/* 1 when some series has an eval loss */
static int has_eval(const plot_set *set) {
    for (size_t i = 0; i < set->n; i++)
        for (size_t j = 0; j < set->s[i].n; j++)
            if (isfinite(set->s[i].val[PLOT_EVAL_LOSS][j])) return 1;
    return 0;
}

/* Value k of one series as a polyline through the points that have it (a line without it, such as an
 * eval line for the training metrics, is skipped, not a gap); a dot when it has one point. The eval
 * loss (k == PLOT_EVAL_LOSS) is dashed with a marker at each of its points. */
static void draw_line(cairo_t *cr, const plot_series *s, int k, const plot_rect *p, plot_range xr, plot_range yr,
                      const double *rgb) {
    cairo_save(cr);
    cairo_rectangle(cr, p->x, p->y, p->w, p->h);
    cairo_clip(cr);
    cairo_set_source_rgb(cr, rgb[0], rgb[1], rgb[2]);
    cairo_set_line_width(cr, k == PLOT_EVAL_LOSS ? 1.5 : 2);
    static const double DASH[] = {6, 4};
    if (k == PLOT_EVAL_LOSS) cairo_set_dash(cr, DASH, 2, 0);
    size_t drawn = 0;
    double x = 0, y = 0;
    for (size_t j = 0; j < s->n; j++) {
        double v = s->val[k][j];
        if (!isfinite(v) || !isfinite(s->step[j])) continue;
        x = map(s->step[j], xr, p->x, p->x + p->w), y = map(v, yr, p->y + p->h, p->y);
        if (drawn++) cairo_line_to(cr, x, y);
        else cairo_move_to(cr, x, y);
    }
    if (drawn == 1 && k != PLOT_EVAL_LOSS) cairo_arc(cr, x, y, 3, 0, 2 * M_PI);
    cairo_stroke(cr);
    cairo_set_dash(cr, NULL, 0, 0);
    for (size_t j = 0; k == PLOT_EVAL_LOSS && j < s->n; j++) {
        double v = s->val[k][j];
        if (!isfinite(v) || !isfinite(s->step[j])) continue;
        cairo_new_sub_path(cr);
        cairo_arc(cr, map(s->step[j], xr, p->x, p->x + p->w), map(v, yr, p->y + p->h, p->y), 3.5, 0, 2 * M_PI);
    }
    if (k == PLOT_EVAL_LOSS) cairo_fill(cr);
    cairo_restore(cr);
}

/* Rows of the legend: one per series, and one saying how the eval loss is drawn when there is one. */
static size_t legend_rows(const plot_set *set) { return set->n + (size_t)has_eval(set); }

static void draw_legend(cairo_t *cr, const plot_set *set) {
    cairo_set_font_size(cr, 12);
    double y = PLOT_H - 14.0 * (double)legend_rows(set) - 6;
    if (has_eval(set)) {
        cairo_set_source_rgb(cr, 0, 0, 0);
        text_at(cr, 44, y, "loss panel: dashed with markers = eval_loss (at its steps), solid = training loss", 0);
        y += 14;
    }
    for (size_t i = 0; i < set->n; i++, y += 14) {
        const double *c = PALETTE[i % N_PALETTE];
        cairo_set_source_rgb(cr, c[0], c[1], c[2]);
        cairo_rectangle(cr, 20, y - 9, 18, 8);
        cairo_fill(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        text_at(cr, 44, y, set->s[i].label, 0);
    }
}

static void draw_all(cairo_t *cr, const plot_set *set) {
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    double legend = 14.0 * (double)legend_rows(set) + 10;
    plot_range moe;
    const int panels = range_of(set, PLOT_AUX_LOSS, &moe) ? PLOT_N_METRICS : PLOT_N_BASIC, cols = panels / 2;
    double pw = PLOT_W / (double)cols, ph = (PLOT_H - legend) / 2.0;
    plot_range xr;
    if (!range_of(set, -1, &xr)) xr = (plot_range){0, 1};
    for (int k = 0; k < panels; k++) {
        plot_rect p = {(k % cols) * pw + 80, (k / cols) * ph + 34, pw - 110, ph - 84};
        plot_range yr;
        if (!range_of(set, k, &yr)) {
            cairo_set_source_rgb(cr, 0, 0, 0);
            cairo_set_font_size(cr, 15);
            text_at(cr, p.x + p.w / 2, p.y + p.h / 2, "(no values)", 0.5);
            text_at(cr, p.x + p.w / 2, p.y - 10, TITLES[k], 0.5);
            continue;
        }
        draw_axes(cr, &p, xr, yr, TITLES[k]);
        for (size_t i = 0; i < set->n; i++) {
            draw_line(cr, &set->s[i], k, &p, xr, yr, PALETTE[i % N_PALETTE]);
            if (k == PLOT_LOSS) draw_line(cr, &set->s[i], PLOT_EVAL_LOSS, &p, xr, yr, PALETTE[i % N_PALETTE]);
        }
    }
    draw_legend(cr, set);
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcasecmp(s + a - b, suf);
}

int plot_draw(const plot_set *set, const char *out, fsdp_err *err) {
    int svg = ends_with(out, ".svg");
    if (!svg && !ends_with(out, ".png"))
        return fsdp_err_set(err, FSDP_E_INVALID, "plot: -o %s: expected a .png or .svg file name", out);
    cairo_surface_t *sf = svg ? cairo_svg_surface_create(out, PLOT_W, PLOT_H)
                              : cairo_image_surface_create(CAIRO_FORMAT_RGB24, PLOT_W, PLOT_H);
    cairo_t *cr = cairo_create(sf);
    draw_all(cr, set);
    cairo_status_t st = cairo_status(cr);
    cairo_destroy(cr);
    if (!st && !svg) st = cairo_surface_write_to_png(sf, out);
    cairo_surface_finish(sf);
    if (!st) st = cairo_surface_status(sf);
    cairo_surface_destroy(sf);
    if (st) return fsdp_err_set(err, FSDP_E_IO, "plot: cannot write %s: %s", out, cairo_status_to_string(st));
    return 0;
}
