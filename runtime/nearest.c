/* nearest (nearest.h): "did you mean" for unknown names. */
#include "runtime/nearest.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define NEAREST_MAX 255

static size_t min3(size_t a, size_t b, size_t c) {
    size_t m = a < b ? a : b;
    return m < c ? m : c;
}

size_t nearest_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > NEAREST_MAX || m > NEAREST_MAX) return SIZE_MAX;
    /* three rows of the dynamic programme: i-2, i-1, i */
    size_t rows[3][NEAREST_MAX + 1];
    for (size_t j = 0; j <= m; j++) rows[0][j] = j;
    for (size_t i = 1; i <= n; i++) {
        size_t *cur = rows[i % 3], *prev = rows[(i - 1) % 3], *pp = rows[(i + 1) % 3];
        cur[0] = i;
        for (size_t j = 1; j <= m; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            size_t cost = ca != cb;
            cur[j] = min3(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost);
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) && tolower((unsigned char)a[i - 2]) == cb &&
                pp[j - 2] + 1 < cur[j])
                cur[j] = pp[j - 2] + 1;
        }
    }
    return rows[n % 3][m];
}

/* 1 when the shorter of a and b (of at least 3 bytes) starts the other. */
static int is_prefix(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b), k = n < m ? n : m;
    return k >= 3 && !strncasecmp(a, b, k);
}

const char *nearest_name(const char *word, const char *known, char *out, size_t cap) {
    size_t best = SIZE_MAX;
    out[0] = '\0';
    if (!word || !*word || !known) return out;
    for (const char *p = known; *p;) {
        while (*p == ',' || *p == ' ') p++;
        size_t len = strcspn(p, ",");
        while (len && p[len - 1] == ' ') len--;
        char name[NEAREST_MAX + 1];
        if (len && len <= NEAREST_MAX) {
            memcpy(name, p, len);
            name[len] = '\0';
            size_t longer = len > strlen(word) ? len : strlen(word), limit = longer / 3 ? longer / 3 : 1;
            size_t d = nearest_distance(word, name);
            if (d > limit && is_prefix(word, name)) d = limit; /* warmup -> warmup_steps */
            if (longer >= 3 && d <= limit && d < best && d > 0) { /* 'x' for 'y' is no typo */
                best = d;
                snprintf(out, cap, "%s", name);
            }
        }
        p += strcspn(p, ",");
    }
    return out;
}

const char *nearest_hint(const char *word, const char *known, char *out, size_t cap) {
    char name[NEAREST_MAX + 1];
    out[0] = '\0';
    if (*nearest_name(word, known, name, sizeof name)) snprintf(out, cap, ": did you mean '%s'?", name);
    return out;
}
