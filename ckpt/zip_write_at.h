/* Streamed zip records whose payload the caller writes itself with positional writes (pwrite on
 * the stream's descriptor), then accounts for: the record's size and CRC-32 come out as if the
 * bytes had gone through zip_writer_data. */
#ifndef FSDP_CKPT_ZIP_WRITE_AT_H
#define FSDP_CKPT_ZIP_WRITE_AT_H

#include <stdint.h>

#include "ckpt/zip.h"

/* Flushes the stream; *fd and *off: where the open record's next payload byte goes. */
int zip_writer_data_pos(zip_writer *w, int *fd, uint64_t *off, fsdp_err *err);
/* n bytes with CRC-32 crc were written at that position: adds them to the record and moves the
 * stream past them. */
int zip_writer_data_written(zip_writer *w, uint64_t n, uint32_t crc, fsdp_err *err);

#endif
