/* `fsdp-run tokenize`: documents through a model's tokenizer.json, and ids back to text. */
#ifndef FSDP_CLI_TOKENIZE_CLI_H
#define FSDP_CLI_TOKENIZE_CLI_H

#include <stdio.h>

int tokenize_cli_main(int argc, char **argv, FILE *out, FILE *log);

#endif
