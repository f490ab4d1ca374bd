/* Every rank's metrics of a stage in the run report: after a stage every rank sends its numeric
 * metrics to rank 0, which keeps min, max and mean over the ranks per metric name. */
#ifndef FSDP_RUN_REPORT_RANKS_H
#define FSDP_RUN_REPORT_RANKS_H

#include "fsdp/error.h"
#include "run/report.h"
#include "runtime/comm.h"

/* Collective over c: rank 0 fills rec->ranks from every rank's `mine`; the other ranks leave rec as is. */
int report_gather_ranks(comm *c, const ctx_metrics *mine, run_record *rec, fsdp_err *err);

#endif
