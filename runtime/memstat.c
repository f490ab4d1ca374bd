/* The peak resident set (see memstat.h). */
#include "runtime/memstat.h"

#include <stdio.h>
#include <string.h>

double memstat_peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6) && sscanf(line + 6, "%lf", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024.0;
}
