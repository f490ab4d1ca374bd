/* Event-based libyaml reader building the recipe value tree. */
#include "pipeline/yaml_load.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "runtime/fileio.h"

#define YL_MAX_DEPTH 64

typedef struct {
    char *name;
    fsdp_value *v;
} anchor_t;

typedef struct {
    yaml_parser_t parser;
    const char *file;
    int line0, col0;
    anchor_t *anchors;
    size_t n_anchors, cap_anchors;
    fsdp_err *err;
} yl_state;

static int ln(const yl_state *s, yaml_mark_t m) { return (int)m.line + 1 + s->line0; }
static int cl(const yl_state *s, yaml_mark_t m) { return (int)m.column + 1 + (m.line == 0 ? s->col0 : 0); }

static int parse_error(yl_state *s) {
    const yaml_parser_t *p = &s->parser;
    yaml_mark_t m = p->problem_mark;
    if (p->context)
        return fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: YAML syntax error: %s %s (line %d)", s->file,
                            ln(s, m), cl(s, m), p->problem ? p->problem : "invalid YAML", p->context,
                            ln(s, p->context_mark));
    return fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: YAML syntax error: %s", s->file, ln(s, m), cl(s, m),
                        p->problem ? p->problem : "invalid YAML");
}

static int next(yl_state *s, yaml_event_t *ev) {
    if (!yaml_parser_parse(&s->parser, ev)) return parse_error(s);
    return 0;
}

static int add_anchor(yl_state *s, const char *name, const fsdp_value *v) {
    if (s->n_anchors == s->cap_anchors) {
        size_t cap = s->cap_anchors ? s->cap_anchors * 2 : 8;
        anchor_t *a = realloc(s->anchors, cap * sizeof *a);
        if (!a) return fsdp_err_set(s->err, FSDP_E_NOMEM, "out of memory");
        s->anchors = a;
        s->cap_anchors = cap;
    }
    fsdp_value *c = val_clone(v);
    char *n = strdup(name);
    if (!c || !n) {
        val_free(c);
        free(n);
        return fsdp_err_set(s->err, FSDP_E_NOMEM, "out of memory");
    }
    s->anchors[s->n_anchors].name = n;
    s->anchors[s->n_anchors].v = c;
    s->n_anchors++;
    return 0;
}

static int parse_node(yl_state *s, yaml_event_t *ev, int depth, fsdp_value **out);

/* ev is the first event of the node (already parsed); consumes the node entirely. */
static int parse_node(yl_state *s, yaml_event_t *ev, int depth, fsdp_value **out) {
    *out = NULL;
    if (depth > YL_MAX_DEPTH)
        return fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: nesting deeper than %d levels", s->file,
                            ln(s, ev->start_mark), cl(s, ev->start_mark), YL_MAX_DEPTH);
    int line = ln(s, ev->start_mark), col = cl(s, ev->start_mark);
    const char *anchor = NULL;
    fsdp_value *v = NULL;
    int rc = 0;
    switch (ev->type) {
    case YAML_ALIAS_EVENT: {
        const char *name = (const char *)ev->data.alias.anchor;
        for (size_t i = s->n_anchors; i-- > 0;) {
            if (!strcmp(s->anchors[i].name, name)) {
                v = val_clone(s->anchors[i].v);
                if (!v) return fsdp_err_set(s->err, FSDP_E_NOMEM, "out of memory");
                *out = v;
                return 0;
            }
        }
        return fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: unknown YAML alias '*%s'", s->file, line, col,
                            name);
    }
    case YAML_SCALAR_EVENT: {
        anchor = (const char *)ev->data.scalar.anchor;
        int quoted = ev->data.scalar.style == YAML_SINGLE_QUOTED_SCALAR_STYLE ||
                     ev->data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE ||
                     ev->data.scalar.style == YAML_LITERAL_SCALAR_STYLE ||
                     ev->data.scalar.style == YAML_FOLDED_SCALAR_STYLE;
        v = val_scalar((const char *)ev->data.scalar.value, quoted, s->file, line, col);
        if (!v) return fsdp_err_set(s->err, FSDP_E_NOMEM, "out of memory");
        break;
    }
    case YAML_SEQUENCE_START_EVENT: {
        anchor = (const char *)ev->data.sequence_start.anchor;
        v = val_new(FSDP_V_LIST, s->file, line, col);
        if (!v) return fsdp_err_set(s->err, FSDP_E_NOMEM, "out of memory");
        for (;;) {
            yaml_event_t e;
            if ((rc = next(s, &e))) break;
            if (e.type == YAML_SEQUENCE_END_EVENT) {
                yaml_event_delete(&e);
                break;
            }
            fsdp_value *item;
            rc = parse_node(s, &e, depth + 1, &item);
            yaml_event_delete(&e);
            if (rc) break;
            if (val_list_push(v, item)) {
                rc = fsdp_err_set(s->err, FSDP_E_NOMEM, "out of memory");
                break;
            }
        }
        break;
    }
    case YAML_MAPPING_START_EVENT: {
        anchor = (const char *)ev->data.mapping_start.anchor;
        v = val_new(FSDP_V_MAP, s->file, line, col);
        if (!v) return fsdp_err_set(s->err, FSDP_E_NOMEM, "out of memory");
        for (;;) {
            yaml_event_t ke;
            if ((rc = next(s, &ke))) break;
            if (ke.type == YAML_MAPPING_END_EVENT) {
                yaml_event_delete(&ke);
                break;
            }
            int kl = ln(s, ke.start_mark), kc = cl(s, ke.start_mark);
            if (ke.type != YAML_SCALAR_EVENT) {
                rc = fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: mapping keys must be plain scalars", s->file,
                                  kl, kc);
                yaml_event_delete(&ke);
                break;
            }
            char *key = strdup((const char *)ke.data.scalar.value);
            yaml_event_delete(&ke);
            if (!key) {
                rc = fsdp_err_set(s->err, FSDP_E_NOMEM, "out of memory");
                break;
            }
            if (val_map_find(v, key) >= 0) {
                rc = fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: duplicate key '%s'", s->file, kl, kc, key);
                free(key);
                break;
            }
            yaml_event_t ve;
            if ((rc = next(s, &ve))) {
                free(key);
                break;
            }
            fsdp_value *item;
            rc = parse_node(s, &ve, depth + 1, &item);
            yaml_event_delete(&ve);
            if (rc) {
                free(key);
                break;
            }
            if (val_map_set(v, key, item, kl, kc)) rc = fsdp_err_set(s->err, FSDP_E_NOMEM, "out of memory");
            free(key);
            if (rc) break;
        }
        break;
    }
    default:
        return fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: unexpected YAML event", s->file, line, col);
    }
    if (rc) {
        val_free(v);
        return rc;
    }
    if (anchor && (rc = add_anchor(s, anchor, v))) {
        val_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

static int load(yl_state *s, fsdp_value **out) {
    yaml_event_t ev;
    fsdp_value *root = NULL;
    int rc, docs = 0;
    for (;;) {
        if ((rc = next(s, &ev))) goto fail;
        yaml_event_type_t t = ev.type;
        if (t == YAML_STREAM_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        if (t == YAML_DOCUMENT_START_EVENT) {
            if (++docs > 1) {
                rc = fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: more than one YAML document ('---')", s->file,
                                  ln(s, ev.start_mark), cl(s, ev.start_mark));
                yaml_event_delete(&ev);
                goto fail;
            }
            yaml_event_delete(&ev);
            continue;
        }
        if (t == YAML_STREAM_START_EVENT || t == YAML_DOCUMENT_END_EVENT) {
            yaml_event_delete(&ev);
            continue;
        }
        rc = parse_node(s, &ev, 0, &root);
        yaml_event_delete(&ev);
        if (rc) goto fail;
    }
    if (!root) {
        root = val_new(FSDP_V_MAP, s->file, 1, 1);
        if (!root) return fsdp_err_set(s->err, FSDP_E_NOMEM, "out of memory");
    }
    *out = root;
    return 0;
fail:
    val_free(root);
    return rc;
}

static void cleanup(yl_state *s) {
    for (size_t i = 0; i < s->n_anchors; i++) {
        free(s->anchors[i].name);
        val_free(s->anchors[i].v);
    }
    free(s->anchors);
    yaml_parser_delete(&s->parser);
}

int yaml_load_string(const char *text, size_t len, const char *name, int line0, int col0, fsdp_value **out,
                     fsdp_err *err) {
    yl_state s = {0};
    s.file = name;
    s.line0 = line0;
    s.col0 = col0;
    s.err = err;
    *out = NULL;
    if (!yaml_parser_initialize(&s.parser)) return fsdp_err_set(err, FSDP_E_NOMEM, "libyaml init failed");
    yaml_parser_set_input_string(&s.parser, (const unsigned char *)text, len);
    int rc = load(&s, out);
    cleanup(&s);
    return rc;
}

int yaml_load_file(const char *path, fsdp_value **out, fsdp_err *err) {
    *out = NULL;
    int fd;
    mode_t mode = 0;
    int e = fio_open_raw(path, O_RDONLY, &fd, &mode); /* never blocks on a FIFO */
    if (e < 0) return fsdp_err_set(err, FSDP_E_IO, "recipe %s is a %s, not a regular file", path, fio_type_name(mode));
    FILE *f = e ? NULL : fdopen(fd, "rb");
    if (!e && !f) {
        e = errno;
        close(fd);
    }
    if (!f) return fsdp_err_set(err, FSDP_E_IO, "%s: cannot open recipe: %s", path, strerror(e));
    yl_state s = {0};
    s.file = path;
    s.err = err;
    if (!yaml_parser_initialize(&s.parser)) {
        fclose(f);
        return fsdp_err_set(err, FSDP_E_NOMEM, "libyaml init failed");
    }
    yaml_parser_set_input_file(&s.parser, f);
    int rc = load(&s, out);
    cleanup(&s);
    fclose(f);
    return rc;
}
