#include "tok_utf8.h"

#include <string.h>

/* The second byte's range for a lead byte (Unicode Table 3-7), the others are 80..BF. */
static int second_ok(unsigned char lead, unsigned char b) {
    switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
    }
}

size_t tok_utf8_seq(const unsigned char *s, size_t n, size_t *bad) {
    unsigned char c = s[0];
    size_t need;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) need = 3;
    else if (c >= 0xF0 && c <= 0xF4) need = 4;
    else {
        *bad = 1;
        return 0;
    }
    size_t k = 1;
    if (k < n && second_ok(c, s[k])) {
        k++;
        while (k < need && k < n && s[k] >= 0x80 && s[k] <= 0xBF) k++;
    }
    if (k == need) return need;
    *bad = k;
    return 0;
}

size_t tok_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, bad;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = tok_utf8_seq(u + i, n - i, &bad);
        if (!k) break;
        i += k;
    }
    return i;
}

size_t tok_utf8_repair(const char *s, size_t n, char *out, size_t *replaced) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, o = 0, bad = 0, r = 0;
    while (i < n) {
        size_t k = u[i] < 0x80 ? 1 : tok_utf8_seq(u + i, n - i, &bad);
        if (k) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += bad;
            r++;
        }
    }
    *replaced = r;
    return o;
}

uint32_t tok_utf8_next(const char *s, size_t *i) {
    const unsigned char *u = (const unsigned char *)s + *i;
    uint32_t c = u[0];
    if (c < 0x80) {
        *i += 1;
        return c;
    }
    if (c < 0xE0) {
        *i += 2;
        return ((c & 0x1F) << 6) | (u[1] & 0x3F);
    }
    if (c < 0xF0) {
        *i += 3;
        return ((c & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    }
    *i += 4;
    return ((c & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
}

size_t tok_utf8_put(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Printable Latin-1 bytes stand for themselves; the others, in byte order, for U+0100, U+0101, ... */
static int printable(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

uint32_t tok_bytelevel_char(unsigned char b) {
    if (printable(b)) return b;
    uint32_t k = 0;
    for (unsigned x = 0; x < b; x++) k += !printable(x);
    return 0x100 + k;
}

int tok_bytelevel_byte(uint32_t cp) {
    if (cp < 0x100) return printable(cp) ? (int)cp : -1;
    if (cp >= 0x100 + 68) return -1;
    uint32_t k = cp - 0x100;
    for (unsigned x = 0; x < 256; x++)
        if (!printable(x) && k-- == 0) return (int)x;
    return -1;
}
