/* Crash points (see crash.h). */
#include "runtime/crash.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 1 when spec ("<point>[:<n>][@<rank>]") names this point, occurrence and rank */
static int crash_spec_matches(const char *spec, const char *point, long nth, int rank) {
    size_t n = strlen(point);
    if (strncmp(spec, point, n)) return 0;
    const char *p = spec + n;
    long want = 1;
    if (*p == ':') {
        char *end;
        want = strtol(p + 1, &end, 10);
        if (end == p + 1) return 0;
        p = end;
    }
    if (*p == '@') {
        char *end;
        long r = strtol(p + 1, &end, 10);
        if (end == p + 1 || *end || r != rank) return 0;
        p = end;
    }
    return *p == '\0' && want == nth;
}

void crash_point(const char *point, long nth, int rank) {
    const char *spec = getenv("FSDP_CRASH_AT");
    if (!spec || !*spec || !crash_spec_matches(spec, point, nth, rank)) return;
    kill(getpid(), SIGKILL);
    /* SIGKILL cannot be caught; should it be delayed, nothing past this point runs */
    for (;;) pause();
}

void pause_point(const char *point, long nth) {
    const char *spec = getenv("FSDP_PAUSE_AT");
    size_t n = strlen(point);
    if (!spec || strncmp(spec, point, n)) return;
    const char *p = spec + n;
    if (*p == ':') {
        char *end;
        long want = strtol(p + 1, &end, 10);
        if (end == p + 1 || want != nth) return;
        p = end;
    }
    if (*p != '=' || !p[1]) return;
    const char *go = p + 1;
    char paused[4200];
    snprintf(paused, sizeof paused, "%s.paused", go);
    int fd = open(paused, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
    struct stat st;
    struct timespec ms5 = {0, 5000000};
    for (int i = 0; i < 24000 && stat(go, &st) != 0; i++) nanosleep(&ms5, NULL);
    unlink(paused);
}
