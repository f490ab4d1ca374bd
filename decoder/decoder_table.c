/* The decoder family's config -> generic model table and state trainer (see decoder_table.h). */
#include "decoder/decoder_table.h"
#include "decoder/decoder_spec.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoder/decoder_arch.h"
#include "decoder/decoder_params.h"

int decoder_table_add(const decoder_config *cfg, mt_table *t, int part, fsdp_err *err) {
    if (part < 0 || (size_t)part >= t->n_parts)
        return fsdp_err_set(err, FSDP_E_INVALID, "decoder table: part %d does not exist", part);
    decoder_params lp;
    int rc = decoder_params_build(cfg, &lp, err);
    if (rc) return rc;
    const char *prefix = t->parts[part].prefix;
    char name[MT_NAME_MAX + DECODER_PARAM_NAME_MAX + 2];
    for (int i = 0; i < lp.n && !rc; i++) {
        const decoder_param *q = &lp.p[i];
        mt_param p;
        memset(&p, 0, sizeof p);
        snprintf(name, sizeof name, "%s%s", prefix, q->name);
        p.name = name;
        p.ndim = q->ndim;
        for (int d = 0; d < q->ndim; d++) p.shape[d] = q->shape[d];
        p.dtype = FSDP_DT_F32;
        p.init = q->init;
        p.part = part;
        p.layer = q->layer;
        rc = mt_add(t, &p, err);
    }
    decoder_params_free(&lp);
    return rc;
}

int decoder_table_build(const decoder_config *cfg, const char *where, mt_table *t, fsdp_err *err) {
    const decoder_arch_info *a = decoder_arch_get(cfg->arch);
    const char *arch = a ? a->name : "llama3";
    char source[96];
    snprintf(source, sizeof source, "%s (%s%s)", arch, cfg->preset[0] ? "preset " : "custom",
             cfg->preset[0] ? cfg->preset : "");
    int part;
    int rc = mt_add_part(t, arch, "", source, where, &part, err);
    if (!rc) rc = decoder_table_add(cfg, t, part, err);
    if (!rc) rc = mt_finalize(t, err);
    if (rc) return rc;
    decoder_config *own = malloc(sizeof *own);
    if (!own) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    *own = *cfg;
    free(t->trainer_cfg);
    t->trainer_cfg = own;
    t->trainer = MT_TRAIN_DECODER;
    snprintf(t->kind, sizeof t->kind, "%s", source);
    return 0;
}

static int arch_build(const fsdp_value *model, const char *where, mt_table *t, fsdp_err *err) {
    decoder_config cfg;
    int rc = decoder_spec_from_value(&cfg, model, err);
    return rc ? rc : decoder_table_build(&cfg, where, t, err);
}

static int arch_add_part(const fsdp_value *m, mt_table *t, int part, fsdp_err *err) {
    decoder_config cfg;
    int rc = decoder_spec_from_value(&cfg, m, err);
    return rc || !t ? rc : decoder_table_add(&cfg, t, part, err);
}

const mt_arch decoder_table_arch = {arch_build, arch_add_part};

const decoder_config *decoder_table_config(const mt_table *t) {
    return t && t->trainer == MT_TRAIN_DECODER ? (const decoder_config *)t->trainer_cfg : NULL;
}

const decoder_config *decoder_state_config(const fsdp_state *s) {
    return s ? (const decoder_config *)s->trainer_cfg : NULL;
}

int decoder_state_set_config(fsdp_state *s, const decoder_config *cfg, fsdp_err *err) {
    decoder_config *own = NULL;
    if (cfg && !(own = malloc(sizeof *own))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (own) *own = *cfg;
    free(s->trainer_cfg);
    s->trainer_cfg = own;
    memset(&s->hf, 0, sizeof s->hf);
    memset(&s->hf_moe, 0, sizeof s->hf_moe);
    if (own) s->hf = (state_hf_names){1, own->n_heads, own->n_kv_heads, own->tie_embeddings};
    const decoder_arch_info *a = own ? decoder_arch_get(own->arch) : NULL;
    if (a) {
        _Static_assert((int)DECODER_MOE_NAMES_MLP == (int)STATE_HF_MOE_MLP &&
                           (int)DECODER_MOE_NAMES_MIXTRAL == (int)STATE_HF_MOE_MIXTRAL,
                       "the expert namings of decoder_arch.h and runtime/state.h must agree");
        s->hf_moe.qk_norm_full = own->qk_norm && own->qk_norm_full;
        s->hf_moe.moe_style = own->n_experts > 0 ? (int)a->moe_names : STATE_HF_MOE_NONE;
    }
    return 0;
}

int decoder_state_param_resized(fsdp_state *s, const char *name, int64_t rows, fsdp_err *err) {
    const decoder_config *c = decoder_state_config(s);
    if (!c || (strcmp(name, decoder_param_kind_name(DECODER_P_TOK_EMBEDDINGS)) &&
               strcmp(name, decoder_param_kind_name(DECODER_P_OUTPUT))))
        return 0;
    if (rows < 1 || rows > INT32_MAX)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: a vocabulary of %lld rows", name, (long long)rows);
    decoder_config cfg = *c;
    cfg.vocab_size = (int)rows;
    return decoder_state_set_config(s, &cfg, err);
}
