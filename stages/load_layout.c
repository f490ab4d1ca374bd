/* load-ckpt's `layout:` (layouts/layout.h): the checkpoint read through a view in fsdp-run's layout. */
#include <stdio.h>
#include <string.h>

#include "layouts/lay_deepspeed.h"
#include "layouts/layout.h"
#include "stages/stages.h"

int stage_layout_check(const fsdp_value *v, fsdp_err *err) {
    const char *t = v ? fsdp_value_text(v) : NULL;
    if (!v || (t && (!strcmp(t, "auto") || !strcmp(t, "hf") || lay_find(t)))) return 0;
    char names[512];
    return fsdp_err_at(err, FSDP_E_INVALID, v, "load-ckpt: layout: '%s' is none of auto, hf, %s", t ? t : "?",
                       lay_names(names, sizeof names));
}

int stage_layout_view(fsdp_ctx *ctx, const fsdp_state *s, const char *layout, ckpt_reader **r, fsdp_err *err) {
    const lay_layout *L = NULL;
    int rc = lay_check_placeholders(*r, err);
    if (rc) return fsdp_err_prefix(err, "load-ckpt");
    if (!layout || !strcmp(layout, "hf")) return 0; /* hf: names: hf reads it (ckpt/state_load.c) */
    if (!strcmp(layout, "auto")) {
        size_t n = 0;
        for (size_t i = 0; i < lay_count(); i++) n += (size_t)lay_matches(*r, lay_at(i));
        if (!n) return 0; /* today's keys and prefixes (ckpt/key_layout.h) */
        if ((rc = lay_detect(*r, NULL, &L, err))) return fsdp_err_prefix(err, "load-ckpt");
    } else if (!(L = lay_find(layout))) {
        return fsdp_err_set(err, FSDP_E_INVALID, "load-ckpt: no layout %s", layout);
    } else if (!lay_matches(*r, L)) {
        const lay_layout *seen;
        fsdp_err e2;
        if (!lay_detect(*r, NULL, &seen, &e2))
            fsdp_log(ctx, FSDP_LOG_WARN, "load-ckpt: layout %s was named, but %s's keys are %s's (layout: auto reads it)",
                     L->name, ckpt_reader_path(*r), seen->name);
    }
    if (L == lay_find("torchtitan")) return 0; /* fsdp-run's own */
    lay_facts f = {s->hf.n_heads, s->hf.n_kv_heads, ckpt_reader_path(*r), NULL, 0};
    ckpt_reader *v;
    if ((rc = lay_view(*r, 0, L, LAY_TO_CANON, &f, &v, NULL, err))) return fsdp_err_prefix(err, "load-ckpt");
    fsdp_log(ctx, FSDP_LOG_INFO, "load-ckpt: %s is in layout %s (%s): read as fsdp-run's", ckpt_reader_path(*r),
             L->name, L->system);
    *r = v; /* the caller closes the view, then the source */
    return 0;
}

int stage_open_deepspeed(fsdp_ctx *ctx, const fsdp_state *s, const char *path, ckpt_reader **r, fsdp_err *err) {
    const lay_layout *L;
    int c = lay_container_open(path, &L, r, err); /* accelerate's two DCPs: read as one, its layout detected */
    if (c < 0) return fsdp_err_prefix(err, "load-ckpt"), err->code;
    if (c > 0) return 0;
    if (!lay_ds_is(path)) return 1;
    lay_facts f = {s->hf.n_heads, s->hf.n_kv_heads, path, NULL, 0};
    int rc = lay_ds_open(path, &f, r, err);
    if (rc) return fsdp_err_prefix(err, "load-ckpt");
    fsdp_log(ctx, FSDP_LOG_INFO, "load-ckpt: %s is a DeepSpeed ZeRO checkpoint: read as fsdp-run's (weights and moments "
             "from the ranks' partitions)", path);
    return 0;
}
