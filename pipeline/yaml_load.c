/* Event-based libyaml reader building the recipe value tree.
 *
 * Anchors are looked up through a hash table and point at the anchored node in the tree being
 * built (nodes are never changed or freed while the document is read), so an anchor costs no copy;
 * each alias copies its anchor's values, which are counted against the recipe's budget before the
 * copy is made: a "billion laughs" document stops at the first alias that would cross the bound. */
#include "pipeline/yaml_load.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "pipeline/strmap.h"
#include "runtime/fileio.h"

typedef struct {
    char *name;
    const fsdp_value *v; /* the anchored node, owned by the tree */
    size_t count;        /* values in its tree */
    int height;
} anchor_t;

typedef struct {
    yaml_parser_t parser;
    const char *file;
    const unsigned char *text; /* the input when it is a string (else the file is `file`) */
    size_t text_len;
    int line0, col0;
    size_t last_end; /* where the last event read ends (a byte offset) */
    size_t root_end; /* where the document's value ends */
    anchor_t *anchors;
    size_t n_anchors, cap_anchors;
    strmap anchor_index; /* name -> the latest anchor of that name */
    val_budget *budget;
    fsdp_err *err;
} yl_state;

/* What parse_node reports about the node it built. */
typedef struct {
    size_t count; /* values in the node's tree */
    int height;   /* 0 for a scalar */
} yl_info;

static int ln(const yl_state *s, yaml_mark_t m) { return (int)m.line + 1 + s->line0; }
static int cl(const yl_state *s, yaml_mark_t m) { return (int)m.column + 1 + (m.line == 0 ? s->col0 : 0); }

static int oom(yl_state *s) { return fsdp_err_set(s->err, FSDP_E_NOMEM, "out of memory"); }

static void count_marks(const unsigned char *p, size_t n, int *line, int *col) {
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\n') {
            ++*line;
            *col = 1;
        } else if ((p[i] & 0xC0) != 0x80) { /* a character's first byte */
            ++*col;
        }
    }
}

/* Line and column (1-based, in characters) of byte `off` of the input: a reader error (a control
 * character, bad UTF-8) has only its byte offset. A file is read again up to it. */
static void offset_mark(const yl_state *s, size_t off, int *line, int *col) {
    *line = 1;
    *col = 1;
    if (s->text) {
        count_marks(s->text, off < s->text_len ? off : s->text_len, line, col);
        return;
    }
    FILE *f = fopen(s->file, "rb");
    if (!f) return;
    unsigned char buf[16384];
    size_t got;
    for (size_t done = 0; done < off; done += got) {
        got = fread(buf, 1, off - done < sizeof buf ? off - done : sizeof buf, f);
        if (!got) break;
        count_marks(buf, got, line, col);
    }
    fclose(f);
}

/* libyaml's messages are fixed texts; nothing of the input is quoted (the input may not be a recipe
 * at all, e.g. a password file given by mistake). */
static int parse_error(yl_state *s) {
    const yaml_parser_t *p = &s->parser;
    yaml_mark_t m = p->problem_mark;
    if (p->error == YAML_READER_ERROR) {
        int line, col;
        offset_mark(s, p->problem_offset, &line, &col);
        return fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: not YAML text: %s (byte %zu)", s->file,
                            line + s->line0, col + (line == 1 ? s->col0 : 0), p->problem ? p->problem : "unreadable",
                            p->problem_offset);
    }
    if (p->context)
        return fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: YAML syntax error: %s %s (line %d)", s->file,
                            ln(s, m), cl(s, m), p->problem ? p->problem : "invalid YAML", p->context,
                            ln(s, p->context_mark));
    return fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: YAML syntax error: %s", s->file, ln(s, m), cl(s, m),
                        p->problem ? p->problem : "invalid YAML");
}

static int next(yl_state *s, yaml_event_t *ev) {
    if (!yaml_parser_parse(&s->parser, ev)) return parse_error(s);
    s->last_end = ev->end_mark.index;
    return 0;
}

/* Counts one value read from the file at (line, col). */
static int take_value(yl_state *s, int line, int col) {
    if (s->budget->values >= VAL_MAX_VALUES)
        return fsdp_err_set(s->err, FSDP_E_INVALID,
                            "%s:%d:%d: the recipe and its includes hold more than %d values", s->file, line, col,
                            VAL_MAX_VALUES);
    s->budget->values++;
    return 0;
}

static int add_anchor(yl_state *s, const char *name, const fsdp_value *v, const yl_info *info) {
    if (s->n_anchors == s->cap_anchors) {
        size_t cap = s->cap_anchors ? s->cap_anchors * 2 : 8;
        anchor_t *a = realloc(s->anchors, cap * sizeof *a);
        if (!a) return oom(s);
        s->anchors = a;
        s->cap_anchors = cap;
    }
    char *n = strdup(name);
    if (!n) return oom(s);
    anchor_t *a = &s->anchors[s->n_anchors];
    a->name = n;
    a->v = v;
    a->count = info->count;
    a->height = info->height;
    if (strmap_put(&s->anchor_index, n, s->n_anchors)) {
        free(n);
        return oom(s);
    }
    s->n_anchors++;
    return 0;
}

static int parse_node(yl_state *s, yaml_event_t *ev, int depth, fsdp_value **out, yl_info *info);

static int parse_alias(yl_state *s, yaml_event_t *ev, int depth, fsdp_value **out, yl_info *info) {
    int line = ln(s, ev->start_mark), col = cl(s, ev->start_mark);
    const char *name = (const char *)ev->data.alias.anchor;
    size_t i;
    if (!strmap_get(&s->anchor_index, name, &i))
        return fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: unknown YAML alias '*%s'", s->file, line, col,
                            val_text_is_word(name) ? name : "...");
    const anchor_t *a = &s->anchors[i];
    if (depth + a->height > YAML_MAX_DEPTH)
        return fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: nesting deeper than %d levels (through YAML alias '*%s')",
                            s->file, line, col, YAML_MAX_DEPTH, name);
    if (a->count > VAL_MAX_COPIES - s->budget->copies)
        return fsdp_err_set(s->err, FSDP_E_INVALID,
                            "%s:%d:%d: the recipe expands to more than %d values (YAML aliases: '*%s' copies %zu values "
                            "at each use, %zu copied before it)",
                            s->file, line, col, VAL_MAX_COPIES, name, a->count, s->budget->copies);
    fsdp_value *v = val_clone(a->v);
    if (!v) return oom(s);
    s->budget->copies += a->count;
    info->count = a->count;
    info->height = a->height;
    *out = v;
    return 0;
}

static int parse_seq(yl_state *s, fsdp_value *v, int depth, yl_info *info) {
    for (;;) {
        yaml_event_t e;
        int rc;
        if ((rc = next(s, &e))) return rc;
        if (e.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&e);
            return 0;
        }
        fsdp_value *item;
        yl_info ii;
        rc = parse_node(s, &e, depth + 1, &item, &ii);
        yaml_event_delete(&e);
        if (rc) return rc;
        if (val_list_push(v, item)) return oom(s);
        info->count += ii.count;
        if (ii.height + 1 > info->height) info->height = ii.height + 1;
    }
}

/* One `key: value` entry of a mapping; *end is set at the mapping's end instead. */
static int parse_entry(yl_state *s, fsdp_value *v, int depth, yl_info *info, int *end) {
    yaml_event_t ke;
    int rc;
    if ((rc = next(s, &ke))) return rc;
    if (ke.type == YAML_MAPPING_END_EVENT) {
        yaml_event_delete(&ke);
        *end = 1;
        return 0;
    }
    int kl = ln(s, ke.start_mark), kc = cl(s, ke.start_mark);
    if (ke.type != YAML_SCALAR_EVENT) {
        yaml_event_delete(&ke);
        return fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: mapping keys must be plain scalars", s->file, kl, kc);
    }
    char *key = strdup((const char *)ke.data.scalar.value);
    yaml_event_delete(&ke);
    if (!key) return oom(s);
    long first = val_map_find(v, key);
    if (first >= 0) {
        /* the file may not be a recipe: only a plain word is quoted */
        rc = fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: duplicate key %s%s%s(first at line %d column %d)", s->file,
                          kl, kc, val_text_is_word(key) ? "'" : "", val_text_is_word(key) ? key : "",
                          val_text_is_word(key) ? "' " : "", v->key_line[first], v->key_col[first]);
        free(key);
        return rc;
    }
    yaml_event_t ve;
    if ((rc = next(s, &ve))) {
        free(key);
        return rc;
    }
    fsdp_value *item;
    yl_info ii;
    rc = parse_node(s, &ve, depth + 1, &item, &ii);
    yaml_event_delete(&ve);
    if (!rc && val_map_set(v, key, item, kl, kc)) rc = oom(s);
    free(key);
    if (rc) return rc;
    info->count += ii.count;
    if (ii.height + 1 > info->height) info->height = ii.height + 1;
    return 0;
}

/* ev is the first event of the node (already parsed); consumes the node entirely. */
static int parse_node(yl_state *s, yaml_event_t *ev, int depth, fsdp_value **out, yl_info *info) {
    *out = NULL;
    int line = ln(s, ev->start_mark), col = cl(s, ev->start_mark);
    if (depth > YAML_MAX_DEPTH)
        return fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: nesting deeper than %d levels", s->file, line, col,
                            YAML_MAX_DEPTH);
    if (ev->type == YAML_ALIAS_EVENT) return parse_alias(s, ev, depth, out, info);
    const char *anchor = NULL;
    fsdp_value *v = NULL;
    int rc = take_value(s, line, col);
    if (rc) return rc;
    info->count = 1;
    info->height = 0;
    switch (ev->type) {
    case YAML_SCALAR_EVENT: {
        anchor = (const char *)ev->data.scalar.anchor;
        yaml_scalar_style_t st = ev->data.scalar.style;
        int quoted = st == YAML_SINGLE_QUOTED_SCALAR_STYLE || st == YAML_DOUBLE_QUOTED_SCALAR_STYLE ||
                     st == YAML_LITERAL_SCALAR_STYLE || st == YAML_FOLDED_SCALAR_STYLE;
        v = val_scalar((const char *)ev->data.scalar.value, quoted, s->file, line, col);
        if (!v) return oom(s);
        break;
    }
    case YAML_SEQUENCE_START_EVENT:
        anchor = (const char *)ev->data.sequence_start.anchor;
        v = val_new(FSDP_V_LIST, s->file, line, col);
        if (!v) return oom(s);
        rc = parse_seq(s, v, depth, info);
        break;
    case YAML_MAPPING_START_EVENT: {
        anchor = (const char *)ev->data.mapping_start.anchor;
        v = val_new(FSDP_V_MAP, s->file, line, col);
        if (!v) return oom(s);
        int end = 0;
        while (!rc && !end) rc = parse_entry(s, v, depth, info, &end);
        break;
    }
    default:
        return fsdp_err_set(s->err, FSDP_E_INVALID, "%s:%d:%d: unexpected YAML event", s->file, line, col);
    }
    if (!rc && anchor) rc = add_anchor(s, anchor, v, info);
    if (rc) {
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
        yl_info info;
        rc = parse_node(s, &ev, 0, &root, &info);
        yaml_event_delete(&ev);
        if (rc) goto fail;
        s->root_end = s->last_end;
    }
    if (!root) {
        root = val_new(FSDP_V_MAP, s->file, 1, 1);
        if (!root) return oom(s);
    }
    *out = root;
    return 0;
fail:
    val_free(root);
    return rc;
}

static void cleanup(yl_state *s) {
    for (size_t i = 0; i < s->n_anchors; i++) free(s->anchors[i].name);
    free(s->anchors);
    strmap_free(&s->anchor_index);
    yaml_parser_delete(&s->parser);
}

static int load_string(const char *text, size_t len, const char *name, int line0, int col0, fsdp_value **out,
                       size_t *end, fsdp_err *err) {
    val_budget budget = {0, 0};
    yl_state s = {0};
    s.file = name;
    s.text = (const unsigned char *)text;
    s.text_len = len;
    s.line0 = line0;
    s.col0 = col0;
    s.err = err;
    s.budget = &budget;
    strmap_init(&s.anchor_index);
    *out = NULL;
    if (!yaml_parser_initialize(&s.parser)) return fsdp_err_set(err, FSDP_E_NOMEM, "libyaml init failed");
    yaml_parser_set_input_string(&s.parser, (const unsigned char *)text, len);
    int rc = load(&s, out);
    cleanup(&s);
    if (end) *end = s.root_end;
    return rc;
}

int yaml_load_string(const char *text, size_t len, const char *name, int line0, int col0, fsdp_value **out,
                     fsdp_err *err) {
    return load_string(text, len, name, line0, col0, out, NULL, err);
}

int yaml_load_value(const char *text, size_t len, const char *name, int col0, fsdp_value **out, size_t *end,
                    fsdp_err *err) {
    return load_string(text, len, name, 0, col0, out, end, err);
}

int yaml_load_file(const char *path, val_budget *budget, fsdp_value **out, fsdp_err *err) {
    *out = NULL;
    val_budget local = {0, 0};
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
    s.budget = budget ? budget : &local;
    strmap_init(&s.anchor_index);
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
