/* Changing a parameter's dim 0 and removing a parameter (runtime/state.h). */
#include "runtime/state.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/shard.h"

int state_param_set_rows(fsdp_state *s, state_param *p, int64_t d0, const float *const *full, fsdp_err *err) {
    if (p->ndim < 1 || d0 < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: dim 0 of a %d-d parameter cannot become %lld", p->name, p->ndim,
                            (long long)d0);
    state_place was[STATE_ARRAYS];
    for (int a = 0; a < STATE_ARRAYS; a++) {
        was[a] = state_place_of(p, (state_array)a);
        state_param_release(s, p, (state_array)a);
    }
    p->shape[0] = d0;
    if (s->layout == STATE_FULL) {
        p->row0 = 0;
        p->rows = s->rank == 0 ? d0 : 0;
    } else {
        shard_rows(d0, s->world, s->rank, &p->row0, &p->rows);
    }
    const size_t off = (size_t)p->row0 * (size_t)p->row_numel;
    /* the data and the moments come back in their places with the new rows; gradients are dropped
     * (a trainer allocates them again) */
    for (int a = 0; a < STATE_ARRAYS; a++) {
        if (a == STATE_GRAD || (was[a] == STATE_ABSENT && a != STATE_DATA)) continue;
        state_place where = was[a] == STATE_ABSENT ? STATE_HOST : was[a];
        int rc = state_param_alloc(s, p, (state_array)a, where, 1, err);
        if (!rc && full[a] && p->rows) rc = state_param_put(s, p, (state_array)a, full[a] + off, err);
        if (rc) return fsdp_err_prefix(err, "resizing %s", p->name);
    }
    return 0;
}

int state_remove_param(fsdp_state *s, size_t i, fsdp_err *err) {
    if (i >= s->n) return fsdp_err_set(err, FSDP_E_INVALID, "parameter index %zu of %zu", i, s->n);
    for (int a = 0; a < STATE_ARRAYS; a++) state_param_release(s, &s->p[i], (state_array)a);
    free(s->p[i].name);
    memmove(s->p + i, s->p + i + 1, (s->n - i - 1) * sizeof *s->p);
    s->n--;
    /* the name index maps names to positions: rebuilt for the shifted ones */
    nidx_free(&s->names);
    nidx_init(&s->names);
    for (size_t k = 0; k < s->n; k++)
        if (nidx_add(&s->names, s->p[k].name, k, NULL) != 0)
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory indexing the parameters");
    return 0;
}
