/* Where a recipe named on the command line is (cli/cli.h): as given, else, for a relative path that is
 * not there, in the checkout this fsdp-run was built in (build/fsdp-run's directory's parent), so that
 * `fsdp-run recipes/quickstart.yaml` runs from any directory. */
#include "cli/cli.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *cli_recipe_path(const char *given) {
    if (!given || given[0] == '/' || access(given, F_OK) == 0) return NULL;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = '\0';
    for (int up = 0; up < 2; up++) { /* .../build/fsdp-run -> ... */
        char *slash = strrchr(exe, '/');
        if (!slash) return NULL;
        *slash = '\0';
    }
    size_t len = strlen(exe) + strlen(given) + 2;
    char *cand = malloc(len);
    if (!cand) return NULL;
    snprintf(cand, len, "%s/%s", exe, given);
    if (access(cand, F_OK) == 0) return cand;
    free(cand);
    return NULL;
}
