/* Crash points: deterministic SIGKILLs for the crash-safety tests.
 *
 * FSDP_CRASH_AT=<point>[:<n>][@<rank>] makes the process kill itself with SIGKILL when the code
 * reaches the named point for the n-th time (n counted by the caller, from 1; default 1), on the
 * given rank only (default: any rank). Unset, a crash point is one getenv; it keeps no state of
 * its own (the caller passes the count: the index of the file, item or step it is at). */
#ifndef FSDP_RUNTIME_CRASH_H
#define FSDP_RUNTIME_CRASH_H

/* Kills the process (SIGKILL, no cleanup, no flush) when FSDP_CRASH_AT names this point,
 * occurrence nth (1-based) and rank (-1 when the caller does not know its rank: matches only a
 * spec without @rank). Returns otherwise. */
void crash_point(const char *point, long nth, int rank);

/* Pause points, for tests of readers racing writers: FSDP_PAUSE_AT=<point>[:<n>]=<file> makes the
 * process, when it reaches the named point for the n-th time (nth counted by the caller, from 1;
 * default: every time), create `<file>.paused` and wait until `<file>` exists (polled every 5 ms, 120 s
 * at most), then remove `<file>.paused` and go on. Unset, one getenv. */
void pause_point(const char *point, long nth);

#endif
