/* One reading interface over every checkpoint format fsdp-run understands (DCP directories,
 * safetensors files / HF sharded directories, torch.save .pt files): list the tensors, and
 * read any row range of any tensor converted to a requested dtype, touching only the bytes
 * those rows need. Used by load-ckpt, transform load, verify and `fsdp-run ckpt`. */
#ifndef FSDP_CKPT_READER_H
#define FSDP_CKPT_READER_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/tensor.h"

typedef enum ckpt_format { CKPT_AUTO = 0, CKPT_DCP, CKPT_SAFETENSORS, CKPT_PT } ckpt_format;

typedef struct ckpt_entry {
    const char *name;
    int is_tensor;                 /* 0: a non-tensor value (DCP byte item) */
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    uint64_t nbytes;
    int chunks;                    /* stored pieces (DCP); 1 otherwise */
    /* A DCP tensor whose stored pieces are all another's (the same records: save-dcp's aliases,
     * e.g. ema_model.<key> of model.<key>): is_alias 1 and alias_of that entry (the first with
     * them, an earlier one). Its values are that entry's; its bytes are stored once. */
    int is_alias;
    size_t alias_of;
    /* FP8 block scaling (safetensors, DeepSeek-V3): 1 on `<w>_scale_inv`, the block scales of fp8 weight
     * w, whose values a read as any wider float returns dequantised (ckpt/reader_st.c). A conversion
     * to such a dtype leaves these entries out. */
    int fp8_scale;
} ckpt_entry;

typedef struct ckpt_reader ckpt_reader;

/* Detects the format from the path when fmt is CKPT_AUTO: a directory with .metadata (or
 * __N.metadata) is DCP; *.safetensors, model.safetensors.index.json or a directory of them is
 * safetensors; *.pt / *.pth / a zip file is torch.save. */
int ckpt_open(const char *path, ckpt_format fmt, ckpt_reader **out, fsdp_err *err);
void ckpt_close(ckpt_reader *r);
ckpt_format ckpt_reader_format(const ckpt_reader *r);
/* The path it was opened from. */
const char *ckpt_reader_path(const ckpt_reader *r);
const char *ckpt_format_name(ckpt_format f);
int ckpt_format_from_name(const char *name, ckpt_format *out);

/* Which save r read, as a number that two readers of one save agree on and two saves differ in
 * (with odds 2^-64): a DCP checkpoint's hash of its `.metadata` (which carries the save's identity,
 * dcp_gen.h); for a file format, of the files' device, inode, size and modification time. */
uint64_t ckpt_identity(const ckpt_reader *r);
/* The same for what is at path now (0 when nothing readable is there): no parse, no data file opened. */
uint64_t ckpt_identity_at(const char *path);
/* How many times the checkpoint changed under ckpt_open, which then started again (DCP; 0 otherwise). */
int ckpt_restarts(const ckpt_reader *r);

size_t ckpt_count(const ckpt_reader *r);
const ckpt_entry *ckpt_entry_at(const ckpt_reader *r, size_t i);
/* Index of a name (its first entry), or -1: O(log n). */
long ckpt_find(const ckpt_reader *r, const char *name);
/* Checks every checksum the checkpoint carries, reading each record once without keeping it:
 * the CRC-32 of every record of its torch.save archives (a .pt file, the .distcp pieces of a
 * DCP checkpoint). *records counts them (0 for safetensors, which carries none). An error names
 * the tensor, the file and the record. */
int ckpt_verify(ckpt_reader *r, size_t *records, fsdp_err *err);
/* What ckpt_check looked at, and the problems it found (every one counted, the first
 * CKPT_CHECK_SHOWN kept as messages, in file order). */
#define CKPT_CHECK_SHOWN 20
typedef struct ckpt_check_report {
    size_t files;    /* data files: a DCP's .distcp files, safetensors files, the .pt file */
    size_t records;  /* records whose headers were checked: zip records, safetensors tensors */
    size_t problems; /* problems found, all of them */
    char *shown[CKPT_CHECK_SHOWN]; /* the first min(problems, CKPT_CHECK_SHOWN) messages */
} ckpt_check_report;
/* A structural check of the data files that reads headers, never a tensor's bytes: each record's
 * zip local header against its central directory entry (signature, name, sizes, CRC field,
 * method stored, payload inside the archive, no overlap), each tensor's record holding the bytes
 * its chunk needs with the dtype and shape .metadata gives; a DCP safetensors piece's header
 * listing the chunk with that dtype and shape inside the file; a DCP byte item's archive opening
 * with its data.pkl. Whether each data file exists, is regular and covers the ranges the entries
 * name is checked by ckpt_open already (so is a safetensors file's whole header). Returns 0 when
 * nothing is wrong, FSDP_E_FORMAT when a problem was found (err: the first and how many more;
 * rep->shown: each with its file, offset or record, and tensor), another code when the check could
 * not run. ckpt_verify reads every byte besides. rep is filled either way; free it with
 * ckpt_check_report_free. */
int ckpt_check(ckpt_reader *r, ckpt_check_report *rep, fsdp_err *err);
void ckpt_check_report_free(ckpt_check_report *rep);
/* Rows [r0, r1) of dim 0 (a 0-d tensor has one row) of tensor i into dst as dst_dt. Reading all
 * rows of a .pt or DCP tensor checks the CRC-32 of the records it comes from; reading some rows
 * cannot (the CRC covers bytes the read skips): ckpt_verify checks a whole checkpoint. */
int ckpt_read_rows(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dst_dt, fsdp_err *err);
/* The same; *nan (may be NULL) becomes 1 when dst_dt is float32 and a value read is NaN. DCP and
 * .pt readers check each piece while it is in cache (ckpt_pread.h); safetensors by a pass over
 * the rows read. */
int ckpt_read_rows_nan(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dst_dt, int *nan,
                       fsdp_err *err);
/* Another reference to r (a deferred value reading from it, runtime/state_defer.h): ckpt_close closes the
 * reader when the opener and every reference have closed it. */
ckpt_reader *ckpt_reader_ref(ckpt_reader *r);
/* 1 when r reads files itself (not a view or a union of other readers). */
int ckpt_reader_of_files(const ckpt_reader *r);
/* ckpt_read_rows_nan from any thread while others read from r: a safetensors reader (mapped files, no
 * state) reads at once; the others are serialised on a lock of r (each read still uses their threads). */
int ckpt_read_rows_shared(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dst_dt, int *nan,
                          fsdp_err *err);
/* A non-tensor value as text ("5", "0.001", "(0.9, 0.95)", "'tiny'"); NULL when not available. */
const char *ckpt_value_text(ckpt_reader *r, size_t i);
/* The same with an error naming the value when it does not decode (a DCP byte item is decoded on
 * first use: e.g. a pickle naming a global outside the allow-list is refused here). */
int ckpt_value(ckpt_reader *r, size_t i, const char **text, fsdp_err *err);
/* The non-tensor value i as a pickle (PROTO ... STOP) that PyTorch's torch.load reads back as the
 * same value (a DCP byte item's own pickle, byte for byte; a .pt value written from its parsed
 * tree); *buf malloc'd. */
int ckpt_value_pickle(ckpt_reader *r, size_t i, void **buf, size_t *len, fsdp_err *err);
/* A non-tensor integer value (e.g. train_state.step); -1 when absent or not an int. */
int ckpt_value_int(ckpt_reader *r, size_t i, int64_t *out);

#endif
