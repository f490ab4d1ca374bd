/* The tokenized data kinds: documents (each line of a JSONL file, its `field`; or each whole text file) in
 * the order of the sorted glob, through the model's tokenizer.json (tokenizer/tok.h) on worker threads, each
 * wrapped in the tokenizer's template (add_special_tokens: Llama 3's <|begin_of_text|>, Mistral's <s>, OLMo's
 * <|endoftext|> after) and followed by the EOS token unless the template already ends with it, packed into
 * one stream of uint32 ids in memory. The windows of seq_len + 1 tokens are then drawn from that stream as
 * from a token file (random windows by a seeded hash, or sequential blocks): a pure function of the batch
 * position, so a run resumed from train_state.data_pos on any world size sees the tokens an uninterrupted
 * run sees. */
#ifndef FSDP_TRAIN_DATA_TEXT_H
#define FSDP_TRAIN_DATA_TEXT_H

#include "fsdp/error.h"
#include "fsdp/value.h"
#include "train/data.h"
#include "train/data_files.h"

/* The `data:` keys of the tokenized kinds (tokenizer, field, eos, template, pack) into cfg. */
int data_config_text_keys(const fsdp_value *sec, data_config *cfg, fsdp_err *err);
/* The static check: the files match, the tokenizer loads, the EOS token is known. */
int data_text_check(const data_config *cfg, fsdp_err *err);
/* Tokenizes and packs the documents into f (one segment, token_bytes 4); the tokenizer's ids must fit the
 * model's vocabulary. */
int data_text_open(const data_config *cfg, int vocab, data_files *f, fsdp_err *err);

#endif
