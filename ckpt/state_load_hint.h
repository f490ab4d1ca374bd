/* A strict load under fsdp-run's names from a checkpoint whose keys are Hugging Face names: one hint
 * ("add names: hf") instead of a line for every parameter and every key. */
#ifndef FSDP_CKPT_STATE_LOAD_HINT_H
#define FSDP_CKPT_STATE_LOAD_HINT_H

#include <stddef.h>

#include "ckpt/reader.h"
#include "runtime/state.h"

/* When most of the parameters of s not loaded (loaded[i] == 0; those sel[i] == 0 are not asked for, sel
 * may be NULL) are in r under their Hugging Face names: the hint into out and the number of them; else
 * 0 (out ""). Only for a state with a built-in trainer (s->hf.has). */
size_t sio_hf_names_hint(const fsdp_state *s, const ckpt_reader *r, const int *loaded, const int *sel, char *out,
                         size_t cap);

#endif
