/* A public call's error struct: the caller's, or, when the caller passed NULL, one of the call's own, so that no
 * error path of a plugin-API call writes through a NULL err (the code is still returned). */
#ifndef FSDP_RUNTIME_ERR_LOCAL_H
#define FSDP_RUNTIME_ERR_LOCAL_H

#include "fsdp/error.h"

#define FSDP_ERR_LOCAL(err)                                                                                            \
    fsdp_err err##_own_;                                                                                               \
    if (!(err)) (err) = &err##_own_

#endif
