/* Shared by the ckpt tools (ckpt_cli.c convert, ckpt_diff.c diff): a whole tensor read from a
 * checkpoint, converted to a dtype and, when its name was mapped between the torchtitan and HF
 * layouts, with its q/k rows permuted the same way. */
#ifndef FSDP_CLI_CKPT_TOOL_H
#define FSDP_CLI_CKPT_TOOL_H

#include <stdio.h>

#include "ckpt/namemap.h"
#include "ckpt/reader.h"

/* Bytes of tensor e as elements of esz bytes (at least one element), checked against overflow. */
int ckpt_tool_bytes(const ckpt_entry *e, size_t esz, size_t *bytes, fsdp_err *err);
/* Tensor i of r as dt into a malloc'd *buf; info (may be NULL) from nmap_map in direction dir. */
int ckpt_tool_read(ckpt_reader *r, size_t i, fsdp_dtype dt, nmap_dir dir, const nmap_info *info, void **buf,
                   fsdp_err *err);

/* `fsdp-run ckpt diff` (ckpt_diff.c); argv holds the arguments after "diff". */
int ckpt_cli_diff(int argc, char **argv, FILE *out, FILE *log);

/* `fsdp-run ckpt clean` (ckpt_clean.c); argv holds the arguments after "clean". */
int ckpt_cli_clean(int argc, char **argv, FILE *out, FILE *log);

#endif
