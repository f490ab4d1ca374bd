/* fsdp-run entry point: the only place that calls exit(). */
#include <gnu/libc-version.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

/* GNU OpenMP spin-waits between parallel regions by default, which starves OpenBLAS's own threads
 * (2-3x slower training on small machines), so fsdp-run waits passively unless OMP_WAIT_POLICY is set.
 * libgomp reads the policy once, in its constructor, before main. The executable's .preinit_array runs
 * before every library's constructor: the policy is set there, without executing the program twice.
 * glibc (2.34 and later) then restores the environment it was started with before main, so main sets
 * it again for the processes it starts; an older glibc restores it before the libraries' constructors,
 * and there main falls back to executing the program once more with the policy set. */
static void wait_policy_passive(int argc, char **argv, char **envp) {
    (void)argc, (void)argv;
    if (!envp) return;
    for (char **e = envp; *e; e++)
        if (!strncmp(*e, "OMP_WAIT_POLICY=", 16)) return; /* the user's */
    /* libc's environment must already be the process's (it is not where the executable has a copy of
     * `environ`): then setenv adds to it; otherwise leave it alone */
    const char *eq = envp[0] ? strchr(envp[0], '=') : NULL;
    if (eq) {
        char name[256];
        size_t n = (size_t)(eq - envp[0]) < sizeof name - 1 ? (size_t)(eq - envp[0]) : sizeof name - 1;
        memcpy(name, envp[0], n);
        name[n] = '\0';
        if (!getenv(name)) return;
    }
    setenv("OMP_WAIT_POLICY", "passive", 0);
}
__attribute__((section(".preinit_array"), used)) static void (*const fsdp_preinit)(int, char **, char **) =
    wait_policy_passive;

/* 1 when this glibc keeps what .preinit_array set in the environment until the libraries' constructors */
static int preinit_env_reaches_libraries(void) {
    int major = 0, minor = 0;
    return sscanf(gnu_get_libc_version(), "%d.%d", &major, &minor) == 2 && (major > 2 || (major == 2 && minor >= 34));
}

int main(int argc, char **argv) {
    if (!getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "passive", 1); /* for the processes fsdp-run starts (mpirun --nproc) */
        if (!preinit_env_reaches_libraries() && !getenv("FSDP_NO_REEXEC")) {
            setenv("FSDP_NO_REEXEC", "1", 1);
            execv("/proc/self/exe", argv); /* if that fails, carry on with the default policy */
        }
    }
    int rc = fsdp_cli_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    exit(rc);
}
