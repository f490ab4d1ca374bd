/* Launch environment: Slurm's task count without an MPI launcher. */
#include "runtime/launch.h"

#include <errno.h>
#include <stdlib.h>

long launch_env_count(const char *name) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long n = strtol(s, &end, 10);
    if (errno || *end || n < 1 || n > 1L << 24) return 0;
    return n;
}

long launch_slurm_ntasks(void) { return launch_env_count("SLURM_NTASKS"); }

int launch_world(int mpi_world) {
    if (mpi_world > 1) return mpi_world;
    long n = launch_slurm_ntasks();
    return n > 1 ? (int)n : 1;
}

int launch_check_slurm(int launched_by_mpi, fsdp_err *err) {
    long n = launch_slurm_ntasks();
    if (n <= 1 || launched_by_mpi) return 0;
    return fsdp_err_set(err, FSDP_E_INVALID,
                        "SLURM_NTASKS is %ld, but this fsdp-run was not started by srun or mpirun as one of %ld ranks "
                        "(it would train alone as rank 0 of 1): launch it inside the allocation with `srun --mpi=pmix "
                        "fsdp-run RECIPE.yaml` (or `mpirun -np %ld fsdp-run RECIPE.yaml`); for a single-rank run, ask "
                        "Slurm for one task (--ntasks=1) or unset SLURM_NTASKS",
                        n, n, n);
}
