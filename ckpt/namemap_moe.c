/* The MoE and MLA per-layer names (namemap_moe.h), the names of a stack's parts and the walk over
 * a stack's flat rows (namemap.h). */
#include "ckpt/namemap_moe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *tt, *hf;
} pair;

/* DeepSeek-V3's MLA attention (torchtitan deepseek_v3 state_dict_adapter) */
static const pair MLA[] = {
    {"attention.wq_a.weight", "self_attn.q_a_proj.weight"},
    {"attention.q_norm.weight", "self_attn.q_a_layernorm.weight"},
    {"attention.wq_b.weight", "self_attn.q_b_proj.weight"},
    {"attention.wq.weight", "self_attn.q_proj.weight"},
    {"attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight"},
    {"attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight"},
    {"attention.wkv_b.weight", "self_attn.kv_b_proj.weight"},
};

/* Names of the MoE block outside the stacked experts; the router has two HF names (the second
 * Mixtral's), the others are DeepSeek-V3's. */
static const pair MOE[] = {
    {"moe.router.gate.weight", "mlp.gate.weight"},
    {"moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
    {"moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
    {"moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
    {"moe.expert_bias", "mlp.gate.e_score_correction_bias"},
};
static const char *const ROUTER_MIXTRAL = "block_sparse_moe.gate.weight";

/* The stacked experts: torchtitan's wN and the part names of both HF namings. */
static const struct {
    const char *tt, *mlp, *mixtral;
} EXPERT[] = {
    {"w1", "gate_proj.weight", "w1.weight"},
    {"w2", "down_proj.weight", "w2.weight"},
    {"w3", "up_proj.weight", "w3.weight"},
};
#define N_EXPERT (sizeof EXPERT / sizeof EXPERT[0])
static const char *const TT_EXPERTS = "moe.experts.";
static const char *const HF_EXPERTS_MLP = "mlp.experts.";
static const char *const HF_EXPERTS_MIXTRAL = "block_sparse_moe.experts.";

static int put(char *out, size_t cap, const char *s) {
    size_t n = strlen(s);
    if (n >= cap) return -1;
    memcpy(out, s, n + 1);
    return 1;
}

static int find_pair(const pair *t, size_t n, nmap_dir dir, const char *rest, char *suffix, size_t cap) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(rest, dir == NMAP_TT_TO_HF ? t[i].tt : t[i].hf))
            return put(suffix, cap, dir == NMAP_TT_TO_HF ? t[i].hf : t[i].tt);
    return 0;
}

/* HF "<experts prefix>{e}.<part name>": the torchtitan stacked name and e */
static int hf_expert(const char *rest, char *suffix, size_t cap, int *part) {
    const char *pre[2] = {HF_EXPERTS_MLP, HF_EXPERTS_MIXTRAL};
    for (int k = 0; k < 2; k++) {
        size_t pl = strlen(pre[k]), nd = 0;
        if (strncmp(rest, pre[k], pl)) continue;
        const char *d = rest + pl;
        while (d[nd] >= '0' && d[nd] <= '9') nd++;
        if (nd == 0 || nd > 9 || d[nd] != '.') return 0;
        for (size_t i = 0; i < N_EXPERT; i++) {
            if (strcmp(d + nd + 1, k == 0 ? EXPERT[i].mlp : EXPERT[i].mixtral)) continue;
            *part = atoi(d);
            char tt[64];
            snprintf(tt, sizeof tt, "%s%s", TT_EXPERTS, EXPERT[i].tt);
            return put(suffix, cap, tt);
        }
        return 0;
    }
    return 0;
}

/* torchtitan "moe.experts.wN": its index in EXPERT, or -1 */
static int tt_expert(const char *rest) {
    size_t pl = strlen(TT_EXPERTS);
    if (strncmp(rest, TT_EXPERTS, pl)) return -1;
    for (size_t i = 0; i < N_EXPERT; i++)
        if (!strcmp(rest + pl, EXPERT[i].tt)) return (int)i;
    return -1;
}

int nmap_moe_rest(nmap_dir dir, const char *rest, const nmap_hf *hf, int mla_only, char *suffix, size_t cap,
                  int *stacked, int *part) {
    *stacked = 0;
    *part = 0;
    int rc = find_pair(MLA, sizeof MLA / sizeof MLA[0], dir, rest, suffix, cap);
    if (rc || mla_only) return rc;
    if (dir == NMAP_TT_TO_HF) {
        if (hf->mixtral && !strcmp(rest, "moe.router.gate.weight")) return put(suffix, cap, ROUTER_MIXTRAL);
        if (tt_expert(rest) >= 0) {
            *stacked = 1;
            return put(suffix, cap, "");
        }
    } else {
        if (!strcmp(rest, ROUTER_MIXTRAL)) return put(suffix, cap, "moe.router.gate.weight");
        if ((rc = hf_expert(rest, suffix, cap, part))) {
            *stacked = 1;
            return rc;
        }
    }
    return find_pair(MOE, sizeof MOE / sizeof MOE[0], dir, rest, suffix, cap);
}

int nmap_stack_part_name(const char *tt, int part, const nmap_hf *hf, char *out, size_t cap, fsdp_err *err) {
    const char *pre = "layers.";
    size_t pl = strlen(pre), nd = 0;
    const char *d = tt ? tt + pl : NULL;
    if (tt && !strncmp(tt, pre, pl))
        while (d[nd] >= '0' && d[nd] <= '9') nd++;
    int k = tt && nd > 0 && nd <= 9 && d[nd] == '.' ? tt_expert(d + nd + 1) : -1;
    if (k < 0 || part < 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "'%s' is not a stacked torchtitan tensor (layers.{i}.moe.experts.w1|w2|w3)",
                            tt ? tt : "(null)");
    int n = snprintf(out, cap, "model.layers.%.*s.%s%d.%s", (int)nd, d, hf->mixtral ? HF_EXPERTS_MIXTRAL : HF_EXPERTS_MLP,
                     part, hf->mixtral ? EXPERT[k].mixtral : EXPERT[k].mlp);
    if (n < 0 || (size_t)n >= cap) return fsdp_err_set(err, FSDP_E_INVALID, "the name of expert %d of %s does not fit", part, tt);
    return FSDP_OK;
}

void nmap_stack_piece(int64_t part_rows, int64_t r0, int64_t r1, int *part, int64_t *a, int64_t *b) {
    int64_t k = r0 / part_rows;
    *part = (int)k;
    *a = r0 - k * part_rows;
    int64_t end = (k + 1) * part_rows < r1 ? (k + 1) * part_rows : r1;
    *b = *a + (end - r0);
}
