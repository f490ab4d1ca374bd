/* Parameter name maps (module prefix nmap_): torchtitan <-> Hugging Face Llama names, the q/k row
 * permutation between the two RoPE layouts, prefixes, and user rename rules with globs.
 *
 * torchtitan (<= v0.2.2, "classic")          Hugging Face Llama
 *   tok_embeddings.weight                    model.embed_tokens.weight
 *   layers.{i}.attention.wq.weight           model.layers.{i}.self_attn.q_proj.weight   (rows permuted)
 *   layers.{i}.attention.wk.weight           model.layers.{i}.self_attn.k_proj.weight   (rows permuted)
 *   layers.{i}.attention.wv.weight           model.layers.{i}.self_attn.v_proj.weight
 *   layers.{i}.attention.wo.weight           model.layers.{i}.self_attn.o_proj.weight
 *   layers.{i}.feed_forward.w1.weight        model.layers.{i}.mlp.gate_proj.weight
 *   layers.{i}.feed_forward.w2.weight        model.layers.{i}.mlp.down_proj.weight
 *   layers.{i}.feed_forward.w3.weight        model.layers.{i}.mlp.up_proj.weight
 *   layers.{i}.attention_norm.weight         model.layers.{i}.input_layernorm.weight
 *   layers.{i}.ffn_norm.weight               model.layers.{i}.post_attention_layernorm.weight
 *   layers.{i}.attention.wq.bias             model.layers.{i}.self_attn.q_proj.bias     (rows permuted, Qwen2)
 *   layers.{i}.attention.wk.bias             model.layers.{i}.self_attn.k_proj.bias     (rows permuted, Qwen2)
 *   layers.{i}.attention.wv.bias             model.layers.{i}.self_attn.v_proj.bias     (Qwen2)
 *   layers.{i}.attention.q_norm.weight       model.layers.{i}.self_attn.q_norm.weight   (permuted, Qwen3)
 *   layers.{i}.attention.k_norm.weight       model.layers.{i}.self_attn.k_norm.weight   (permuted, Qwen3)
 *   norm.weight                              model.norm.weight
 *   output.weight                            lm_head.weight
 *   (freqs_cis: dropped)                     model.layers.{i}.self_attn.rotary_emb.inv_freq,
 *                                            model.rotary_emb.inv_freq: dropped
 * torchtitan 2026 names (HEAD) are accepted as aliases of the classic ones:
 *   layers.{i}.attention.qkv_linear.w{q,k,v}.weight -> layers.{i}.attention.w{q,k,v}.weight
 *   lm_head.weight                                   -> output.weight
 *
 * RoPE layouts: torchtitan/Meta rotate interleaved pairs (x[2j], x[2j+1]) of each head, HF rotates
 * (x[j], x[j+hd/2]) ("rotate_half"). fsdp-run's kernels use the interleaved layout for every
 * architecture, so everything indexed by q's or k's position within a head moves with the rows:
 * wq and its bias (heads = n_heads), wk and its bias (heads = n_kv_heads), and the q_norm / k_norm
 * weights (one head: heads = 1; the norm's mean of squares over a head does not depend on the
 * order). Converting permutes rows inside each head of hd = rows/heads rows:
 *   to HF:   w.view(heads, hd/2, 2, cols).transpose(1, 2).reshape(rows, cols)
 *            HF row h*hd + t*hd/2 + j  <-  torchtitan row h*hd + 2j + t
 *   from HF: w.view(heads, 2, hd/2, cols).transpose(1, 2).reshape(rows, cols)   (the inverse)
 *
 * Globs (rename rules): a pattern is literal text with wildcards;
 *   `*`  matches a non-empty run of characters without '.', i.e. (part of) one dotted component;
 *   `**` matches a non-empty run of any characters, i.e. one or more dotted components.
 * The whole name must match. Wildcards are captures, numbered left to right; each `*` or `**` in
 * the replacement is replaced by the next capture in order (a replacement may use fewer
 * wildcards than its pattern, never more). When several splits are possible, earlier wildcards
 * take the shortest match. Rules are tried in order; the first matching rule wins. An empty
 * replacement drops the tensor.
 *   "layers.*.attention.qkv_linear.w*.weight" -> "layers.*.attention.w*.weight"
 *   "**.mlp.*"                               -> "**.mlp_gen.*"
 */
#ifndef FSDP_CKPT_NAMEMAP_H
#define FSDP_CKPT_NAMEMAP_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NMAP_NAME_MAX 1024 /* a buffer this big holds any mapped name of an input < 900 chars */
#define NMAP_MAX_CAPTURES 8

typedef enum nmap_dir { NMAP_TT_TO_HF = 0, NMAP_HF_TO_TT = 1 } nmap_dir;

/* Which rows need the RoPE permutation: Q (wq and its bias: n_heads heads), K (wk and its bias:
 * n_kv_heads heads), HEAD (q_norm / k_norm weights: one head of head_dim rows). */
typedef enum nmap_qk { NMAP_QK_NONE = 0, NMAP_QK_Q = 1, NMAP_QK_K = 2, NMAP_QK_HEAD = 3 } nmap_qk;

typedef struct nmap_info {
    int dropped; /* 1: the tensor has no counterpart on the other side; skip it (out is "") */
    nmap_qk qk;  /* rows need nmap_permute_rows in the same direction */
    int heads;   /* the head count for the permutation: n_heads (Q), n_kv_heads (K), 1 (HEAD); 0 if none */
    int layer;   /* layer index, -1 for global tensors */
    /* A stacked tensor (see "Stacks" below): HF -> torchtitan, the name is part `part` (the expert) of
     * the stacked torchtitan tensor out; torchtitan -> HF, out is "" and nmap_stack_part_name names
     * its parts. 0 for every other tensor. */
    int stacked, part;
} nmap_info;

/* ------------------------------------------------------------------ torchtitan <-> HF names */

/* Maps one parameter name in direction dir (see the table above) into out (cap bytes). TT->HF
 * accepts classic and 2026 torchtitan names; HF->TT produces classic names. n_heads and
 * n_kv_heads only fill info->heads (n_kv_heads <= 0 means n_heads). A name outside the table is
 * FSDP_E_INVALID with a message naming it. info may be NULL. The MoE names below map too (Qwen3-MoE
 * style), except a stacked tensor or a part of one: FSDP_E_INVALID (nmap_map_hf maps those). */
int nmap_map(nmap_dir dir, const char *name, int n_heads, int n_kv_heads, char *out, size_t cap,
             nmap_info *info, fsdp_err *err);

typedef enum nmap_tt_style { NMAP_TT_CLASSIC = 0, NMAP_TT_2026 = 1 } nmap_tt_style;

/* ------------------------------------------------------------------ mixtures of experts, MLA */

/* Mixtures of experts (torchtitan's GroupedExperts, its qwen3 / deepseek_v3 state_dict_adapter):
 *   torchtitan                               Hugging Face
 *   layers.{i}.moe.router.gate.weight  [E,d] model.layers.{i}.mlp.gate.weight                 (Mixtral:
 *                                            model.layers.{i}.block_sparse_moe.gate.weight)
 *   layers.{i}.moe.experts.w1        [E,F,d] model.layers.{i}.mlp.experts.{e}.gate_proj.weight [F,d]  (Mixtral:
 *                                            ....block_sparse_moe.experts.{e}.w1.weight)
 *   layers.{i}.moe.experts.w2        [E,d,F] ....mlp.experts.{e}.down_proj.weight [d,F]  (Mixtral: w2)
 *   layers.{i}.moe.experts.w3        [E,F,d] ....mlp.experts.{e}.up_proj.weight [F,d]    (Mixtral: w3)
 *   layers.{i}.moe.shared_experts.w{1,2,3}.weight   ....mlp.shared_experts.{gate,down,up}_proj.weight
 *   layers.{i}.moe.expert_bias                      ....mlp.gate.e_score_correction_bias
 * DeepSeek-V3's MLA attention (hf.mla; renamed only, no row permutation of any attention tensor):
 *   layers.{i}.attention.wq_a.weight       ....self_attn.q_a_proj.weight
 *   layers.{i}.attention.q_norm.weight     ....self_attn.q_a_layernorm.weight
 *   layers.{i}.attention.wq_b.weight       ....self_attn.q_b_proj.weight
 *   layers.{i}.attention.wq.weight         ....self_attn.q_proj.weight        (q_lora_rank 0)
 *   layers.{i}.attention.wkv_a.weight      ....self_attn.kv_a_proj_with_mqa.weight
 *   layers.{i}.attention.kv_norm.weight    ....self_attn.kv_a_layernorm.weight
 *   layers.{i}.attention.wkv_b.weight      ....self_attn.kv_b_proj.weight
 * HF -> torchtitan accepts both expert namings; torchtitan -> HF writes hf.mixtral's.
 *
 * Stacks: one torchtitan tensor of shape [P, s1, s2, ...] stacks P source tensors of shape [s1, s2, ...]
 * along a new dim 0 (the experts). Viewed as [P*s1, s2, ...], part k holds its rows [k*s1, (k+1)*s1):
 * a Shard(0) row range of the stack (or any range of that flat view) spans whole parts and pieces of
 * the parts at its ends; nmap_stack_piece walks it. */
typedef struct nmap_hf {
    int n_heads, n_kv_heads; /* the q/k permutation's heads (n_kv_heads <= 0: n_heads) */
    int qk_norm_full;        /* q_norm / k_norm span the whole projection (OLMoE): permuted as q / k rows */
    int mixtral;             /* experts and router named as Mixtral's (block_sparse_moe.*, w1/w3/w2) */
    int mla;                 /* DeepSeek-V3 MLA attention names (nothing permuted) */
} nmap_hf;

/* nmap_map with every fact of the model: the table at the top, the MoE and MLA names above and their
 * stacks (info->stacked; info must not be NULL when a name may be stacked). */
int nmap_map_hf(nmap_dir dir, const char *name, const nmap_hf *hf, char *out, size_t cap, nmap_info *info,
                fsdp_err *err);
/* The Hugging Face name of part `part` (expert) of the stacked torchtitan tensor tt (a name nmap_map_hf
 * reports stacked). */
int nmap_stack_part_name(const char *tt, int part, const nmap_hf *hf, char *out, size_t cap, fsdp_err *err);
/* For flat rows [r0, r1) of a stack of parts of part_rows rows each (r0 < r1, part_rows > 0): the
 * first piece, rows [*a, *b) of part *part; the next piece starts at flat row r0 + (*b - *a). */
void nmap_stack_piece(int64_t part_rows, int64_t r0, int64_t r1, int *part, int64_t *a, int64_t *b);

/* Rewrites a torchtitan name into the given naming style (classic <-> 2026 aliases; other names
 * are copied unchanged). *changed (may be NULL) tells whether it was rewritten. */
int nmap_tt_restyle(const char *name, nmap_tt_style style, char *out, size_t cap, int *changed,
                    fsdp_err *err);

/* ------------------------------------------------------------------ q/k row permutation */

/* Checks that rows splits into heads heads of an even head dim. */
int nmap_perm_check(int64_t rows, int heads, fsdp_err *err);
/* The source row that lands in destination row dst_row (rows/heads already checked). */
int64_t nmap_perm_src_row(nmap_dir dir, int64_t rows, int heads, int64_t dst_row);
/* dst[r] = src[nmap_perm_src_row(r)] for every row of a [rows, cols] matrix of elem-byte elements.
 * dst and src must not overlap. */
int nmap_permute_rows(nmap_dir dir, void *dst, const void *src, int64_t rows, int64_t cols, size_t elem,
                      int heads, fsdp_err *err);
/* For destination rows [r0, r1): the smallest source row range [*lo, *hi) that holds every needed
 * source row (empty when r0 == r1). A sharded loader reads just these rows. */
int nmap_perm_src_range(nmap_dir dir, int64_t rows, int heads, int64_t r0, int64_t r1, int64_t *lo,
                        int64_t *hi, fsdp_err *err);
/* Fills destination rows [r0, r1) (dst holds r1-r0 rows) from src, which holds source rows
 * [src_lo, src_hi) (e.g. from nmap_perm_src_range). A needed row outside src is an error. */
int nmap_permute_rows_part(nmap_dir dir, void *dst, int64_t r0, int64_t r1, const void *src, int64_t src_lo,
                           int64_t src_hi, int64_t rows, int64_t cols, size_t elem, int heads, fsdp_err *err);

/* ------------------------------------------------------------------ prefixes */

/* The rest of name after prefix, or NULL when name does not start with prefix. */
const char *nmap_strip_prefix(const char *name, const char *prefix);
/* out = prefix + name. */
int nmap_add_prefix(const char *prefix, const char *name, char *out, size_t cap, fsdp_err *err);

/* ------------------------------------------------------------------ globs and rename rules */

typedef struct nmap_span {
    size_t off, len; /* a capture: name[off, off+len) */
} nmap_span;

/* Matches name against pattern; returns the number of captures (>= 0) written to caps (room for
 * NMAP_MAX_CAPTURES), or -1 when it does not match. caps may be NULL. */
int nmap_glob_match(const char *pattern, const char *name, nmap_span *caps);
/* Checks a (pattern, replacement) pair: wildcard counts, no "***". */
int nmap_glob_check(const char *pattern, const char *replacement, fsdp_err *err);
/* Substitutes name's captures under pattern into replacement. FSDP_E_INVALID if no match. */
int nmap_glob_rewrite(const char *pattern, const char *replacement, const char *name, char *out, size_t cap,
                      fsdp_err *err);

typedef enum nmap_status { NMAP_KEPT = 0, NMAP_RENAMED = 1, NMAP_DROPPED = 2 } nmap_status;

typedef struct nmap_rules nmap_rules;

int nmap_rules_new(nmap_rules **out, fsdp_err *err);
void nmap_rules_free(nmap_rules *r);
/* Appends a rule; replacement NULL or "" drops matching tensors. Checked with nmap_glob_check. */
int nmap_rules_add(nmap_rules *r, const char *pattern, const char *replacement, fsdp_err *err);
/* Appends the torchtitan 2026 -> classic aliases (qkv_linear.w{q,k,v}, lm_head). */
int nmap_rules_add_tt_aliases(nmap_rules *r, fsdp_err *err);
/* Applies the first matching rule: out = renamed name (NMAP_RENAMED), a copy of name (NMAP_KEPT)
 * or "" (NMAP_DROPPED); *rule (may be NULL) = index of the rule, -1 when none matched. Counts a hit
 * for the rule. */
int nmap_rules_apply(nmap_rules *r, const char *name, char *out, size_t cap, nmap_status *status, int *rule,
                     fsdp_err *err);
size_t nmap_rules_count(const nmap_rules *r);
const char *nmap_rules_pattern(const nmap_rules *r, size_t i);
size_t nmap_rules_hits(const nmap_rules *r, size_t i);
void nmap_rules_reset_hits(nmap_rules *r);
/* FSDP_E_INVALID naming every rule that has matched no name since the last reset, else FSDP_OK. */
int nmap_rules_check_used(const nmap_rules *r, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
