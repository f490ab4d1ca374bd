/* Placeholders where a checkpoint says the values live elsewhere (layouts/layout.h): DeepSpeed ZeRO-3's
 * model_states.pt keeps every parameter as a tensor of shape [0] under module.<name>, and its real shape in
 * param_shapes.<group>.<name>; the values are in the *_optim_states.pt partitions. */
#include <stdio.h>
#include <string.h>

#include "ckpt/namemap.h"
#include "layouts/layout.h"

/* A param_shapes.<group>.<name> entry for name (with or without DeepSpeed's module. prefix): its index, or -1. */
static long shape_entry(ckpt_reader *r, const char *name) {
    const char *bare = nmap_strip_prefix(name, "module.");
    if (!bare) bare = name;
    char key[NMAP_NAME_MAX];
    for (int g = 0; g < 64; g++) { /* DeepSpeed's param groups (one per optimizer group) */
        snprintf(key, sizeof key, "param_shapes.%d.%s", g, bare);
        long i = ckpt_find(r, key);
        if (i >= 0) return i;
    }
    return -1;
}

int lay_check_placeholders(ckpt_reader *r, fsdp_err *err) {
    if (ckpt_find(r, "ds_version") < 0) return 0;
    for (size_t i = 0; i < ckpt_count(r); i++) {
        const ckpt_entry *e = ckpt_entry_at(r, i);
        if (!e->is_tensor || fsdp_numel(e->ndim, e->shape) != 0) continue;
        long s = shape_entry(r, e->name);
        if (s < 0) continue;
        const char *shape = ckpt_value_text(r, (size_t)s);
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "checkpoint %s: tensor %s has no elements where %s gives %s: a DeepSpeed ZeRO-3 "
                            "model_states.pt keeps placeholders, the values live in the *_optim_states.pt partitions "
                            "(zero_to_fp32.py merges them), which fsdp-run does not read yet; convert with "
                            "zero_to_fp32.py first", ckpt_reader_path(r), e->name, ckpt_entry_at(r, (size_t)s)->name,
                            shape ? shape : "another shape");
    }
    return 0;
}
