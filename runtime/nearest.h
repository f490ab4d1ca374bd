/* The nearest known name to an unknown one, for "did you mean ...?" hints in error messages. */
#ifndef FSDP_RUNTIME_NEAREST_H
#define FSDP_RUNTIME_NEAREST_H

#include <stddef.h>

/* Edit distance of a and b (optimal string alignment: insertions, deletions, substitutions and
 * transpositions of neighbours, each 1; letters compared without case). SIZE_MAX when either is
 * longer than 255 bytes. */
size_t nearest_distance(const char *a, const char *b);

/* The name of `known` (a list of names separated by ", " or ",", as the messages print them) nearest
 * to word, into out: close enough to be a likely typo (a distance of at most a third of the longer
 * name, at least 1; or word is a prefix of the name or the name a prefix of word, e.g. a missing
 * plural s or suffix; never for names of one or two letters). "" when none is. Returns out. */
const char *nearest_name(const char *word, const char *known, char *out, size_t cap);

/* ": did you mean 'NAME'?" for the nearest name (nearest_name), else "". Returns out. */
const char *nearest_hint(const char *word, const char *known, char *out, size_t cap);

#endif
