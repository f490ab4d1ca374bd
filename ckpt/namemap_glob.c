/* Glob patterns with captures (`*` inside one dotted component, `**` across components) and
 * ordered rename rules built on them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/namemap.h"

enum { T_LIT, T_STAR, T_DSTAR };

typedef struct {
    int kind;
    size_t off, len; /* literal text in the pattern */
} tok;

#define MAX_TOKS (2 * NMAP_MAX_CAPTURES + 1)

/* Splits pattern into tokens; -1 on "***" runs or too many wildcards. Returns the token count. */
static int tokenize(const char *p, tok *t, int *nwild) {
    int n = 0, w = 0;
    size_t i = 0, len = strlen(p);
    while (i < len) {
        if (p[i] == '*') {
            size_t run = 0;
            while (p[i + run] == '*') run++;
            if (run > 2 || w == NMAP_MAX_CAPTURES || n == MAX_TOKS) return -1;
            t[n++] = (tok){run == 2 ? T_DSTAR : T_STAR, i, run};
            w++;
            i += run;
        } else {
            size_t s = i;
            while (i < len && p[i] != '*') i++;
            if (n == MAX_TOKS) return -1;
            t[n++] = (tok){T_LIT, s, i - s};
        }
    }
    *nwild = w;
    return n;
}

typedef struct {
    const char *pat, *name;
    size_t nlen;
    const tok *t;
    int nt;
    unsigned char *fail; /* (nt+1) x (nlen+1) memo of proven failures */
    nmap_span *caps;
} matcher;

static int match_from(matcher *m, int k, size_t pos, int cap) {
    unsigned char *f = &m->fail[(size_t)k * (m->nlen + 1) + pos];
    if (*f) return 0;
    if (k == m->nt) return pos == m->nlen;
    const tok *t = &m->t[k];
    if (t->kind == T_LIT) {
        if (m->nlen - pos >= t->len && !memcmp(m->name + pos, m->pat + t->off, t->len) &&
            match_from(m, k + 1, pos + t->len, cap))
            return 1;
    } else {
        for (size_t e = pos + 1; e <= m->nlen; e++) {
            if (t->kind == T_STAR && m->name[e - 1] == '.') break;
            m->caps[cap] = (nmap_span){pos, e - pos};
            if (match_from(m, k + 1, e, cap + 1)) return 1;
        }
    }
    *f = 1;
    return 0;
}

int nmap_glob_match(const char *pattern, const char *name, nmap_span *caps) {
    if (!pattern || !name) return -1;
    tok t[MAX_TOKS];
    int nw, nt = tokenize(pattern, t, &nw);
    if (nt < 0) return -1;
    nmap_span local[NMAP_MAX_CAPTURES];
    matcher m = {pattern, name, strlen(name), t, nt, NULL, caps ? caps : local};
    unsigned char small[4096];
    size_t need = (size_t)(nt + 1) * (m.nlen + 1);
    if (m.nlen >= SIZE_MAX / (MAX_TOKS + 1)) return -1;
    m.fail = need <= sizeof small ? small : (unsigned char *)malloc(need);
    if (!m.fail) return -1; /* out of memory: reported as no match */
    memset(m.fail, 0, need);
    int ok = match_from(&m, 0, 0, 0);
    if (m.fail != small) free(m.fail);
    return ok ? nw : -1;
}

static int count_wild(const char *s) {
    tok t[MAX_TOKS];
    int nw;
    return tokenize(s, t, &nw) < 0 ? -1 : nw;
}

int nmap_glob_check(const char *pattern, const char *replacement, fsdp_err *err) {
    if (!pattern || !*pattern) return fsdp_err_set(err, FSDP_E_INVALID, "rename rule: empty pattern");
    int pw = count_wild(pattern);
    if (pw < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "rename rule '%s': use `*` or `**` (at most %d wildcards)", pattern,
                            NMAP_MAX_CAPTURES);
    int rw = replacement ? count_wild(replacement) : 0;
    if (rw < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "rename rule '%s' -> '%s': bad wildcards in the replacement", pattern,
                            replacement);
    if (rw > pw)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "rename rule '%s' -> '%s': the replacement has %d wildcards but the pattern only %d",
                            pattern, replacement, rw, pw);
    return FSDP_OK;
}

int nmap_glob_rewrite(const char *pattern, const char *replacement, const char *name, char *out, size_t cap,
                      fsdp_err *err) {
    int rc = nmap_glob_check(pattern, replacement, err);
    if (rc) return rc;
    if (!out || !cap) return fsdp_err_set(err, FSDP_E_INVALID, "nmap_glob_rewrite: no output buffer");
    nmap_span caps[NMAP_MAX_CAPTURES];
    if (nmap_glob_match(pattern, name, caps) < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "'%s' does not match '%s'", name, pattern);
    size_t o = 0;
    int ci = 0;
    for (const char *r = replacement ? replacement : ""; *r;) {
        const char *piece;
        size_t n;
        if (*r == '*') {
            size_t run = r[1] == '*' ? 2 : 1;
            piece = name + caps[ci].off;
            n = caps[ci].len;
            ci++;
            r += run;
        } else {
            piece = r;
            n = strcspn(r, "*");
            r += n;
        }
        if (n >= cap - o) {
            out[0] = '\0';
            return fsdp_err_set(err, FSDP_E_INVALID, "renaming '%s' by '%s': result longer than %zu bytes", name,
                                replacement, cap - 1);
        }
        memcpy(out + o, piece, n);
        o += n;
    }
    out[o] = '\0';
    return FSDP_OK;
}

typedef struct {
    char *pat, *rep; /* rep NULL: drop */
    size_t hits;
} rule;

struct nmap_rules {
    rule *r;
    size_t n, cap;
};

int nmap_rules_new(nmap_rules **out, fsdp_err *err) {
    *out = (nmap_rules *)calloc(1, sizeof **out);
    return *out ? FSDP_OK : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for rename rules");
}

void nmap_rules_free(nmap_rules *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n; i++) {
        free(r->r[i].pat);
        free(r->r[i].rep);
    }
    free(r->r);
    free(r);
}

int nmap_rules_add(nmap_rules *r, const char *pattern, const char *replacement, fsdp_err *err) {
    if (replacement && !*replacement) replacement = NULL;
    int rc = nmap_glob_check(pattern, replacement, err);
    if (rc) return rc;
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 8;
        rule *nr = (rule *)realloc(r->r, cap * sizeof *nr);
        if (!nr) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for rename rules");
        r->r = nr;
        r->cap = cap;
    }
    rule *x = &r->r[r->n];
    x->pat = strdup(pattern);
    x->rep = replacement ? strdup(replacement) : NULL;
    x->hits = 0;
    if (!x->pat || (replacement && !x->rep)) {
        free(x->pat);
        free(x->rep);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for rename rules");
    }
    r->n++;
    return FSDP_OK;
}

int nmap_rules_apply(nmap_rules *r, const char *name, char *out, size_t cap, nmap_status *status, int *rule_idx,
                     fsdp_err *err) {
    if (status) *status = NMAP_KEPT;
    if (rule_idx) *rule_idx = -1;
    if (!name || !out || !cap) return fsdp_err_set(err, FSDP_E_INVALID, "nmap_rules_apply: NULL argument");
    for (size_t i = 0; r && i < r->n; i++) {
        if (nmap_glob_match(r->r[i].pat, name, NULL) < 0) continue;
        r->r[i].hits++;
        if (rule_idx) *rule_idx = (int)i;
        if (!r->r[i].rep) {
            out[0] = '\0';
            if (status) *status = NMAP_DROPPED;
            return FSDP_OK;
        }
        int rc = nmap_glob_rewrite(r->r[i].pat, r->r[i].rep, name, out, cap, err);
        if (!rc && status) *status = NMAP_RENAMED;
        return rc;
    }
    size_t n = strlen(name);
    if (n >= cap) return fsdp_err_set(err, FSDP_E_INVALID, "name '%s' longer than %zu bytes", name, cap - 1);
    memcpy(out, name, n + 1);
    return FSDP_OK;
}

size_t nmap_rules_count(const nmap_rules *r) { return r ? r->n : 0; }
const char *nmap_rules_pattern(const nmap_rules *r, size_t i) { return r && i < r->n ? r->r[i].pat : NULL; }
size_t nmap_rules_hits(const nmap_rules *r, size_t i) { return r && i < r->n ? r->r[i].hits : 0; }

void nmap_rules_reset_hits(nmap_rules *r) {
    for (size_t i = 0; r && i < r->n; i++) r->r[i].hits = 0;
}

int nmap_rules_check_used(const nmap_rules *r, fsdp_err *err) {
    char msg[FSDP_ERR_MSG_MAX - 64];
    size_t o = 0;
    int unused = 0;
    msg[0] = '\0';
    for (size_t i = 0; r && i < r->n; i++) {
        if (r->r[i].hits) continue;
        unused++;
        if (o < sizeof msg) {
            int k = snprintf(msg + o, sizeof msg - o, "%s'%s' (rule %zu)", unused > 1 ? ", " : "", r->r[i].pat, i + 1);
            if (k > 0) o += (size_t)k;
        }
    }
    if (!unused) return FSDP_OK;
    return fsdp_err_set(err, FSDP_E_INVALID, "%d rename rule%s matched no tensor: %s", unused, unused > 1 ? "s" : "",
                        msg);
}
