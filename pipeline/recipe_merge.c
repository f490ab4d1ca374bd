/* Merge of two recipe trees (an include into the including file): `stages` merge by id, `plugins`
 * concatenate without duplicates, everything else deep-merges. Every lookup goes through a hash
 * index, so a merge is linear in the size of both trees. */
#include <stdlib.h>
#include <string.h>

#include "pipeline/recipe.h"
#include "pipeline/strmap.h"

const char *recipe_stage_id(const fsdp_value *st) { return fsdp_value_text(fsdp_value_get(st, "id")); }

/* ids[k] owns a copy of the id that `index` maps to position k of the list (a merge may replace
 * the id value of a stage, so the index cannot borrow it). */
typedef struct {
    strmap index;
    char **ids;
    size_t n, cap;
} id_index;

static int id_add(id_index *x, const char *id, size_t pos) {
    if (x->n == x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 16;
        char **ids = realloc(x->ids, cap * sizeof *ids);
        if (!ids) return -1;
        x->ids = ids;
        x->cap = cap;
    }
    char *c = strdup(id);
    if (!c || strmap_put(&x->index, c, pos)) {
        free(c);
        return -1;
    }
    x->ids[x->n++] = c;
    return 0;
}

static void id_free(id_index *x) {
    strmap_free(&x->index);
    for (size_t i = 0; i < x->n; i++) free(x->ids[i]);
    free(x->ids);
}

/* Out of memory stops the merge; the items of src not merged yet are freed with it. */
static fsdp_value *merge_stages(fsdp_value *dst, fsdp_value *src) {
    if (!dst || dst->kind != FSDP_V_LIST || !src || src->kind != FSDP_V_LIST) return val_merge(dst, src);
    id_index x = {0};
    strmap_init(&x.index);
    int ok = 1;
    for (size_t j = 0; j < dst->n && ok; j++) {
        const char *id = recipe_stage_id(dst->items[j]);
        size_t seen;
        if (id && !strmap_get(&x.index, id, &seen)) ok = !id_add(&x, id, j);
    }
    for (size_t i = 0; i < src->n && ok; i++) {
        fsdp_value *s = src->items[i];
        src->items[i] = NULL;
        const char *id = recipe_stage_id(s);
        size_t j;
        if (id && strmap_get(&x.index, id, &j)) {
            dst->items[j] = val_merge(dst->items[j], s);
        } else {
            size_t pos = dst->n;
            if (id && id_add(&x, id, pos)) {
                val_free(s);
                break;
            }
            if (val_list_push(dst, s)) break;
        }
    }
    id_free(&x);
    val_free(src);
    return dst;
}

static fsdp_value *merge_plugins(fsdp_value *dst, fsdp_value *src) {
    if (!dst || dst->kind != FSDP_V_LIST || !src || src->kind != FSDP_V_LIST) return val_merge(dst, src);
    strmap seen;
    strmap_init(&seen);
    int ok = 1;
    for (size_t j = 0; j < dst->n && ok; j++) {
        const char *t = fsdp_value_text(dst->items[j]);
        if (t) ok = !strmap_put(&seen, t, j);
    }
    for (size_t i = 0; i < src->n && ok; i++) {
        const char *t = fsdp_value_text(src->items[i]);
        size_t j;
        if (t && strmap_get(&seen, t, &j)) continue;
        fsdp_value *s = src->items[i];
        src->items[i] = NULL;
        if (t && strmap_put(&seen, t, dst->n)) {
            val_free(s);
            break;
        }
        if (val_list_push(dst, s)) break;
    }
    strmap_free(&seen);
    val_free(src);
    return dst;
}

fsdp_value *recipe_merge(fsdp_value *dst, fsdp_value *src) {
    if (!dst) return src;
    for (size_t i = 0; i < src->n; i++) {
        const char *k = src->keys[i];
        fsdp_value *s = src->items[i];
        src->items[i] = NULL;
        long j = val_map_find(dst, k);
        if (j < 0) {
            if (val_map_set(dst, k, s, src->key_line[i], src->key_col[i])) break;
        } else if (!strcmp(k, "stages")) {
            dst->items[j] = merge_stages(dst->items[j], s);
        } else if (!strcmp(k, "plugins")) {
            dst->items[j] = merge_plugins(dst->items[j], s);
        } else {
            dst->items[j] = val_merge(dst->items[j], s);
        }
    }
    val_free(src);
    return dst;
}
