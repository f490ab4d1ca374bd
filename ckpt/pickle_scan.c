/* The memo entries a pickle fetches again (see pickle_scan.h): the opcodes walked by their argument
 * lengths, as pickletools.genops does. */
#include "ckpt/pickle_scan.h"

#include <stdlib.h>
#include <string.h>

static uint64_t le(const unsigned char *p, int n) {
    uint64_t x = 0;
    for (int i = n - 1; i >= 0; i--) x = (x << 8) | p[i];
    return x;
}

static int mark_get(pkl_gets *g, uint64_t i, size_t len) {
    if (i > len) return -1; /* the reader refuses it (each entry costs input bytes) */
    if (i >= g->n) {
        size_t n = g->n ? g->n : 1024;
        while (n <= i) n *= 2;
        uint64_t *b = realloc(g->bits, n / 8);
        if (!b) return -1;
        memset(b + g->n / 64, 0, (n - g->n) / 8);
        g->bits = b;
        g->n = n;
    }
    g->bits[i >> 6] |= 1ull << (i & 63);
    return 0;
}

/* The fetched entries before each word (pkl_gets_slot). */
static int count_before(pkl_gets *g) {
    size_t words = g->n / 64;
    g->before = malloc((words ? words : 1) * sizeof *g->before);
    if (!g->before) return -1;
    uint64_t at = 0;
    for (size_t w = 0; w < words; w++) {
        g->before[w] = at;
        at += (uint64_t)__builtin_popcountll(g->bits[w]);
    }
    g->fetched = (size_t)at;
    return 0;
}

/* Bytes of the argument of op at p (end: the input's end); -1 for an opcode the reader does not know or
 * an argument past the end. A length prefix (strings, LONG1/4) counts with its payload. */
static long long arg_len(unsigned char op, const unsigned char *p, const unsigned char *end) {
    size_t left = (size_t)(end - p);
    int hl = 0;
    switch (op) {
    case 0x80: case 'K': case 'q': case 'h': return 1;
    case 'M': return 2;
    case 'J': case 'r': case 'j': return 4;
    case 0x95: case 'G': return 8;
    case '.': case '(': case 'N': case 0x88: case 0x89: case ')': case ']': case '}': case 0x8f: case 't':
    case 'l': case 0x91: case 0x85: case 0x86: case 0x87: case 'a': case 'e': case 0x90: case 's': case 'u':
    case 'd': case 0x93: case 'R': case 0x81: case 0x92: case 'b': case 'Q': case '0': case '1': case '2':
    case 0x94: return 0;
    case 'c': {
        const unsigned char *a = memchr(p, '\n', left);
        const unsigned char *b = a ? memchr(a + 1, '\n', (size_t)(end - a - 1)) : NULL;
        return b ? (long long)(b + 1 - p) : -1;
    }
    case 0x8a: case 0x8c: case 'C': case 'U': hl = 1; break;
    case 0x8b: case 'X': case 'B': case 'T': hl = 4; break;
    case 0x8d: case 0x8e: case 0x96: hl = 8; break;
    default: return -1;
    }
    if (left < (size_t)hl) return -1;
    uint64_t n = le(p, hl);
    if (n > left - (size_t)hl) return -1;
    return (long long)(hl + n);
}

int pkl_scan_gets(const unsigned char *buf, size_t len, pkl_gets *g) {
    memset(g, 0, sizeof *g);
    const unsigned char *p = buf, *end = buf + len;
    while (p < end) {
        unsigned char op = *p++;
        long long a = arg_len(op, p, end);
        if (a < 0 || (size_t)a > (size_t)(end - p)) break;
        if ((op == 'h' || op == 'j') && mark_get(g, le(p, op == 'h' ? 1 : 4), len)) break;
        p += a;
        if (op == '.') {
            if (count_before(g) == 0) return 0;
            break;
        }
    }
    pkl_gets_free(g);
    return -1;
}

void pkl_gets_free(pkl_gets *g) {
    free(g->bits);
    free(g->before);
    memset(g, 0, sizeof *g);
}
