/* `fsdp-run ckpt convert` of mixture-of-experts checkpoints (ckpt/namemap.h "Stacks"): the name-map
 * facts of the source (heads, expert naming, q/k norm width, MLA), the grouping of per-expert HF
 * tensors into torchtitan's stacked tensors (written streamed by ckpt/ckpt_reshard_stack.c), and the
 * per-expert HF tensors of a stacked source tensor written into a safetensors file. */
#ifndef FSDP_CLI_CKPT_CONVERT_MOE_H
#define FSDP_CLI_CKPT_CONVERT_MOE_H

#include <stddef.h>

#include "ckpt/ckpt_reshard.h"
#include "ckpt/namemap.h"
#include "ckpt/reader.h"
#include "ckpt/safetensors.h"

/* hf's facts: --n-heads / --n-kv-heads (heads, kv_heads; 0: not given), then --hf-config (a directory
 * with config.json, or the file; NULL: none: model_type mixtral -> Mixtral expert names, olmoe / olmo2
 * -> q/k norms over the whole projection, deepseek_v3 / deepseek_v2 -> MLA; its head counts when none
 * were given), then --moe-names (mlp|mixtral; NULL: none), then what r's keys show (Mixtral or MLA
 * names; a q_norm as long as its q projection has rows). */
int ckcv_facts(ckpt_reader *r, int heads, int kv_heads, const char *hf_config, const char *moe_names, nmap_hf *hf,
               fsdp_err *err);

/* The stacked tensors being assembled from their parts (HF -> torchtitan). */
typedef struct ckcv_stack {
    char *tt;       /* the stacked tensor's torchtitan name, as mapped (before any added prefix) */
    size_t pos;     /* its position among the entries written */
    size_t *src;    /* reader index of part k; SIZE_MAX while none was seen */
    size_t n, cap;  /* parts: 1 + the highest seen */
} ckcv_stack;

typedef struct ckcv_stacks {
    ckcv_stack *g;
    size_t n, cap;
} ckcv_stacks;

/* Reader entry i is part `part` of stacked tensor tt: *pos = the position of tt's entry (new: *is_new
 * = 1, and *pos = new_pos). A part seen twice is an error naming both keys. */
int ckcv_stacks_add(ckcv_stacks *st, ckpt_reader *r, const char *tt, int part, size_t i, size_t new_pos, int *is_new,
                    size_t *pos, fsdp_err *err);
/* Every stack complete (parts 0 .. n-1, else an error naming the missing part's HF name and the stack),
 * of one shape and dtype (else an error naming both tensors and shapes): e[pos] becomes its stacked
 * entry (parts, nparts, ndim, shape). */
int ckcv_stacks_finish(ckcv_stacks *st, ckpt_reader *r, const nmap_hf *hf, ckrs_entry *e, fsdp_err *err);
void ckcv_stacks_free(ckcv_stacks *st);

/* Reader tensor i, a stack (shape [E, ...]), as E tensors of w under the HF names of its parts (prefixed
 * with add, may be NULL): declared by ckcv_st_declare (idx receives E indices), written by
 * ckcv_st_write, streamed when stream, else read whole through read (as dt). */
int ckcv_st_declare(ckpt_reader *r, size_t i, const char *tt, const nmap_hf *hf, const char *add, fsdp_dtype dt,
                    st_writer *w, size_t **idx, fsdp_err *err);
typedef int (*ckcv_read_fn)(void *user, size_t i, fsdp_dtype dt, void **buf, fsdp_err *err);
int ckcv_st_write(ckpt_reader *r, size_t i, fsdp_dtype dt, st_writer *w, const size_t *idx, int stream,
                  ckcv_read_fn read, void *user, const char *what, uint64_t *bytes, fsdp_err *err);

#endif
