/* state_load_hint (state_load_hint.h): "add names: hf" for an HF checkpoint loaded under fsdp-run's names. */
#include "ckpt/state_load_hint.h"

#include <stdio.h>

#include "ckpt/namemap.h"

size_t sio_hf_names_hint(const fsdp_state *s, const ckpt_reader *r, const int *loaded, const int *sel, char *out,
                         size_t cap) {
    out[0] = '\0';
    if (!s->hf.has) return 0;
    size_t missing = 0, hits = 0, first = 0;
    char hf[512], ex[512] = "";
    for (size_t i = 0; i < s->n; i++) {
        if (loaded[i] || (sel && !sel[i])) continue;
        missing++;
        fsdp_err e;
        if (nmap_map(NMAP_TT_TO_HF, s->p[i].name, s->hf.n_heads, s->hf.n_kv_heads, hf, sizeof hf, NULL, &e) ||
            ckpt_find(r, hf) < 0)
            continue;
        if (!hits++) {
            first = i;
            snprintf(ex, sizeof ex, "%s", hf);
        }
    }
    if (!hits || hits * 2 < missing) return 0;
    snprintf(out, cap,
             "\n  %zu of the %zu parameters not restored are in the checkpoint under their Hugging Face names (%s "
             "holds %s): add `names: hf` to the load-ckpt stage (the per-key list is left out)",
             hits, missing, ex, s->p[first].name);
    return hits;
}
