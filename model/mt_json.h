/* A dotted key into a JSON document (module prefix mt_json_), as the model's dims and checks read a
 * source's config.json: `text_config.hidden_size` is root["text_config"]["hidden_size"]. */
#ifndef FSDP_MODEL_MT_JSON_H
#define FSDP_MODEL_MT_JSON_H

#include <jansson.h>

/* The value at the dotted key (borrowed from root), or NULL when a step is missing or not an object. */
json_t *mt_json_at(json_t *root, const char *key);

#endif
