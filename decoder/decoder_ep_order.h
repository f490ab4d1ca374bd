/* Expert parallelism's order of received rows (shared by the CPU and GPU MoE layers): the rows a rank
 * receives come source-major (source rank, then local expert, then the source's slot order); the experts'
 * GEMMs take them expert-major (local expert, then source rank, then slot order), the order one rank
 * holding every expert would use for the same tokens. */
#ifndef FSDP_DECODER_DECODER_EP_ORDER_H
#define FSDP_DECODER_DECODER_EP_ORDER_H

#include <stdint.h>

/* recvc [P * El]: rows source q sent for local expert j at recvc[q * El + j]. Fills perm [rows]
 * (expert-major row -> received row) and loff [El + 1] (each local expert's rows in expert-major
 * order); returns the number of rows. */
int32_t decoder_ep_order(int P, int El, const int32_t *recvc, int32_t *perm, int32_t *loff);

#endif
