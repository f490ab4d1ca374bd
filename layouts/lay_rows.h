/* The layout rows, one file per trainer (layouts/lay_<trainer>.c), gathered by layouts/lay_table.c. */
#ifndef FSDP_LAYOUTS_LAY_ROWS_H
#define FSDP_LAYOUTS_LAY_ROWS_H

#include "layouts/layout.h"

#define LAY_N(a) (sizeof(a) / sizeof((a)[0]))

extern const lay_layout lay_torchtitan_02, lay_torchtitan_03, lay_olmo_core_3, lay_fms_113;

#endif
