/* How this process was launched: the world size a recipe is validated for, and a Slurm allocation
 * of several tasks entered without a launcher (which would otherwise run silently as one rank). */
#ifndef FSDP_RUNTIME_LAUNCH_H
#define FSDP_RUNTIME_LAUNCH_H

#include "fsdp/error.h"

/* Environment variable `name` as a positive count (0: unset, or not an integer in [1, 2^24]). */
long launch_env_count(const char *name);
/* SLURM_NTASKS as a number (0: unset or not a positive integer). */
long launch_slurm_ntasks(void);

/* The world a recipe is checked for: mpi_world when launched by MPI (mpi_world > 1), else
 * SLURM_NTASKS when set, else 1. */
int launch_world(int mpi_world);

/* A run (not validate or --dry-run) inside a Slurm allocation of SLURM_NTASKS > 1 tasks that was not
 * started by srun/mpirun as one of them: an error (FSDP_E_INVALID) saying how to launch. */
int launch_check_slurm(int launched_by_mpi, fsdp_err *err);

#endif
