/* `fsdp-run ckpt inspect|convert|diff`. */
#ifndef FSDP_CLI_CKPT_CLI_H
#define FSDP_CLI_CKPT_CLI_H

#include <stdio.h>

/* argv[0] is the sub-command; returns the exit code. */
int ckpt_cli_main(int argc, char **argv, FILE *out, FILE *log);

#endif
