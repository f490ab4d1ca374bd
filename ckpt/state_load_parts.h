/* Loading a stacked parameter (ckpt/namemap.h "Stacks": torchtitan's grouped experts
 * layers.{i}.moe.experts.w{1,2,3} [E, ...]) from its E per-expert Hugging Face tensors: the facts of
 * the state's HF naming, which parts of each parameter a load has seen, and the strict report of the
 * missing ones, by name. */
#ifndef FSDP_CKPT_STATE_LOAD_PARTS_H
#define FSDP_CKPT_STATE_LOAD_PARTS_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/namemap.h"
#include "runtime/state.h"

/* The name-map facts of s (s->hf and s->hf_moe: heads, q/k norm width, expert naming; MLA when the state has
 * DeepSeek-V3's layers.0.attention.wkv_a.weight). */
void sio_hf_facts(const fsdp_state *s, nmap_hf *hf);

/* Parts seen per parameter (allocated on first use). */
typedef struct sio_parts {
    unsigned char **seen; /* [param][part] */
    size_t n;             /* parameters */
} sio_parts;

int sio_parts_init(sio_parts *pp, size_t nparams, fsdp_err *err);
void sio_parts_free(sio_parts *pp);
/* Marks part `part` of parameter i (of nparts parts) seen; *complete = 1 once every part has been. */
int sio_parts_mark(sio_parts *pp, size_t i, int64_t nparts, int part, int *complete, fsdp_err *err);
/* Appends to problems (cap bytes) the line of a stacked parameter p (index i) that was not restored:
 * the HF names of its missing parts (all of them when none was seen). 0 when p is not stacked. */
int sio_parts_report(const sio_parts *pp, size_t i, const state_param *p, const nmap_hf *hf, char *problems,
                     size_t cap);

/* Rows of part `part` (rows part_rows each) that fall in p's local rows: the flat rows [*lo, *hi) of
 * the part (empty when none) and the element offset *dst_off of the first in p's local array. */
void sio_part_local(const state_param *p, int part, int64_t *lo, int64_t *hi, size_t *dst_off);

#endif
