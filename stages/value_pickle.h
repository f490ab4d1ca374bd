/* A recipe value as a Python value's pickle (module prefix vpkl_): what save-dcp's `files:` write
 * with torch.save. A map is a dict with str keys, a list a list, null None; a quoted scalar is a str;
 * a plain scalar is a bool, an int or a float when it reads as one (as the rest of the recipe reads
 * them: true/false/yes/no/on/off, 12, 0x1f, 1_000, 1e-4, .inf), else a str. */
#ifndef FSDP_STAGES_VALUE_PICKLE_H
#define FSDP_STAGES_VALUE_PICKLE_H

#include "ckpt/pickle.h"
#include "fsdp/value.h"

/* Nesting deeper than this is refused (an error at the value). */
#define VPKL_MAX_DEPTH 64

/* The opcodes of v appended to w (no PROTO/STOP). what names the value in errors ("files:
 * metadata.pt"). */
int vpkl_value(pkl_w *w, const fsdp_value *v, const char *what, fsdp_err *err);

/* A whole protocol-2 pickle (PROTO ... STOP) of v into w. */
int vpkl_pickle(pkl_w *w, const fsdp_value *v, const char *what, fsdp_err *err);

/* The Python type a plain or quoted scalar becomes ("NoneType", "bool", "int", "float", "str"). */
const char *vpkl_scalar_type(const fsdp_value *v);

#endif
