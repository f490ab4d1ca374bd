/* Stage registry and plugin loader (dlopen). */
#include "pipeline/registry.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pipeline/yaml_load.h"
#include "runtime/err_local.h"

struct fsdp_registry {
    const fsdp_stage_desc **descs;
    char **origins;
    size_t n, cap;
    void **handles;
    char **loaded; /* real paths of loaded plugins */
    size_t n_handles, cap_handles;
    const char *current_origin; /* set while a plugin registers */
};

fsdp_registry *registry_new(void) { return calloc(1, sizeof(fsdp_registry)); }

void registry_free(fsdp_registry *reg) {
    if (!reg) return;
    for (size_t i = 0; i < reg->n; i++) free(reg->origins[i]);
    free(reg->origins);
    free(reg->descs);
    for (size_t i = 0; i < reg->n_handles; i++) {
        dlclose(reg->handles[i]);
        free(reg->loaded[i]);
    }
    free(reg->handles);
    free(reg->loaded);
    free(reg);
}

size_t registry_count(const fsdp_registry *reg) { return reg->n; }
const fsdp_stage_desc *registry_at(const fsdp_registry *reg, size_t i) { return i < reg->n ? reg->descs[i] : NULL; }
const char *registry_origin(const fsdp_registry *reg, size_t i) { return i < reg->n ? reg->origins[i] : NULL; }

const fsdp_stage_desc *registry_find(const fsdp_registry *reg, const char *name) {
    for (size_t i = 0; i < reg->n; i++)
        if (!strcmp(reg->descs[i]->name, name)) return reg->descs[i];
    return NULL;
}

void registry_providers(const fsdp_registry *reg, const char *state, char *buf, size_t cap) {
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < reg->n && off < cap; i++) {
        const char *const *p = reg->descs[i]->provides;
        for (; p && *p; p++) {
            if (!strcmp(*p, state)) {
                off += (size_t)snprintf(buf + off, cap - off, "%s%s", off ? ", " : "", reg->descs[i]->name);
                break;
            }
        }
    }
}

static int valid_name(const char *s) {
    if (!s || !*s || strlen(s) > 64) return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_')) return 0;
    return 1;
}

/* A default is YAML text, as a recipe's value is (a string YAML reads otherwise, such as ** or a: b, is quoted:
 * "'**'"); it must have the parameter's type, and a string with choices one of them. */
static int check_default(const fsdp_stage_desc *d, const fsdp_param_spec *p, const char *origin, fsdp_err *err) {
    if (!p->dflt) return 0;
    fsdp_value *v;
    if (yaml_load_string(p->dflt, strlen(p->dflt), "default", 0, 0, &v, err))
        return fsdp_err_prefix(err, "stage '%s' (%s): parameter '%s': bad default (defaults are YAML text: quote a "
                               "string YAML reads otherwise, e.g. \"'**'\")", d->name, origin, p->name);
    const char *text = p->type == FSDP_T_STRING && v->kind == FSDP_V_SCALAR ? fsdp_value_text(v) : NULL;
    int listed = !p->choices || !text;
    for (const char *const *c = p->choices; c && *c && !listed; c++) listed = !strcmp(*c, text);
    if (!listed) {
        fsdp_err_set(err, FSDP_E_INVALID, "stage '%s' (%s): parameter '%s': default '%s' is not one of its choices",
                     d->name, origin, p->name, text);
        val_free(v);
        return FSDP_E_INVALID;
    }
    int ok = 1;
    int64_t i;
    double f;
    int b;
    switch (p->type) {
    case FSDP_T_STRING: ok = v->kind == FSDP_V_SCALAR; break;
    case FSDP_T_INT: ok = fsdp_value_int(v, &i) == 0; break;
    case FSDP_T_FLOAT: ok = fsdp_value_float(v, &f) == 0; break;
    case FSDP_T_BOOL: ok = fsdp_value_bool(v, &b) == 0; break;
    case FSDP_T_LIST: ok = v->kind == FSDP_V_LIST; break;
    case FSDP_T_MAP: ok = v->kind == FSDP_V_MAP; break;
    default: ok = 0;
    }
    val_free(v);
    if (!ok)
        return fsdp_err_set(err, FSDP_E_INVALID, "stage '%s' (%s): parameter '%s': default '%s' does not match its type",
                            d->name, origin, p->name, p->dflt);
    return 0;
}

int fsdp_registry_add(fsdp_registry *reg, const fsdp_stage_desc *d, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    if (!reg) return fsdp_err_set(err, FSDP_E_INVALID, "fsdp_registry_add called with a NULL registry");
    const char *origin = reg->current_origin ? reg->current_origin : "built-in";
    if (!d) return fsdp_err_set(err, FSDP_E_INVALID, "%s: fsdp_registry_add called with a NULL descriptor", origin);
    const unsigned major = d->abi_version & 0xffffu, minor = d->abi_version >> 16;
    const char *nm = major == FSDP_STAGE_ABI_MAJOR && d->name ? d->name : "?";
    if (major != FSDP_STAGE_ABI_MAJOR)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "%s: stage ABI mismatch: the stage was built for stage ABI version %u, this fsdp-run "
                            "provides version %u; rebuild it against this fsdp-run's include/fsdp/stage.h",
                            origin, major, FSDP_STAGE_ABI_MAJOR);
    if (minor > FSDP_STAGE_ABI_MINOR)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "%s: stage '%s' was built for stage ABI %u.%u, newer than this fsdp-run's %u.%u (it may "
                            "call what this fsdp-run does not have): upgrade fsdp-run, or rebuild the plugin against "
                            "this fsdp-run's include/fsdp/",
                            origin, d->name ? d->name : "?", major, minor, FSDP_STAGE_ABI_MAJOR, FSDP_STAGE_ABI_MINOR);
    if (d->struct_size != sizeof(fsdp_stage_desc))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "%s: stage '%s': descriptor size %u does not match this fsdp-run's %zu (ABI mismatch); "
                            "rebuild it against include/fsdp/stage.h",
                            origin, nm, d->struct_size, sizeof(fsdp_stage_desc));
    if (!valid_name(d->name))
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: stage name '%s' is invalid (use a-z, 0-9, '-', '_')", origin,
                            d->name ? d->name : "(null)");
    if (!d->run) return fsdp_err_set(err, FSDP_E_INVALID, "%s: stage '%s' has no run function", origin, d->name);
    for (size_t i = 0; i < reg->n; i++) {
        if (!strcmp(reg->descs[i]->name, d->name))
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: duplicate stage name '%s' (already registered by %s)", origin,
                                d->name, reg->origins[i]);
    }
    for (const fsdp_param_spec *p = d->params; p && p->name; p++) {
        if ((unsigned)p->type > FSDP_T_MAP)
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: stage '%s': parameter '%s' has an unknown type %d", origin,
                                d->name, p->name, (int)p->type);
        for (const fsdp_param_spec *q = d->params; q != p; q++)
            if (!strcmp(q->name, p->name))
                return fsdp_err_set(err, FSDP_E_INVALID, "%s: stage '%s': parameter '%s' is declared twice", origin,
                                    d->name, p->name);
        int rc = check_default(d, p, origin, err);
        if (rc) return rc;
    }
    if (reg->n == reg->cap) {
        size_t cap = reg->cap ? reg->cap * 2 : 16;
        const fsdp_stage_desc **nd = realloc(reg->descs, cap * sizeof *nd);
        if (!nd) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        reg->descs = nd;
        char **no = realloc(reg->origins, cap * sizeof *no);
        if (!no) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        reg->origins = no;
        reg->cap = cap;
    }
    char *o = strdup(origin);
    if (!o) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    reg->descs[reg->n] = d;
    reg->origins[reg->n] = o;
    reg->n++;
    return 0;
}

int registry_load_plugin(fsdp_registry *reg, const char *path, fsdp_err *err) {
    struct stat st;
    if (stat(path, &st) != 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "plugin %s: no such file (%s)", path, strerror(errno));
    char real[PATH_MAX];
    if (!realpath(path, real)) return fsdp_err_set(err, FSDP_E_INVALID, "plugin %s: %s", path, strerror(errno));
    for (size_t i = 0; i < reg->n_handles; i++)
        if (!strcmp(reg->loaded[i], real)) return 0; /* already loaded (chained recipes) */
    dlerror();
    void *h = dlopen(real, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        return fsdp_err_set(err, FSDP_E_INVALID, "plugin %s: cannot load: %s", path, e ? e : "unknown error");
    }
    dlerror();
    void *sym = dlsym(h, FSDP_STAGE_REGISTER_SYMBOL);
    if (!sym) {
        dlclose(h);
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "plugin %s: missing symbol '%s' (a plugin must export "
                            "`int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err)`)",
                            path, FSDP_STAGE_REGISTER_SYMBOL);
    }
    fsdp_stage_register_fn fn;
    memcpy(&fn, &sym, sizeof fn);
    size_t before = reg->n;
    reg->current_origin = path;
    fsdp_err e2;
    fsdp_err_clear(&e2);
    int rc = fn(reg, &e2);
    reg->current_origin = NULL;
    if (rc || e2.code) {
        /* roll back what this plugin registered, then unload it */
        for (size_t i = before; i < reg->n; i++) free(reg->origins[i]);
        reg->n = before;
        dlclose(h);
        if (!e2.msg[0]) snprintf(e2.msg, sizeof e2.msg, "registration failed (code %d)", rc);
        if (strstr(e2.msg, path) == e2.msg) return fsdp_err_set(err, FSDP_E_INVALID, "%s", e2.msg);
        return fsdp_err_set(err, FSDP_E_INVALID, "plugin %s: %s", path, e2.msg);
    }
    if (reg->n_handles == reg->cap_handles) {
        size_t cap = reg->cap_handles ? reg->cap_handles * 2 : 4;
        void **nh = realloc(reg->handles, cap * sizeof *nh);
        if (!nh) {
            dlclose(h);
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        }
        reg->handles = nh;
        char **nl = realloc(reg->loaded, cap * sizeof *nl);
        if (!nl) {
            dlclose(h);
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        }
        reg->loaded = nl;
        reg->cap_handles = cap;
    }
    reg->loaded[reg->n_handles] = strdup(real);
    reg->handles[reg->n_handles++] = h;
    return 0;
}
