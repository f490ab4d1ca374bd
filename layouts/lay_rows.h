/* The layout rows, one file per trainer (layouts/lay_<trainer>.c), gathered by layouts/lay_table.c. */
#ifndef FSDP_LAYOUTS_LAY_ROWS_H
#define FSDP_LAYOUTS_LAY_ROWS_H

#include "layouts/layout.h"

#define LAY_N(a) (sizeof(a) / sizeof((a)[0]))

/* Hugging Face's Llama-family names (layouts/lay_hf.c), shared by the rows of trainers that train them as they are */
extern const lay_name lay_hf_llama_names[];
extern const size_t lay_hf_llama_n_names;
#define LAY_HF_LLAMA_N_NAMES 17 /* LAY_N(lay_hf_llama_names), for the rows' initializers (checked by lay_hf.c) */

extern const lay_layout lay_torchtitan_02, lay_torchtitan_03, lay_olmo_core_3, lay_fms_113, lay_megatron_fsdp_06,
    lay_accelerate_115, lay_olmo_06, lay_olmo_06_st;

#endif
