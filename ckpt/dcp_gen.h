/* The identity of one DCP save (ckpt/dcp_gen.c), which lets a reader tell whether the data files it
 * opened belong to the `.metadata` it read.
 *
 * Every save fsdp-run writes draws a random 128-bit identity and records it twice, in places
 * PyTorch ignores: in `.metadata` as StorageMeta.save_id ("fsdp-run:<32 hex digits>"; torch writes
 * a uuid4 there and never reads it back), and at the end of each data file it writes, as a 64-byte
 * trailer after the last record ("fsdp-run save id<32 hex> rank NNNNNNNNN\n"; torch reads only the
 * byte ranges `.metadata` lists). A checkpoint written by PyTorch (or an older fsdp-run) has
 * neither, and is read as before. */
#ifndef FSDP_CKPT_DCP_GEN_H
#define FSDP_CKPT_DCP_GEN_H

#include <stddef.h>
#include <stdint.h>

#define DCP_GEN_TRAILER 64
#define DCP_GEN_ID_LEN 32

/* A save's data file names (num: dcp_data_file_name) and identity; plain bytes (broadcast as is). */
typedef struct dcp_gen {
    uint32_t num;
    char id[DCP_GEN_ID_LEN + 1]; /* 32 lowercase hex digits; "" for a save without identity */
} dcp_gen;

/* A new identity for generation num (getrandom; /dev/urandom, then the clock and pid if both fail). */
void dcp_gen_new(dcp_gen *g, uint32_t num);
/* The trailer of rank's data file of g into out. */
void dcp_gen_trailer(const dcp_gen *g, int rank, unsigned char out[DCP_GEN_TRAILER]);
/* The identity in the trailer of the file open as fd (of size bytes) into id: 1 when it has one, 0
 * when it has none (id ""). */
int dcp_gen_read_trailer(int fd, uint64_t size, char id[DCP_GEN_ID_LEN + 1]);
/* StorageMeta.save_id of g ("fsdp-run:<id>") into out. */
void dcp_gen_save_id(const dcp_gen *g, char *out, size_t cap);
/* The identity recorded in a save_id (NULL or another program's: ""). */
void dcp_gen_from_save_id(const char *save_id, char id[DCP_GEN_ID_LEN + 1]);

/* FNV-1a of n bytes continuing from h (start with DCP_HASH_START): how a checkpoint's `.metadata` is
 * told apart from another (dcp_open, ckpt_identity_at). Never 0 once finished with dcp_hash_end. */
#define DCP_HASH_START 1469598103934665603ull
uint64_t dcp_hash_bytes(uint64_t h, const void *p, size_t n);
static inline uint64_t dcp_hash_end(uint64_t h) { return h ? h : 1; }

#endif
