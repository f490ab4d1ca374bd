/* Payload bytes of a streamed zip record written by the caller at a known file position (positional
 * writes, e.g. ckpt_stream.h's copy) instead of through zip_writer_data: see zip_write_at.h. */
#include "ckpt/zip_write_at.h"

#include <errno.h>
#include <string.h>
#include <zlib.h>

int zip_writer_data_pos(zip_writer *w, int *fd, uint64_t *off, fsdp_err *err) {
    if (!w->open_rec) return fsdp_err_set(err, FSDP_E_INVALID, "zip: no open record");
    if (w->failed) return fsdp_err_set(err, FSDP_E_IO, "zip: an earlier write failed");
    if (fflush(w->f) != 0) {
        w->failed = 1;
        return fsdp_err_set(err, FSDP_E_IO, "zip: write failed: %s", strerror(errno));
    }
    *fd = fileno(w->f);
    *off = w->start + w->pos;
    return *fd < 0 ? fsdp_err_set(err, FSDP_E_INVALID, "zip: the stream has no file descriptor") : 0;
}

int zip_writer_data_written(zip_writer *w, uint64_t n, uint32_t crc, fsdp_err *err) {
    if (!w->open_rec) return fsdp_err_set(err, FSDP_E_INVALID, "zip: no open record");
    w->crc = (uint32_t)crc32_combine(w->crc, crc, (z_off_t)n);
    w->rec_size += n;
    w->pos += n;
    if (fseeko(w->f, (off_t)(w->start + w->pos), SEEK_SET) != 0) {
        w->failed = 1;
        return fsdp_err_set(err, FSDP_E_IO, "zip: cannot seek past the payload: %s", strerror(errno));
    }
    return 0;
}
