/* Every layout, and finding and telling them apart (layouts/layout.h). */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/reader_union.h"

#include "ckpt/namemap.h"
#include "layouts/lay_rows.h"
#include "layouts/lay_stkey.h"

static const lay_layout *const all[] = {&lay_torchtitan_02, &lay_torchtitan_03, &lay_olmo_core_3, &lay_fms_113,
                                        &lay_megatron_fsdp_06, &lay_accelerate_115, &lay_olmo_06_st, &lay_olmo_06};

size_t lay_count(void) { return LAY_N(all); }
const lay_layout *lay_at(size_t i) { return i < LAY_N(all) ? all[i] : NULL; }

const lay_layout *lay_find(const char *name) {
    if (!name) return NULL;
    if (!strcmp(name, "torchtitan")) return &lay_torchtitan_02;
    for (size_t i = 0; i < LAY_N(all); i++)
        if (!strcmp(all[i]->name, name)) return all[i];
    return NULL;
}

const char *lay_names(char *buf, size_t cap) {
    size_t n = 0;
    if (cap) buf[0] = '\0';
    for (size_t i = 0; i < LAY_N(all) && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", all[i]->name);
    return buf;
}

/* The first key of r matching one of L's marks, or -1. */
static long first_mark(ckpt_reader *r, const lay_layout *L) {
    for (size_t i = 0; i < ckpt_count(r); i++)
        for (size_t m = 0; m < L->n_marks; m++)
            if (nmap_glob_match(L->marks[m], ckpt_entry_at(r, i)->name, NULL) >= 0) return (long)i;
    return -1;
}

int lay_matches(ckpt_reader *r, const lay_layout *L) { return first_mark(r, L) >= 0; }

int lay_detect(ckpt_reader *r, const lay_layout *fallback, const lay_layout **out, fsdp_err *err) {
    *out = NULL;
    char list[2048] = "";
    size_t n = 0, used = 0;
    for (size_t i = 0; i < LAY_N(all); i++) {
        long k = first_mark(r, all[i]);
        if (k < 0) continue;
        if (!n++) *out = all[i];
        used += (size_t)snprintf(list + used, used < sizeof list ? sizeof list - used : 0, "%s%s (key %s)",
                                 n > 1 ? ", " : "", all[i]->name, ckpt_entry_at(r, (size_t)k)->name);
        if (used >= sizeof list) used = sizeof list - 1;
    }
    if (n == 1) return 0;
    *out = NULL;
    if (n > 1)
        return fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s matches more than one layout: %s; name one with "
                            "layout: NAME", ckpt_reader_path(r), list);
    char names[512];
    if (fallback) {
        *out = fallback;
        return 0;
    }
    return fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s is in none of the layouts fsdp-run knows (%s); name one "
                        "with layout: NAME", ckpt_reader_path(r), lay_names(names, sizeof names));
}

int lay_option_known(const lay_layout *L, const char *name, size_t len) {
    for (const lay_add_option *o = L ? L->add_options : NULL; o && o->name; o++)
        if (strlen(o->name) == len && !strncmp(o->name, name, len)) return 1;
    return 0;
}

int lay_nest(const lay_layout *L, const char *key, int *nest, int *tail, unsigned *int_mask) {
    *nest = 0, *tail = 0, *int_mask = 0;
    if (!L || L->groups != LAY_GROUPS_INDEXED) return 0; /* torchtitan's flattened sections */
    char st[160], pg[160];
    snprintf(st, sizeof st, "%sstate.", L->optim);
    snprintf(pg, sizeof pg, "%sparam_groups.", L->optim);
    if (nmap_strip_prefix(key, st)) *nest = 2, *tail = 1;          /* (optim, "state", fqn, kind) */
    else if (nmap_strip_prefix(key, pg)) *nest = 3, *int_mask = 4u; /* (optim, "param_groups", i, option) */
    else if (L->model[0] && nmap_strip_prefix(key, L->model)) *nest = 1; /* (model, fqn) */
    return *nest > 0;
}

static int exists_in(const char *dir, const char *name) {
    char p[4400];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && (S_ISDIR(st.st_mode) || S_ISREG(st.st_mode));
}

int lay_container_open(const char *path, const lay_layout **L, ckpt_reader **r, fsdp_err *err) {
    *L = NULL, *r = NULL;
    for (size_t i = 0; i < LAY_N(all); i++) {
        const lay_layout *c = all[i];
        size_t have = 0;
        for (size_t k = 0; k < c->n_parts; k++) have += (size_t)exists_in(path, c->parts[k]);
        if (!c->n_parts || have != c->n_parts) continue;
        ckpt_reader *parts[8];
        const char *pre[8];
        int rc = 0;
        size_t n = 0;
        for (; n < c->n_parts && n < 8 && !rc; n++) {
            char p[4400];
            snprintf(p, sizeof p, "%s/%s", path, c->parts[n]);
            pre[n] = c->part_prefix ? c->part_prefix[n] : "";
            if ((rc = c->parts_stkey ? lay_stkey_open(p, &parts[n], err) : ckpt_open(p, CKPT_AUTO, &parts[n], err))) break;
        }
        if (rc) {
            for (size_t k = 0; k < n; k++) ckpt_close(parts[k]);
            fsdp_err_prefix(err, "layout %s", c->name);
            return -1;
        }
        if (ckpt_union_open(path, parts, pre, n, r, err)) return fsdp_err_prefix(err, "layout %s", c->name), -1;
        *L = c;
        return 1;
    }
    return 0;
}
