/* fsdp-run public API: the stage ABI.
 *
 * A stage is described by an fsdp_stage_desc: name, one-line summary, parameter schema,
 * the context state it needs and provides, and its run function. Built-in stages and
 * plugin stages register the same way. A plugin is a shared object listed under
 * `plugins:` in a recipe; it exports
 *
 *     int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err);
 *
 * which calls fsdp_registry_add() for each stage it provides. Every descriptor carries
 * FSDP_STAGE_ABI_VERSION and sizeof(fsdp_stage_desc); a mismatch is refused with a
 * clear error (rebuild the plugin against these headers). */
#ifndef FSDP_STAGE_H
#define FSDP_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/ctx.h"
#include "fsdp/error.h"
#include "fsdp/value.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The stage ABI's version: a major and a minor. A minor adds calls (1.1: include/fsdp/params.h,
 * collectives.h, callbacks.h, ckpt.h; 1.2: trainable flags, the hooks of callbacks.h, plugin state in
 * checkpoints) and changes nothing a plugin of an older minor uses, so such a
 * plugin still loads; a plugin of a newer minor (it may call what this fsdp-run lacks) or another major
 * is refused. abi_version packs them: the major in the low 16 bits, the minor above (a plugin of 1.0
 * wrote just 1). */
#define FSDP_STAGE_ABI_MAJOR 1u
#define FSDP_STAGE_ABI_MINOR 2u
#define FSDP_STAGE_ABI_VERSION (FSDP_STAGE_ABI_MAJOR | (FSDP_STAGE_ABI_MINOR << 16))
#define FSDP_VERSION_STRING "0.1.0"

typedef enum fsdp_param_type {
    FSDP_T_STRING = 0,
    FSDP_T_INT,
    FSDP_T_FLOAT, /* ints are accepted where a float is expected */
    FSDP_T_BOOL,
    FSDP_T_LIST,
    FSDP_T_MAP
} fsdp_param_type;

/* One entry of a stage's `with:` schema. An array of these ends with {NULL}. */
typedef struct fsdp_param_spec {
    const char *name;
    fsdp_param_type type;
    int required;                /* 1: must be given (dflt is ignored) */
    const char *dflt;            /* default as YAML text ("1e-3", "true", "[0.9, 0.95]"; a string YAML reads otherwise
                                    quoted: "'**'") or NULL; of the parameter's type, and one of choices when given
                                    (fsdp_registry_add refuses it otherwise) */
    const char *const *choices;  /* NULL-terminated allowed values for a string, or NULL */
    const char *help;            /* one line */
} fsdp_param_spec;

typedef int (*fsdp_stage_run_fn)(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err);
/* Optional: checks that need more than the schema (e.g. a value range), run at
 * validation time before any stage runs. Point errors at values with fsdp_err_at(). */
typedef int (*fsdp_stage_check_fn)(const fsdp_value *with, fsdp_err *err);

typedef struct fsdp_stage_desc {
    uint32_t abi_version;  /* FSDP_STAGE_ABI_VERSION */
    uint32_t struct_size;  /* sizeof(fsdp_stage_desc) */
    const char *name;      /* what `uses:` names: 1 to 64 of a-z, 0-9, '-' and '_' */
    const char *summary;   /* one line for `fsdp-run stages` */
    const fsdp_param_spec *params; /* ends with {NULL}; NULL for none */
    const char *const *needs;      /* NULL-terminated state names, or NULL */
    const char *const *provides;   /* NULL-terminated state names, or NULL */
    fsdp_stage_run_fn run;
    fsdp_stage_check_fn check;     /* may be NULL */
} fsdp_stage_desc;

#define FSDP_STAGE_DESC_INIT FSDP_STAGE_ABI_VERSION, (uint32_t)sizeof(fsdp_stage_desc)

typedef struct fsdp_registry fsdp_registry;

/* Adds a stage. The descriptor (and everything it points to) must outlive the registry.
 * Errors: ABI version or struct size mismatch, bad name, duplicate name, no run. */
int fsdp_registry_add(fsdp_registry *reg, const fsdp_stage_desc *desc, fsdp_err *err);

#define FSDP_STAGE_REGISTER_SYMBOL "fsdp_stage_register"
typedef int (*fsdp_stage_register_fn)(fsdp_registry *reg, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
