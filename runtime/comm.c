/* Communicator backends: single (no MPI) and MPI. Large messages are split so that no
 * MPI count exceeds INT_MAX. */
#include "runtime/comm.h"
#include "runtime/comm_impl.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


#define COMM_CHUNK ((size_t)1 << 30)

int comm_launched_by_mpi(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

int comm_create_single(comm **out, fsdp_err *err) {
    comm *c = calloc(1, sizeof *c);
    if (!c) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    c->size = 1;
    c->local_size = 1;
    c->nodes = 1;
    *out = c;
    return 0;
}

static int mpi_err(fsdp_err *err, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return fsdp_err_set(err, FSDP_E_COMM, "%s failed: %.*s", what, len, msg);
}

int comm_create(comm **out, fsdp_err *err) {
    *out = NULL;
    if (!comm_launched_by_mpi()) return comm_create_single(out, err);
    comm *c = calloc(1, sizeof *c);
    if (!c) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) {
            free(c);
            return fsdp_err_set(err, FSDP_E_COMM, "MPI_Init failed (code %d)", rc);
        }
        c->owns_mpi = 1;
    }
    c->is_mpi = 1;
    MPI_Comm_dup(MPI_COMM_WORLD, &c->world);
    /* Errors come back as codes: every call site turns them into a message, and the
     * scheduler ends the job deliberately (comm_abort) rather than hanging. */
    MPI_Comm_set_errhandler(c->world, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->world, &c->rank);
    MPI_Comm_size(c->world, &c->size);
    int rc = comm_find_nodes(c, err);
    if (rc) {
        comm_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

void comm_destroy(comm *c) {
    if (!c) return;
    comm_dev_release(c);
    if (c->is_mpi) {
        MPI_Comm_free(&c->world);
        if (c->owns_mpi) {
            int fin = 0;
            MPI_Finalized(&fin);
            if (!fin) MPI_Finalize();
        }
    }
    free(c->stale);
    free(c);
}

int comm_rank(const comm *c) { return c->rank; }
int comm_size(const comm *c) { return c->size; }
int comm_local_rank(const comm *c) { return c->local_rank; }
int comm_local_size(const comm *c) { return c->local_size; }
int comm_node(const comm *c) { return c->node; }
int comm_nodes(const comm *c) { return c->nodes; }
int comm_spans_nodes(const comm *c) { return c->spans_nodes; }
const char *comm_backend(const comm *c) { return c->is_mpi ? "mpi" : "single"; }

int comm_barrier(comm *c, fsdp_err *err) {
    comm_count(c, COMM_K_OTHER, 0);
    if (!c->is_mpi) return 0;
    int rc = MPI_Barrier(c->world);
    return rc == MPI_SUCCESS ? 0 : mpi_err(err, rc, "MPI_Barrier");
}

int comm_bcast(comm *c, void *buf, size_t bytes, int root, fsdp_err *err) {
    comm_count(c, COMM_K_BCAST, bytes);
    if (!c->is_mpi) return 0;
    for (size_t off = 0; off < bytes; off += COMM_CHUNK) {
        size_t n = bytes - off < COMM_CHUNK ? bytes - off : COMM_CHUNK;
        int rc = MPI_Bcast((char *)buf + off, (int)n, MPI_BYTE, root, c->world);
        if (rc != MPI_SUCCESS) return mpi_err(err, rc, "MPI_Bcast");
    }
    return 0;
}

static MPI_Datatype mpi_type(comm_dtype dt, size_t *esz) {
    switch (dt) {
    case COMM_F32: *esz = 4; return MPI_FLOAT;
    case COMM_F64: *esz = 8; return MPI_DOUBLE;
    case COMM_I64: *esz = 8; return MPI_INT64_T;
    default: *esz = 1; return MPI_UINT8_T;
    }
}

int comm_allreduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op, fsdp_err *err) {
    size_t esz;
    MPI_Datatype t = mpi_type(dt, &esz);
    comm_count(c, COMM_K_ALLREDUCE, count * esz);
    if (!c->is_mpi) return 0;
    MPI_Op o = op == COMM_SUM ? MPI_SUM : op == COMM_MAX ? MPI_MAX : MPI_MIN;
    for (size_t off = 0; off < count; off += COMM_CHUNK) {
        size_t n = count - off < COMM_CHUNK ? count - off : COMM_CHUNK;
        int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * esz, (int)n, t, o, c->world);
        if (rc != MPI_SUCCESS) return mpi_err(err, rc, "MPI_Allreduce");
    }
    return 0;
}

int comm_allgatherv(comm *c, const void *send, void *recv, const size_t *recv_bytes, fsdp_err *err) {
    comm_count(c, COMM_K_ALLGATHER, comm_sum_sizes(recv_bytes, c->size, 1));
    if (!c->is_mpi) {
        if (recv != send) memmove(recv, send, recv_bytes[0]);
        return 0;
    }
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += recv_bytes[r];
    if (total <= (size_t)INT_MAX) {
        int *counts = malloc((size_t)c->size * sizeof *counts), *displs = malloc((size_t)c->size * sizeof *displs);
        if (!counts || !displs) {
            free(counts);
            free(displs);
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        }
        size_t off = 0;
        for (int r = 0; r < c->size; r++) {
            counts[r] = (int)recv_bytes[r];
            displs[r] = (int)off;
            off += recv_bytes[r];
        }
        const void *s = send;
        if ((const char *)send == (char *)recv + displs[c->rank]) s = MPI_IN_PLACE;
        int rc = MPI_Allgatherv(s, counts[c->rank], MPI_BYTE, recv, counts, displs, MPI_BYTE, c->world);
        free(counts);
        free(displs);
        return rc == MPI_SUCCESS ? 0 : mpi_err(err, rc, "MPI_Allgatherv");
    }
    /* Beyond 2 GiB in total: each rank broadcasts its block in pieces. */
    size_t off = 0;
    for (int r = 0; r < c->size; r++) {
        char *dst = (char *)recv + off;
        if (r == c->rank && (const char *)send != dst) memmove(dst, send, recv_bytes[r]);
        int rc = comm_bcast(c, dst, recv_bytes[r], r, err);
        if (rc) return rc;
        off += recv_bytes[r];
    }
    return 0;
}

int comm_reduce_scatterv_f32(comm *c, const float *send, float *recv, const size_t *counts, fsdp_err *err) {
    comm_count(c, COMM_K_REDUCE_SCATTER, comm_sum_sizes(counts, c->size, sizeof(float)));
    if (!c->is_mpi) {
        if (recv != send) memmove(recv, send, counts[0] * sizeof(float));
        return 0;
    }
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += counts[r];
    if (total <= (size_t)INT_MAX) {
        int *ic = malloc((size_t)c->size * sizeof *ic);
        if (!ic) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        for (int r = 0; r < c->size; r++) ic[r] = (int)counts[r];
        int rc = MPI_Reduce_scatter(send, recv, ic, MPI_FLOAT, MPI_SUM, c->world);
        free(ic);
        return rc == MPI_SUCCESS ? 0 : mpi_err(err, rc, "MPI_Reduce_scatter");
    }
    size_t off = 0;
    for (int r = 0; r < c->size; r++) {
        for (size_t k = 0; k < counts[r]; k += COMM_CHUNK) {
            size_t n = counts[r] - k < COMM_CHUNK ? counts[r] - k : COMM_CHUNK;
            int rc = MPI_Reduce(send + off + k, r == c->rank ? recv + k : NULL, (int)n, MPI_FLOAT, MPI_SUM, r,
                                c->world);
            if (rc != MPI_SUCCESS) return mpi_err(err, rc, "MPI_Reduce");
        }
        off += counts[r];
    }
    return 0;
}

int comm_scatterv_f32(comm *c, const float *send, float *recv, const size_t *counts, int root, fsdp_err *err) {
    comm_count(c, COMM_K_OTHER, comm_sum_sizes(counts, c->size, sizeof(float)));
    if (!c->is_mpi) {
        if (recv != send) memmove(recv, send, counts[0] * sizeof(float));
        return 0;
    }
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += counts[r];
    if (total <= (size_t)INT_MAX) {
        int *ic = malloc((size_t)c->size * sizeof *ic), *id = malloc((size_t)c->size * sizeof *id);
        if (!ic || !id) {
            free(ic);
            free(id);
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        }
        size_t off = 0;
        for (int r = 0; r < c->size; r++) {
            ic[r] = (int)counts[r];
            id[r] = (int)off;
            off += counts[r];
        }
        int rc = MPI_Scatterv(send, ic, id, MPI_FLOAT, recv, ic[c->rank], MPI_FLOAT, root, c->world);
        free(ic);
        free(id);
        return rc == MPI_SUCCESS ? 0 : mpi_err(err, rc, "MPI_Scatterv");
    }
    /* beyond INT_MAX elements: point to point, in pieces */
    if (c->rank == root) {
        size_t off = 0;
        for (int r = 0; r < c->size; r++) {
            if (r == root) {
                memmove(recv, send + off, counts[r] * sizeof(float));
            } else {
                for (size_t k = 0; k < counts[r]; k += COMM_CHUNK) {
                    size_t m = counts[r] - k < COMM_CHUNK ? counts[r] - k : COMM_CHUNK;
                    int rc = MPI_Send(send + off + k, (int)m, MPI_FLOAT, r, 7312, c->world);
                    if (rc != MPI_SUCCESS) return mpi_err(err, rc, "MPI_Send");
                }
            }
            off += counts[r];
        }
        return 0;
    }
    for (size_t k = 0; k < counts[c->rank]; k += COMM_CHUNK) {
        size_t m = counts[c->rank] - k < COMM_CHUNK ? counts[c->rank] - k : COMM_CHUNK;
        int rc = MPI_Recv(recv + k, (int)m, MPI_FLOAT, root, 7312, c->world, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_err(err, rc, "MPI_Recv");
    }
    return 0;
}

int comm_gather_bytes(comm *c, const void *send, size_t n, int root, void **out, size_t **sizes, fsdp_err *err) {
    comm_count(c, COMM_K_OTHER, n);
    *out = NULL;
    if (sizes) *sizes = NULL;
    int is_root = c->rank == root;
    uint64_t mine = n;
    uint64_t *all = is_root ? malloc((size_t)c->size * sizeof *all) : NULL;
    if (is_root && !all) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    if (c->is_mpi) {
        int rc = MPI_Gather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, root, c->world);
        if (rc != MPI_SUCCESS) {
            free(all);
            return mpi_err(err, rc, "MPI_Gather");
        }
    } else {
        all[0] = mine;
    }
    size_t total = 0;
    if (is_root)
        for (int r = 0; r < c->size; r++) total += (size_t)all[r];
    char *buf = NULL;
    size_t *sz = NULL;
    if (is_root) {
        buf = malloc(total ? total : 1);
        sz = malloc((size_t)c->size * sizeof *sz);
        if (!buf || !sz) {
            free(buf);
            free(sz);
            free(all);
            /* other ranks are about to send: abort rather than leave them hanging */
            if (c->is_mpi) comm_abort(c, 1);
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        }
        for (int r = 0; r < c->size; r++) sz[r] = (size_t)all[r];
    }
    if (!c->is_mpi) {
        memcpy(buf, send, n);
    } else if (is_root) {
        size_t off = 0;
        for (int r = 0; r < c->size; r++) {
            if (r == root) {
                memcpy(buf + off, send, n);
            } else {
                for (size_t k = 0; k < sz[r]; k += COMM_CHUNK) {
                    size_t m = sz[r] - k < COMM_CHUNK ? sz[r] - k : COMM_CHUNK;
                    int rc = MPI_Recv(buf + off + k, (int)m, MPI_BYTE, r, 7311, c->world, MPI_STATUS_IGNORE);
                    if (rc != MPI_SUCCESS) {
                        free(buf);
                        free(sz);
                        free(all);
                        return mpi_err(err, rc, "MPI_Recv");
                    }
                }
            }
            off += sz[r];
        }
    } else {
        for (size_t k = 0; k < n; k += COMM_CHUNK) {
            size_t m = n - k < COMM_CHUNK ? n - k : COMM_CHUNK;
            int rc = MPI_Send((const char *)send + k, (int)m, MPI_BYTE, root, 7311, c->world);
            if (rc != MPI_SUCCESS) return mpi_err(err, rc, "MPI_Send");
        }
    }
    free(all);
    *out = buf;
    if (sizes) *sizes = sz;
    else free(sz);
    return 0;
}

int comm_agree(comm *c, int status, int *who, fsdp_err *err) {
    if (who) *who = status ? c->rank : -1;
    if (!c->is_mpi) return status;
    /* lowest failing rank wins: reduce (failed ? rank : size) with MIN */
    int64_t v[2] = {status ? c->rank : c->size, 0};
    int rc = comm_allreduce(c, v, 1, COMM_I64, COMM_MIN, err);
    if (rc) return rc;
    if (v[0] == c->size) return 0;
    int64_t st = status;
    rc = comm_bcast(c, &st, sizeof st, (int)v[0], err);
    if (rc) return rc;
    if (who) *who = (int)v[0];
    return (int)st;
}

uint64_t comm_calls(const comm *c, comm_kind k) { return c && (unsigned)k < (unsigned)COMM_KINDS ? c->calls[k] : 0; }

uint64_t comm_bytes(const comm *c, comm_kind k) { return c && (unsigned)k < (unsigned)COMM_KINDS ? c->bytes[k] : 0; }

uint64_t comm_calls_total(const comm *c) {
    uint64_t n = 0;
    for (int k = 0; k < COMM_KINDS; k++) n += comm_calls(c, (comm_kind)k);
    return n;
}

void comm_abort(comm *c, int code) {
    if (c && c->is_mpi) {
        fflush(stdout);
        fflush(stderr);
        /* should MPI_Abort not end this process (a launcher stuck in its teardown), SIGALRM's default action
         * does within 30 s, and the launcher then sees a rank gone: the job ends either way */
        alarm(30);
        MPI_Abort(c->world, code ? code : 1);
    }
}
