/* A dotted key into a JSON document (see mt_json.h). */
#include "model/mt_json.h"

#include <stdio.h>
#include <string.h>

json_t *mt_json_at(json_t *root, const char *key) {
    json_t *v = root;
    while (v && *key) {
        const char *dot = strchr(key, '.');
        size_t len = dot ? (size_t)(dot - key) : strlen(key);
        char part[256];
        snprintf(part, sizeof part, "%.*s", (int)(len < 255 ? len : 255), key);
        v = json_is_object(v) ? json_object_get(v, part) : NULL;
        key += len + (dot ? 1 : 0);
    }
    return v;
}
