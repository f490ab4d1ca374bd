/* Internal to the name map (ckpt/namemap.c): the per-layer names of mixtures of experts and of
 * DeepSeek-V3's MLA attention (ckpt/namemap.h documents them), and the stacked experts. */
#ifndef FSDP_CKPT_NAMEMAP_MOE_H
#define FSDP_CKPT_NAMEMAP_MOE_H

#include <stddef.h>

#include "ckpt/namemap.h"

/* The per-layer suffix rest (after "layers.{i}." / "model.layers.{i}.") mapped in direction dir into
 * suffix (cap bytes). mla_only: only the MLA attention names (tried before the Llama table when
 * hf->mla, whose names they share). Returns 1 when rest is one of these names (*qk: its permutation,
 * always none; *stacked / *part as nmap_info's: HF -> TT, the expert of a stacked tensor; TT -> HF,
 * suffix is "" for a stacked tensor), 0 when it is not, or -1 when suffix is too small. */
int nmap_moe_rest(nmap_dir dir, const char *rest, const nmap_hf *hf, int mla_only, char *suffix, size_t cap,
                  int *stacked, int *part);

#endif
