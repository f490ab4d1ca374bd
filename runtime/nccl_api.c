/* NCCL loaded on first use (see nccl_api.h). */
#include "runtime/nccl_api.h"

#if FSDP_HAVE_CUDA
#include <dlfcn.h>
#include <string.h>

#define NCCL_API_STR(x) #x
#define NCCL_API_XSTR(x) NCCL_API_STR(x)
#define NCCL_API_LIB "libnccl.so." NCCL_API_XSTR(NCCL_MAJOR)

#if FSDP_NCCL_LINKED
int nccl_api_load(nccl_api *api, fsdp_err *err) {
    (void)err;
#define NCCL_API_TAKE(f) api->f = nccl##f;
    NCCL_API_FNS(NCCL_API_TAKE)
    return 0;
}
#else
static int sym(void *lib, const char *name, void **out, fsdp_err *err) {
    dlerror();
    *out = dlsym(lib, name);
    if (*out) return 0;
    const char *why = dlerror();
    return fsdp_err_set(err, FSDP_E_DEVICE, "%s has no symbol %s: %s", NCCL_API_LIB, name, why ? why : "null symbol");
}

int nccl_api_load(nccl_api *api, fsdp_err *err) {
    memset(api, 0, sizeof *api);
    void *lib = dlopen(NCCL_API_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        return fsdp_err_set(err, FSDP_E_DEVICE,
                            "cannot load %s (NCCL, for the device collectives; install NCCL %d or put it on "
                            "LD_LIBRARY_PATH): %s",
                            NCCL_API_LIB, NCCL_MAJOR, why ? why : "unknown error");
    }
    int rc = 0;
    void *p;
#define NCCL_API_LOAD(f) \
    if (!rc && !(rc = sym(lib, "nccl" #f, &p, err))) memcpy(&api->f, &p, sizeof p);
    NCCL_API_FNS(NCCL_API_LOAD)
    return rc; /* the library stays loaded (see nccl_api.h) */
}
#endif
#endif
