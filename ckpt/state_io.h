/* The sharded state (runtime/state.h) <-> checkpoints.
 *
 * Save: every rank writes `__<rank>_0.distcp` with its shards (empty shards too), replicated
 * values (AdamW step, hyper-parameters, train_state) once from rank 0; rank 0 gathers the
 * storage records and writes `.metadata` last and atomically; every rank returns only after
 * it is durable. Keys follow torchtitan: model parameters at the top level,
 * optimizer.state.<fqn>.{exp_avg,exp_avg_sq,step}, optimizer.param_groups.<fqn>.<hyper>,
 * train_state.{step,ntokens_seen,data_pos}.
 *
 * A parameter that was loaded no longer lacks a value (state_param.no_value = 0).
 *
 * Load: every rank intersects its own rows of each parameter (and optimizer moment) with the
 * stored chunks and reads only those bytes, from DCP (any source world size), safetensors
 * (single or HF-sharded) or torch.save files. */
#ifndef FSDP_CKPT_STATE_IO_H
#define FSDP_CKPT_STATE_IO_H

#include "ckpt/ckpt_pipe.h"
#include "ckpt/fresh_optim.h"
#include "ckpt/reader.h"
#include "runtime/comm.h"
#include "runtime/state.h"

/* A small file rank 0 writes beside `.metadata` before it commits the checkpoint (save-dcp
 * `files:`): a plain file name (ckpt/dcp_side.h) and the pickle (PROTO ... STOP) that its torch.save
 * archive holds as data.pkl. */
typedef struct sio_side_file {
    const char *name;
    const void *pickle;
    size_t len;
} sio_side_file;

typedef struct sio_save_opts {
    int optimizer; /* include optimizer state (when present) */
    int overwrite; /* replace an existing checkpoint at path */
    /* NULL or "": parameters under their names, as model.state_dict() gives them; else under this
     * prefix ("model.": dcp.load({"model": model.state_dict()}) in PyTorch). Optimizer and train_state
     * keys are not prefixed. */
    const char *key_prefix;
    /* Every parameter is also written under each of these prefixes ("" or dotted, ending in '.';
     * none equal to key_prefix): entries of their own in `.metadata` whose storage records are the
     * parameter's (the same file, offset and length: no byte is written twice). Parameters only. */
    const char *const *aliases;
    size_t n_aliases;
    int no_train_state; /* 1: no train_state.* entries */
    /* Not NULL: rank 0 writes a fresh AdamW's param group over every parameter (ckpt/fresh_optim.h);
     * only for a state without optimizer state at step 0. */
    const fopt_adamw *fresh_optim;
    /* Files beside .metadata (sio_side_file), written by rank 0 before the commit. */
    const sio_side_file *files;
    size_t n_files;
} sio_save_opts;

/* Checks what a save with o would write before anything is: the aliases (each "" or dotted ending
 * in '.', none equal to the prefix), that no two entries get one key (an error naming the key and
 * both), fresh_optim's conditions (no optimizer state, step 0, no other key under its prefix) and
 * the side files' names. The same on every rank (no collective). */
int sio_save_check(const fsdp_state *s, int world, const sio_save_opts *o, fsdp_err *err);

/* Synchronous save (collective over c). */
int sio_save(fsdp_state *s, comm *c, const char *path, const sio_save_opts *o, fsdp_err *err);
/* The same for a state whose arrays may be on the device (STATE_DEVICE): those are downloaded chunk
 * by chunk through the sink's staging buffers while the previous chunk is written (sink NULL: every
 * array must be in host memory). The files are byte for byte those of sio_save of a host copy. */
int sio_save_staged(fsdp_state *s, comm *c, const char *path, const sio_save_opts *o, const ckpt_sink *sink,
                    fsdp_err *err);

/* Asynchronous save: sio_save_begin snapshots this rank's shards to host memory and starts
 * writing its data file in a background thread; sio_save_finish (collective) waits for it and
 * writes `.metadata`. */
typedef struct sio_async sio_async;
int sio_save_begin(fsdp_state *s, comm *c, const char *path, const sio_save_opts *o, sio_async **out, fsdp_err *err);
/* The same for a state with device arrays: the snapshot is downloaded through the sink (every
 * download has completed when it returns; s may change at once). A failed snapshot is agreed on
 * by every rank (FSDP_E_* on all of them, no thread started). */
int sio_save_begin_staged(fsdp_state *s, comm *c, const char *path, const sio_save_opts *o, const ckpt_sink *sink,
                          sio_async **out, fsdp_err *err);
int sio_save_finish(sio_async *a, fsdp_err *err);
/* Collective, and cheap while the writers run (one all-reduce of a flag): once every rank's writer
 * has written its data file, commits the save as sio_save_finish does (.metadata written and
 * durable) and sets *done; otherwise *done = 0 and nothing waits. The commit's own result comes
 * from sio_save_finish, which then no longer waits; a nonzero return is a failed all-reduce. */
int sio_save_poll(sio_async *a, int *done, fsdp_err *err);
/* The checkpoint directory the save writes. */
const char *sio_async_path(const sio_async *a);
void sio_async_free(sio_async *a);

typedef enum sio_names { SIO_NAMES_TORCHTITAN = 0, SIO_NAMES_HF = 1 } sio_names;

/* How a checkpoint stores a parameter that is declared otherwise (a model part's `transform:`):
 * the stored tensor has shape[ndim], and the parameter is stored.permute(perm).reshape(its shape). */
typedef struct sio_xform {
    int ndim; /* 0: stored as declared */
    int64_t shape[FSDP_MAX_DIMS];
    int perm[FSDP_MAX_DIMS];
} sio_xform;

typedef struct sio_load_opts {
    ckpt_format format;
    sio_names names;
    const char *strip_prefix; /* removed from checkpoint keys before matching */
    const char *add_prefix;   /* added to checkpoint keys before matching */
    const char *const *rename_from; /* rename rules on checkpoint keys (globs, in order) */
    const char *const *rename_to;
    size_t n_rename;
    int strict;               /* every parameter restored, no unexpected keys */
    int load_optimizer;       /* -1 auto (when present), 0 no, 1 required */
    const char *const *only;  /* when not NULL: load just the parameters matching these globs */
    size_t n_only;
    /* When not NULL: every array whose place is (or, for a state with a device, whose
     * state_device_target is) STATE_DEVICE is read chunk by chunk into the sink's staging buffers
     * and uploaded from there while the next chunk is read; no host copy of it is made (one
     * parameter's rows for Hugging Face q/k rows and rows larger than a buffer). Arrays targeted
     * at pinned memory are allocated there and read in place. */
    const ckpt_sink *sink;
    int round_bf16;           /* keep every parameter rounded to bf16 (its dtype becomes bf16); otherwise
                               * a bf16 / f16 parameter's loaded values are rounded to its own dtype */
    /* When not NULL: only parameters i with select[i] != 0 are loaded (and, strict, required), on top
     * of `only`. */
    const unsigned char *select;
    /* When not NULL and strip_prefix is unset: a checkpoint whose model keys name no parameter as they
     * are but do once this prefix (e.g. "model.") is removed is read with it removed. */
    const char *detect_prefix;
    /* When not NULL (s->n entries): restored[i] is set to 1 for every parameter this load restored. */
    unsigned char *restored;
    /* The checkpoint's key layout (ckpt/key_layout.h): NULL detects it. model_prefix: before every
     * parameter name ("" top level; removed like strip_prefix, no detection); optim_prefix: before
     * state.<fqn>.<kind> and param_groups.<fqn>.<option> ("optimizer." torchtitan, "optim." ...). */
    const char *model_prefix, *optim_prefix;
    /* When n_strip > 0 (instead of strip_prefix): prefix alternatives, the first a key starts with is
     * removed ("" matches every key); a key that starts with none maps to no parameter. */
    const char *const *strip;
    size_t n_strip;
    /* Keys dropped on purpose (not parameters, not unexpected), matched after the prefix is removed:
     * those matching a `drop` glob, and, when keep_given, those matching no `keep` glob. */
    const char *const *drop;
    size_t n_drop;
    const char *const *keep;
    size_t n_keep;
    int keep_given;
    /* Globs on the checkpoint's own keys (before any prefix is removed): entries excluded on purpose,
     * neither loaded nor unexpected nor listed as ignored (load-ckpt `exclude:`). */
    const char *const *exclude;
    size_t n_exclude;
    /* When not NULL (s->n entries): how the checkpoint stores each parameter (ndim 0: as declared). */
    const sio_xform *xforms;
    /* When not NULL: the checkpoint, already open (e.g. by ckpt_open_agreed: every rank reading one
     * save); sio_load reads it instead of opening path, and leaves it open. */
    ckpt_reader *reader;
    /* 1: a parameter whose data is in host memory (or deferred) and whose rows come whole from one tensor
     * (no transform, no stack of experts) is not read now (load-ckpt asks it of safetensors sources only:
     * reading a DCP or .pt tensor whole checks its CRC-32, pieces of it cannot): its data is deferred to the checkpoint's rows
     * (ckpt/state_load_defer.h), read when a writer or a materialisation needs them; a strict load's NaN
     * check happens then. */
    int defer;
} sio_load_opts;

typedef struct sio_load_result {
    size_t params_loaded, optimizer_loaded;
    size_t params_deferred; /* of params_loaded: left to the checkpoint's rows (sio_load_opts.defer) */
    uint64_t bytes_read;
    int has_train_state;
    /* the detected key prefix that was removed (o->detect_prefix), or "" (copied: the result outlives the
     * load's own buffers) */
    char stripped_prefix[256];
    /* a non-strict load's optimizer moments not restored (unmapped or missing): how many, and their
     * keys ("\n  KEY" each, truncated with "...") */
    size_t optim_omitted;
    char optim_omitted_keys[1024];
    /* entries outside the model prefix in effect (given or detected; strip_prefix) and outside the
     * training layout: not this load's business, so not unexpected either (a classic
     * {"model": ..., "epoch": ..., "rng": ...} checkpoint): how many, their keys (", KEY" each,
     * truncated with "...") and the prefix */
    size_t ignored;
    char ignored_keys[1024];
    char ignored_prefix[256];
} sio_load_result;

/* Loads into an existing state (its layout decides which rows each rank reads). */
int sio_load(fsdp_state *s, const char *path, const sio_load_opts *o, sio_load_result *res, fsdp_err *err);

#endif
