/* `fsdp-run data prepare`: documents through a tokenizer once, into llm.c shards or a flat token file. */
#ifndef FSDP_CLI_DATA_PREPARE_CLI_H
#define FSDP_CLI_DATA_PREPARE_CLI_H

#include <stdio.h>

int data_cli_main(int argc, char **argv, FILE *out, FILE *log);

#endif
