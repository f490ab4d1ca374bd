/* This process's memory high-water mark (module prefix memstat_), for the run report: each stage records
 * `peak_rss_bytes`, the process's peak resident set so far (VmHWM of /proc/self/status, which counts this
 * program's own memory only: a forked and exec'd process does not inherit its parent's mark there, unlike
 * getrusage's ru_maxrss). */
#ifndef FSDP_RUNTIME_MEMSTAT_H
#define FSDP_RUNTIME_MEMSTAT_H

/* Bytes of VmHWM; -1 when /proc/self/status cannot be read. */
double memstat_peak_rss(void);

#endif
