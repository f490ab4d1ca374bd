/* Recipe values as pickles (see value_pickle.h). */
#include "stages/value_pickle.h"

#include <stdint.h>

const char *vpkl_scalar_type(const fsdp_value *v) {
    int64_t i;
    double f;
    int b;
    if (fsdp_value_type(v) == FSDP_V_NULL) return "NoneType";
    if (fsdp_value_type(v) != FSDP_V_SCALAR || fsdp_value_quoted(v)) return "str";
    if (fsdp_value_bool(v, &b) == 0) return "bool";
    if (fsdp_value_int(v, &i) == 0) return "int";
    if (fsdp_value_float(v, &f) == 0) return "float";
    return "str";
}

static void scalar(pkl_w *w, const fsdp_value *v) {
    const char *t = vpkl_scalar_type(v);
    int64_t i = 0;
    double f = 0;
    int b = 0;
    if (t[0] == 'N') {
        pkl_w_none(w);
    } else if (t[0] == 'b' && fsdp_value_bool(v, &b) == 0) {
        pkl_w_bool(w, b);
    } else if (t[0] == 'i' && fsdp_value_int(v, &i) == 0) {
        pkl_w_int(w, i);
    } else if (t[0] == 'f' && fsdp_value_float(v, &f) == 0) {
        pkl_w_float(w, f);
    } else {
        pkl_w_str(w, fsdp_value_text(v));
    }
}

static int value_at(pkl_w *w, const fsdp_value *v, const char *what, int depth, fsdp_err *err) {
    if (depth > VPKL_MAX_DEPTH)
        return fsdp_err_at(err, FSDP_E_INVALID, v, "%s: nested deeper than %d levels", what, VPKL_MAX_DEPTH);
    fsdp_value_kind k = fsdp_value_type(v);
    if (k == FSDP_V_NULL || k == FSDP_V_SCALAR) {
        scalar(w, v);
        return 0;
    }
    int rc = 0;
    if (k == FSDP_V_LIST) pkl_w_empty_list(w);
    else pkl_w_empty_dict(w);
    if (!fsdp_value_size(v)) return 0;
    pkl_w_mark(w);
    for (size_t i = 0; i < fsdp_value_size(v) && !rc; i++) {
        if (k == FSDP_V_MAP) pkl_w_str(w, fsdp_value_key(v, i));
        rc = value_at(w, fsdp_value_item(v, i), what, depth + 1, err);
    }
    if (k == FSDP_V_LIST) pkl_w_appends(w);
    else pkl_w_setitems(w);
    return rc;
}

int vpkl_value(pkl_w *w, const fsdp_value *v, const char *what, fsdp_err *err) {
    int rc = value_at(w, v, what, 0, err);
    if (!rc && w->oom) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    return rc;
}

int vpkl_pickle(pkl_w *w, const fsdp_value *v, const char *what, fsdp_err *err) {
    pkl_w_proto(w, 2);
    int rc = vpkl_value(w, v, what, err);
    pkl_w_stop(w);
    if (!rc && w->oom) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    return rc;
}
