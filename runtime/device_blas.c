/* dlopen of cuBLAS / cuBLASLt (see device_blas.h). */
#include "runtime/device_blas.h"

#if FSDP_HAVE_CUDA
#include <dlfcn.h>
#include <string.h>

#define DEV_BLAS_STR(x) #x
#define DEV_BLAS_XSTR(x) DEV_BLAS_STR(x)

static int open_lib(void **h, const char *name, fsdp_err *err) {
    *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (*h) return 0;
    const char *why = dlerror();
    return fsdp_err_set(err, FSDP_E_DEVICE,
                        "cannot load %s (the CUDA toolkit's library; install CUDA %d or put it on LD_LIBRARY_PATH): %s",
                        name, CUBLAS_VER_MAJOR, why ? why : "unknown error");
}

static int sym(void *lib, const char *lib_name, const char *name, void **out, fsdp_err *err) {
    dlerror();
    *out = dlsym(lib, name);
    if (*out) return 0;
    const char *why = dlerror();
    return fsdp_err_set(err, FSDP_E_DEVICE, "%s has no symbol %s: %s", lib_name, name, why ? why : "null symbol");
}

int dev_blas_load(dev_blas_api *api, fsdp_err *err) {
    memset(api, 0, sizeof *api);
    const char *lt_name = "libcublasLt.so." DEV_BLAS_XSTR(CUBLAS_VER_MAJOR);
    const char *blas_name = "libcublas.so." DEV_BLAS_XSTR(CUBLAS_VER_MAJOR);
    int rc = open_lib(&api->lib_lt, lt_name, err);
    if (!rc) rc = open_lib(&api->lib_blas, blas_name, err);
    void *p;
#define DEV_BLAS_LOAD(f, lib, lname)                                                    \
    if (!rc && !(rc = sym(api->lib, lname, DEV_BLAS_XSTR(f), &p, err))) \
        memcpy(&api->f, &p, sizeof p);
#define DEV_BLAS_LOAD_BLAS(f) DEV_BLAS_LOAD(f, lib_blas, blas_name)
#define DEV_BLAS_LOAD_LT(f) DEV_BLAS_LOAD(f, lib_lt, lt_name)
    DEV_BLAS_FNS(DEV_BLAS_LOAD_BLAS)
    DEV_BLASLT_FNS(DEV_BLAS_LOAD_LT)
    if (rc) dev_blas_unload(api);
    return rc;
}

void dev_blas_unload(dev_blas_api *api) {
    if (api->lib_blas) dlclose(api->lib_blas);
    if (api->lib_lt) dlclose(api->lib_lt);
    memset(api, 0, sizeof *api);
}
#endif
