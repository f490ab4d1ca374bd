/* train-steps' CPU / GPU backend switch (stages/train_backend.h). */
#include "stages/train_backend.h"

#include <string.h>
#include <sys/resource.h>

#include "decoder/decoder_blocks.h"
#include "decoder/decoder_table.h"
#include "stages/stages.h"

int train_on_gpu(fsdp_ctx *ctx, const fsdp_state *s) {
    (void)ctx;
    if (!s || !s->dev) return 0;
    for (size_t k = 0; k < s->n; k++)
        if (s->p[k].d_data) return 1;
    return 0;
}

int train_backend_open(fsdp_ctx *ctx, fsdp_state *s, comm *c, int B, int T, const train_fsdp_cuda_options *opt,
                       train_backend *b, fsdp_err *err) {
    memset(b, 0, sizeof *b);
    /* HSDP: the trainer shards over the mesh's shard group, c (the world) splits the batch */
    comm *sc = ctx ? stage_shard_comm(ctx) : c, *rep = ctx ? stage_replicate_comm(ctx) : NULL;
    if (!sc || comm_size(sc) * (rep ? comm_size(rep) : 1) != comm_size(c)) sc = c, rep = NULL;
    if (train_on_gpu(ctx, s)) {
        b->on_gpu = 1;
        b->dev = s->dev;
        if (!s->trainer_cfg) return fsdp_err_set(err, FSDP_E_INVALID, "training (cuda): the state has no model config");
        int rc = train_fsdp_cuda_create(s, decoder_blocks_cuda(decoder_state_config(s)), sc, s->dev, B, T, opt, &b->gpu,
                                        err);
        if (!rc && sc != c) rc = train_fsdp_cuda_set_replicas(b->gpu, c, rep, err);
        if (!rc && opt && opt->expert_parallel > 1)
            rc = train_fsdp_cuda_set_expert_parallel(b->gpu, opt->expert_parallel, err);
        return rc;
    }
    if (s && s->dev && s->offload_params)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "the master weights are in host memory (offload with params: true) while the "
                            "run uses the GPU; the GPU trainer computes from weights on the device and cannot train "
                            "them there (it would fall back to the CPU): use offload without params (the optimizer "
                            "state still goes to host memory), or runtime.device: cpu");
    if (opt && opt->mixed != TRAIN_FSDP_MIXED_NONE)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "train-steps: mixed: bf16 needs the model on the GPU (runtime.device: cuda); the CPU path "
                            "trains in float32 (mixed: none)");
    if (!s->trainer_cfg) return fsdp_err_set(err, FSDP_E_INVALID, "training: the state has no model config");
    int rc = train_fsdp_create_opts(s, decoder_blocks_cpu(decoder_state_config(s)), sc, B, T,
                                    opt ? (int)opt->ac : MODEL_BLOCKS_AC_NONE, opt ? opt->head_chunk_rows : 0, &b->cpu,
                                    err);
    if (!rc) train_fsdp_set_flat(b->cpu, !(opt && opt->per_param));
    if (!rc && sc != c) rc = train_fsdp_set_replicas(b->cpu, c, rep, err);
    if (!rc && opt && opt->expert_parallel > 1) rc = train_fsdp_set_expert_parallel(b->cpu, opt->expert_parallel, err);
    return rc;
}

int train_backend_step(train_backend *b, const int32_t *tokens, const int32_t *labels, const train_fsdp_hparams *hp,
                       train_fsdp_result *res, fsdp_err *err) {
    return b->on_gpu ? train_fsdp_cuda_step(b->gpu, tokens, labels, hp, res, err)
                     : train_fsdp_step(b->cpu, tokens, labels, hp, res, err);
}

int train_backend_step_accum(train_backend *b, const int32_t *tokens, const int32_t *labels, int n_micro,
                             const train_fsdp_hparams *hp, train_fsdp_result *res, fsdp_err *err) {
    return b->on_gpu ? train_fsdp_cuda_step_accum(b->gpu, tokens, labels, n_micro, hp, res, err)
                     : train_fsdp_step_accum(b->cpu, tokens, labels, n_micro, hp, res, err);
}

int train_backend_grads(train_backend *b, const int32_t *tokens, const int32_t *labels, train_fsdp_result *res,
                        fsdp_err *err) {
    return b->on_gpu ? train_fsdp_cuda_grads(b->gpu, tokens, labels, res, err)
                     : train_fsdp_grads(b->cpu, tokens, labels, res, err);
}

void train_backend_close(train_backend *b) {
    train_fsdp_cuda_free(b->gpu);
    train_fsdp_free(b->cpu);
    memset(b, 0, sizeof *b);
}

void train_backend_reset_peak(train_backend *b) {
    if (b->on_gpu && b->dev) dev_mem_reset_peak(b->dev);
}

double train_backend_peak_mib(const train_backend *b, const char **name) {
    if (b->on_gpu && b->dev) {
        dev_mem_stats dm, pm;
        dev_mem_stats_get(b->dev, &dm, &pm);
        *name = "peak_device_mem_mib";
        return (double)dm.peak_in_use / (1024.0 * 1024.0);
    }
    struct rusage ru;
    *name = "peak_rss_mib";
    if (getrusage(RUSAGE_SELF, &ru)) return 0;
    return (double)ru.ru_maxrss / 1024.0; /* KiB on Linux */
}

double train_mfu_percent(double flops_per_token, double tokens_per_s_per_device, double peak_tflops) {
    if (!(peak_tflops > 0) || !(flops_per_token > 0) || !(tokens_per_s_per_device > 0)) return 0;
    return 100.0 * flops_per_token * tokens_per_s_per_device / (peak_tflops * 1e12);
}
