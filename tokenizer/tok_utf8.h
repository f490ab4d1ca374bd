/* UTF-8 for the tokenizer: the length of the valid prefix, the repair of invalid text as Python's
 * `errors="replace"` and Rust's `from_utf8_lossy` do it (each maximal subpart of an ill-formed sequence, in
 * the Unicode standard's sense, becomes one U+FFFD), code points, and GPT-2's byte <-> char table. */
#ifndef FSDP_TOKENIZER_TOK_UTF8_H
#define FSDP_TOKENIZER_TOK_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The length of the well-formed sequence starting at s[0] (1-4), or 0 when s[0..n) does not start with
 * one; then *bad receives the length of its maximal subpart (1-3). */
size_t tok_utf8_seq(const unsigned char *s, size_t n, size_t *bad);
/* The length of the longest well-formed prefix of s[0..n). */
size_t tok_utf8_valid(const char *s, size_t n);
/* Writes the repaired text of s[0..n) to out (room for 3n bytes), returns its length; *replaced receives
 * the number of U+FFFD written for ill-formed subparts. */
size_t tok_utf8_repair(const char *s, size_t n, char *out, size_t *replaced);
/* The code point at s[*i] of valid UTF-8; advances *i past it. */
uint32_t tok_utf8_next(const char *s, size_t *i);
/* The length of the UTF-8 character whose first byte is b (1 for a stray byte). */
static inline size_t tok_utf8_len(unsigned char b) {
    return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : b < 0xF8 ? 4 : 1;
}
/* Writes cp as UTF-8 to out (room for 4), returns its length. */
size_t tok_utf8_put(uint32_t cp, char *out);

/* GPT-2's byte-level alphabet: the character byte b stands for (U+0021.. or U+0100..), and back. */
uint32_t tok_bytelevel_char(unsigned char b);
/* The byte of a byte-level character, -1 when cp is not one. */
int tok_bytelevel_byte(uint32_t cp);

#endif
