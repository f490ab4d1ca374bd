/* The model of `ckpt convert --model` (cli/ckpt_cli_model.h). */
#include "cli/ckpt_cli_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/namemap.h"
#include "decoder/hf_config.h"
#include "decoder/decoder_params.h"

int ckpt_cli_model_load(const char *spec, decoder_config *cfg, fsdp_err *err) {
    for (int i = 0; decoder_config_preset_name(i); i++)
        if (!strcmp(decoder_config_preset_name(i), spec)) return decoder_config_preset(cfg, spec, err);
    int rc = hf_config_read(spec, cfg, err);
    return rc ? fsdp_err_prefix(err, "--model %s (neither a preset nor a Hugging Face model directory)", spec) : 0;
}

static int same_shape(const decoder_param *p, const ckpt_cli_tensor *t) {
    if (t->ndim != p->ndim) return 0;
    return t->shape[0] == p->shape[0] && (p->ndim == 1 || t->shape[1] == p->shape[1]);
}

int ckpt_cli_model_check(const decoder_config *cfg, const ckpt_cli_tensor *t, size_t n, fsdp_err *err) {
    decoder_params tab;
    int rc = decoder_params_build(cfg, &tab, err);
    if (rc) return rc;
    char *seen = calloc((size_t)tab.n, 1);
    if (!seen) {
        decoder_params_free(&tab);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n && !rc; i++) {
        char tt[NMAP_NAME_MAX];
        nmap_info info;
        fsdp_err e2;
        int k = nmap_map(NMAP_HF_TO_TT, t[i].name, cfg->n_heads, cfg->n_kv_heads, tt, sizeof tt, &info, &e2)
                    ? -1
                    : decoder_params_find(&tab, tt);
        if (k < 0) {
            rc = fsdp_err_set(err, FSDP_E_INVALID, "tensor %s is not a parameter of the --model (%s, %d layers%s)",
                              t[i].name, cfg->preset[0] ? cfg->preset : "config.json", cfg->n_layers,
                              cfg->tie_embeddings ? ", tied embeddings" : "");
        } else if (!same_shape(&tab.p[k], &t[i])) {
            char a[128], b[128];
            rc = fsdp_err_set(err, FSDP_E_INVALID, "tensor %s has shape %s, the --model needs %s", t[i].name,
                              fsdp_shape_str(t[i].ndim, t[i].shape, a, sizeof a),
                              fsdp_shape_str(tab.p[k].ndim, tab.p[k].shape, b, sizeof b));
        } else {
            seen[k] = 1;
        }
    }
    for (int k = 0; k < tab.n && !rc; k++)
        if (!seen[k])
            rc = fsdp_err_set(err, FSDP_E_INVALID, "the checkpoint has no %s, which the --model needs", tab.p[k].name);
    free(seen);
    decoder_params_free(&tab);
    return rc;
}

int ckpt_cli_model_write_config(const decoder_config *cfg, fsdp_dtype dtype, const char *dst, fsdp_err *err) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", dst);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    return hf_config_write(cfg, dtype, dir, err);
}
