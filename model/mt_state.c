/* The model table's view of the sharded state (model/mt_state.h). */
#include "model/mt_state.h"

#include <stdio.h>

#include "model/model_table.h"

int mt_state_check_values(const fsdp_state *s, const char *what, fsdp_err *err) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->p[i].no_value && !bad++) first = i;
    if (!bad) return 0;
    char names[1536] = "";
    size_t o = 0, shown = 0;
    for (size_t i = first; i < s->n && shown < 4 && o < sizeof names; i++) {
        if (!s->p[i].no_value) continue;
        o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", shown++ ? ", " : "", s->p[i].name);
    }
    char part[600] = "";
    long mi = s->model ? mt_find(s->model, s->p[first].name) : -1;
    if (mi >= 0) {
        char d[512];
        mt_part_describe(s->model, s->model->p[mi].part, d, sizeof d);
        snprintf(part, sizeof part, "; %s is in %s", s->p[first].name, d);
    }
    return fsdp_err_set(err, FSDP_E_INVALID,
                        "%s: %zu parameter%s hold%s no value: %s%s (declared with init none and never loaded, copied "
                        "or filled: add a load-ckpt or transform that sets %s, or give %s an init rule)%s",
                        what, bad, bad == 1 ? "" : "s", bad == 1 ? "s" : "", names, bad > shown ? ", ..." : "",
                        bad == 1 ? "it" : "them", bad == 1 ? "it" : "them", part);
}
