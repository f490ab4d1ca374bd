/* Save identities of DCP checkpoints (see dcp_gen.h). */
#include "ckpt/dcp_gen.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define MAGIC "fsdp-run save id"
#define SAVE_ID_PREFIX "fsdp-run:"

static void random_bytes(unsigned char *b, size_t n) {
    if (getrandom(b, n, 0) == (ssize_t)n) return;
    FILE *f = fopen("/dev/urandom", "rb");
    size_t got = f ? fread(b, 1, n, f) : 0;
    if (f) fclose(f);
    if (got == n) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 44);
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        b[i] = (unsigned char)(x >> 56);
    }
}

void dcp_gen_new(dcp_gen *g, uint32_t num) {
    unsigned char b[DCP_GEN_ID_LEN / 2];
    random_bytes(b, sizeof b);
    memset(g, 0, sizeof *g);
    g->num = num;
    for (size_t i = 0; i < sizeof b; i++) snprintf(g->id + 2 * i, 3, "%02x", b[i]);
}

void dcp_gen_trailer(const dcp_gen *g, int rank, unsigned char out[DCP_GEN_TRAILER]) {
    char t[DCP_GEN_TRAILER + 1];
    snprintf(t, sizeof t, "%s%.32s rank %09d\n", MAGIC, g->id, rank % 1000000000);
    memcpy(out, t, DCP_GEN_TRAILER);
}

static int is_id(const char *s) {
    for (int i = 0; i < DCP_GEN_ID_LEN; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

int dcp_gen_read_trailer(int fd, uint64_t size, char id[DCP_GEN_ID_LEN + 1]) {
    id[0] = '\0';
    char t[DCP_GEN_TRAILER];
    if (size < DCP_GEN_TRAILER || pread(fd, t, sizeof t, (off_t)(size - DCP_GEN_TRAILER)) != (ssize_t)sizeof t)
        return 0;
    size_t m = sizeof MAGIC - 1;
    if (memcmp(t, MAGIC, m) || !is_id(t + m) || memcmp(t + m + DCP_GEN_ID_LEN, " rank ", 6) ||
        t[DCP_GEN_TRAILER - 1] != '\n')
        return 0;
    memcpy(id, t + m, DCP_GEN_ID_LEN);
    id[DCP_GEN_ID_LEN] = '\0';
    return 1;
}

void dcp_gen_save_id(const dcp_gen *g, char *out, size_t cap) { snprintf(out, cap, "%s%s", SAVE_ID_PREFIX, g->id); }

void dcp_gen_from_save_id(const char *save_id, char id[DCP_GEN_ID_LEN + 1]) {
    id[0] = '\0';
    size_t m = sizeof SAVE_ID_PREFIX - 1;
    if (!save_id || strncmp(save_id, SAVE_ID_PREFIX, m) || strlen(save_id) != m + DCP_GEN_ID_LEN ||
        !is_id(save_id + m))
        return;
    memcpy(id, save_id + m, DCP_GEN_ID_LEN + 1);
}

uint64_t dcp_hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
