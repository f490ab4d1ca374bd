/* The stage registry (built-in and plugin stages) and the plugin loader. */
#ifndef FSDP_PIPELINE_REGISTRY_H
#define FSDP_PIPELINE_REGISTRY_H

#include <stddef.h>

#include "fsdp/stage.h"

fsdp_registry *registry_new(void);
void registry_free(fsdp_registry *reg);
size_t registry_count(const fsdp_registry *reg);
const fsdp_stage_desc *registry_at(const fsdp_registry *reg, size_t i);
/* "built-in" or the plugin path the stage came from. */
const char *registry_origin(const fsdp_registry *reg, size_t i);
const fsdp_stage_desc *registry_find(const fsdp_registry *reg, const char *name);
/* The registered stages that list `state` under provides, comma-separated into buf. */
void registry_providers(const fsdp_registry *reg, const char *state, char *buf, size_t cap);
/* Loads a plugin shared object (once per real path) and runs its fsdp_stage_register. */
int registry_load_plugin(fsdp_registry *reg, const char *path, fsdp_err *err);
/* Registers every built-in stage of the product (stages/builtin.c). */
int registry_add_builtins(fsdp_registry *reg, fsdp_err *err);

#endif
