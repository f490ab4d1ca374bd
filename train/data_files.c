/* The files of a `data:` section: glob, map, headers, vocabulary scan. */
#include "train/data_files.h"

#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/fileio.h"

static const char *kind_label(data_kind k) {
    return k == DATA_TEXT ? "text" : k == DATA_LLMC ? "llmc" : k == DATA_JSONL ? "jsonl" : "tokens";
}

/* Matches of pattern (sorted). A relative path was resolved when the recipe was loaded (recipe_paths.c). */
int data_glob(const data_config *cfg, glob_t *g, fsdp_err *err) {
    memset(g, 0, sizeof *g);
    int rc = glob(cfg->path, GLOB_ERR, NULL, g);
    if (rc == 0) return 0;
    globfree(g);
    memset(g, 0, sizeof *g);
    if (rc == GLOB_NOSPACE) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (rc == GLOB_ABORTED)
        return fsdp_err_set(err, FSDP_E_IO, "data.path '%s': a directory of the pattern cannot be read", cfg->path);
    if (cfg->path[0] != '/')
        return fsdp_err_set(err, FSDP_E_IO,
                            "data.path '%s': no file matches (kind %s; a relative path is looked up in the directory "
                            "of the recipe file that names it, then in the working directory)",
                            cfg->path, kind_label(cfg->kind));
    return fsdp_err_set(err, FSDP_E_IO, "data.path '%s': no file matches (kind %s)", cfg->path, kind_label(cfg->kind));
}

static int map_seg(data_seg *s, fsdp_err *err) {
    int fd;
    char label[4200];
    snprintf(label, sizeof label, "data %s", s->path);
    int rc = fio_open_read(s->path, label, &fd, err); /* never blocks on a FIFO */
    if (rc) return rc;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = errno;
        close(fd);
        return fsdp_err_set(err, FSDP_E_IO, "data %s: %s", s->path, strerror(rc));
    }
    s->map_len = (size_t)st.st_size;
    if (s->map_len == 0) {
        close(fd);
        return fsdp_err_set(err, FSDP_E_FORMAT, "data %s: the file is empty", s->path);
    }
    void *m = mmap(NULL, s->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    rc = errno;
    close(fd);
    if (m == MAP_FAILED) return fsdp_err_set(err, FSDP_E_IO, "data %s: mmap: %s", s->path, strerror(rc));
    s->map = m;
    return 0;
}

static int32_t le32_at(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* The token width of an llm.c header's (magic, version): 2 (GPT-2's 20240520 v1), 4 (llama-3's 20240801 v7), 0. */
static int llmc_width(int32_t magic, int32_t version) {
    if (magic == DATA_LLMC_MAGIC && version == DATA_LLMC_VERSION) return 2;
    if (magic == DATA_LLMC32_MAGIC && version == DATA_LLMC32_VERSION) return 4;
    return 0;
}

/* The llm.c header: magic, version, token count, and the file's size against it; *esz its token width. */
static int check_llmc(data_seg *s, int *esz, fsdp_err *err) {
    if (s->map_len < DATA_LLMC_HEADER_BYTES)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "data %s: %zu bytes is shorter than the 1024-byte llm.c header (256 x int32)", s->path,
                            s->map_len);
    int32_t magic = le32_at(s->map), version = le32_at(s->map + 4), ntok = le32_at(s->map + 8);
    if (magic != DATA_LLMC_MAGIC && magic != DATA_LLMC32_MAGIC)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "data %s: header magic is %d, expected %d (an llm.c .bin shard of uint16 tokens) or %d "
                            "(uint32 tokens; a flat token file without a header is kind: tokens)",
                            s->path, (int)magic, DATA_LLMC_MAGIC, DATA_LLMC32_MAGIC);
    *esz = llmc_width(magic, version);
    if (!*esz)
        return fsdp_err_set(err, FSDP_E_FORMAT, "data %s: header version is %d, expected %d with magic %d", s->path,
                            (int)version, magic == DATA_LLMC_MAGIC ? DATA_LLMC_VERSION : DATA_LLMC32_VERSION, (int)magic);
    if (ntok < 0)
        return fsdp_err_set(err, FSDP_E_FORMAT, "data %s: header token count is %d, expected >= 0", s->path, (int)ntok);
    uint64_t want = DATA_LLMC_HEADER_BYTES + (uint64_t)*esz * (uint64_t)ntok;
    if (want != s->map_len)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "data %s: the header says %d tokens (%llu bytes with the header), the file has %zu bytes",
                            s->path, (int)ntok, (unsigned long long)want, s->map_len);
    s->hdr = DATA_LLMC_HEADER_BYTES;
    s->n_tokens = (size_t)ntok;
    return 0;
}

/* 1 when s is an llm.c shard: its magic, version, and a token count that accounts for its size (a
 * flat token file starting with those three int32 by chance would need all three to agree). */
static int is_llmc_shard(const data_seg *s) {
    if (s->map_len < DATA_LLMC_HEADER_BYTES) return 0;
    int w = llmc_width(le32_at(s->map), le32_at(s->map + 4));
    int32_t ntok = le32_at(s->map + 8);
    return w && ntok >= 0 && DATA_LLMC_HEADER_BYTES + (uint64_t)w * (uint64_t)ntok == s->map_len;
}

static int size_seg(const data_config *cfg, int *esz_io, data_seg *s, fsdp_err *err) {
    int esz = *esz_io;
    if (cfg->kind == DATA_LLMC) { /* the shards of one glob have one token width */
        int w = 0, rc = check_llmc(s, &w, err);
        if (!rc && esz && w != esz)
            rc = fsdp_err_set(err, FSDP_E_FORMAT, "data %s: uint%d tokens after shards of uint%d tokens (one glob, one "
                              "token width)", s->path, 8 * w, 8 * esz);
        *esz_io = w;
        return rc;
    }
    if (cfg->kind == DATA_TOKENS && is_llmc_shard(s))
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "data %s: an llm.c .bin shard (header magic %d, version %d, %d tokens): use kind: llmc "
                            "(kind: tokens would train on its 1024-byte header as tokens)",
                            s->path, (int)le32_at(s->map), (int)le32_at(s->map + 4), (int)le32_at(s->map + 8));
    if (s->map_len % (size_t)esz)
        return fsdp_err_set(err, FSDP_E_FORMAT, "data %s: %zu bytes is not a whole number of uint%d tokens", s->path,
                            s->map_len, esz * 8);
    s->n_tokens = s->map_len / (size_t)esz;
    return 0;
}

/* The largest token id of s (a max reduction that vectorises; the files are little-endian, as the host). */
static uint32_t max_token(const data_seg *s, int esz) {
    const unsigned char *base = s->map + s->hdr;
    size_t n = s->n_tokens;
    uint32_t mx = 0;
    if (esz == 1) {
#pragma omp parallel for reduction(max : mx) schedule(static)
        for (size_t i = 0; i < n; i++) mx = base[i] > mx ? base[i] : mx;
    } else if (esz == 2) {
        const uint16_t *t = (const uint16_t *)(const void *)base; /* the header is 1024 bytes: aligned */
#pragma omp parallel for reduction(max : mx) schedule(static)
        for (size_t i = 0; i < n; i++) mx = t[i] > mx ? t[i] : mx;
    } else {
        const uint32_t *t = (const uint32_t *)(const void *)base;
#pragma omp parallel for reduction(max : mx) schedule(static)
        for (size_t i = 0; i < n; i++) mx = t[i] > mx ? t[i] : mx;
    }
    return mx;
}

/* Every token id < vocab; the first one that is not is the error. */
static int scan_seg(const data_config *cfg, const data_seg *s, int esz, int vocab, fsdp_err *err) {
    if (esz == 1 ? vocab >= 256 : esz == 2 ? vocab >= 65536 : 0) return 0; /* every id fits */
    if (max_token(s, esz) < (uint32_t)vocab) return 0;
    size_t bad = 0;
    while (bad < s->n_tokens && data_seg_token(s, esz, bad) < (uint32_t)vocab) bad++;
    char hint[160] = "";
    if (cfg->kind == DATA_TOKENS && s->map_len >= 4 && le32_at(s->map) == DATA_LLMC_MAGIC)
        snprintf(hint, sizeof hint, " (the file starts with the llm.c header magic %d: use kind: llmc)",
                 DATA_LLMC_MAGIC);
    return fsdp_err_set(err, FSDP_E_FORMAT,
                        "data %s: token id %u at token %zu (byte offset %zu) is >= the model's vocab_size %d%s", s->path,
                        data_seg_token(s, esz, bad), bad, s->hdr + bad * (size_t)esz, vocab, hint);
}

int data_files_open(const data_config *cfg, int vocab, int scan, data_files *f, fsdp_err *err) {
    memset(f, 0, sizeof *f);
    f->token_bytes = cfg->kind == DATA_TEXT ? 1 : cfg->kind == DATA_LLMC ? 0 : cfg->token_bytes; /* llmc: its header's */
    glob_t g;
    int rc = data_glob(cfg, &g, err);
    if (rc) return rc;
    f->seg = calloc(g.gl_pathc, sizeof *f->seg);
    if (!f->seg) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; !rc && i < g.gl_pathc; i++) {
        data_seg *s = &f->seg[f->n++];
        if (!(s->path = strdup(g.gl_pathv[i]))) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        if (!rc) rc = map_seg(s, err);
        if (!rc) rc = size_seg(cfg, &f->token_bytes, s, err);
        if (!rc && scan && vocab > 0) rc = scan_seg(cfg, s, f->token_bytes, vocab, err);
    }
    globfree(&g);
    if (rc) data_files_close(f);
    return rc;
}

void data_files_close(data_files *f) {
    for (size_t i = 0; i < f->n; i++) {
        if (f->seg[i].owned) free((void *)f->seg[i].map);
        else if (f->seg[i].map) munmap((void *)f->seg[i].map, f->seg[i].map_len);
        free(f->seg[i].path);
    }
    free(f->seg);
    memset(f, 0, sizeof *f);
}
