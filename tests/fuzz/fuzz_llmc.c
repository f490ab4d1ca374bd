/* Fuzz the llm.c .bin shard reader (kind: llmc; through a memory file): header, size against the
 * token count, the vocabulary scan. What it opens must hold the invariants data_batch relies on (a
 * violation traps): the file is exactly the header and its token count of uint16, and every batch
 * drawn from it holds ids below the vocabulary, each label the input's next token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "train/data.h"
#include "tests/fuzz/fuzz.h"

static void check_batches(const data_config *c, int vocab) {
    data_source *d;
    fsdp_err err;
    if (data_open(c, vocab, 1, 0, &d, &err)) return;
    int32_t in[2 * 4], lab[2 * 4];
    for (uint64_t pos = 0; pos < 3; pos++) {
        if (data_batch(d, pos, in, lab, &err)) __builtin_trap(); /* scanned at open: cannot fail */
        for (int b = 0; b < 2; b++)
            for (int t = 0; t < 4; t++) {
                int32_t x = in[b * 4 + t], y = lab[b * 4 + t];
                if (x < 0 || x >= vocab || y < 0 || y >= vocab) __builtin_trap();
                if (t < 3 && in[b * 4 + t + 1] != y) __builtin_trap();
            }
    }
    data_close(d);
}

int fsdp_fuzz_llmc(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz.bin", 0);
    if (fd < 0) return 0;
    if (write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    data_config c;
    memset(&c, 0, sizeof c);
    c.kind = DATA_LLMC;
    snprintf(c.path, sizeof c.path, "/proc/self/fd/%d", fd);
    c.batch_size = 2;
    c.seq_len = 4;
    c.token_bytes = 2;
    fsdp_err err;
    if (data_check_files(&c, &err) == 0) {
        /* accepted: the header's count is exactly the payload */
        if (size < 1024) __builtin_trap();
        int32_t n;
        memcpy(&n, data + 8, 4);
        if (n < 0 || (size_t)n * 2 + 1024 != size) __builtin_trap();
    }
    check_batches(&c, 256);
    check_batches(&c, 70000);
    c.sequential = 1;
    check_batches(&c, 256);
    close(fd);
    return 0;
}
FSDP_FUZZ_ENTRY(fsdp_fuzz_llmc)
