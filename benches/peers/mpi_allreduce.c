/*
 * OpenMPI's own MPI_Allreduce, timed the way `cargo xtask bench-collectives` times mirra's
 * collectives (xtask/src/ranks.rs), so that the two can stand in one table:
 *
 *   per iteration: every rank writes its inputs afresh, MPI_Barrier, then the all-reduce
 *   alone is timed on every rank; an iteration's time is the slowest rank's; after each
 *   iteration every rank counts the elements that differ from the closed form (#wrong).
 *
 * Inputs are rank r's element i = (i % 1024) + r + 1 (f32), whose sums are exact in any
 * order; the sum over n ranks is n (i % 1024 + 1) + n (n - 1) / 2.
 *
 * Usage: mpirun -np N mpi_allreduce BYTES:WARMUP:ITERS ...
 * Rank 0 prints one JSON object per size:
 *   {"bytes": B, "count": C, "warmup": W, "seconds": [s, ...], "wrong": K}
 * with the slowest rank's seconds of each timed iteration and the wrong elements of every
 * iteration (warm-up included) summed over ranks. Built by xtask with mpicc into target/.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define PERIOD 1024

static float input(int rank, long i) { return (float)((i % PERIOD) + rank + 1); }

static float sum(int n, long i) {
    return (float)((long)n * (i % PERIOD + 1) + (long)n * (n - 1) / 2);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    for (int a = 1; a < argc; a++) {
        long bytes = 0, warmup = 0, iters = 0;
        if (sscanf(argv[a], "%ld:%ld:%ld", &bytes, &warmup, &iters) != 3 || bytes < 4 ||
            warmup < 0 || iters < 1) {
            if (rank == 0)
                fprintf(stderr, "mpi_allreduce: bad size spec `%s` (BYTES:WARMUP:ITERS)\n",
                        argv[a]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        long count = bytes / 4;
        float *buf = malloc((size_t)count * sizeof(float));
        double *mine = malloc((size_t)iters * sizeof(double));
        double *slowest = malloc((size_t)iters * sizeof(double));
        if (!buf || !mine || !slowest) {
            fprintf(stderr, "mpi_allreduce: rank %d: out of memory at %ld bytes\n", rank, bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        long long wrong = 0;
        for (long it = 0; it < warmup + iters; it++) {
            for (long i = 0; i < count; i++) buf[i] = input(rank, i);
            MPI_Barrier(MPI_COMM_WORLD);
            double t = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double dt = MPI_Wtime() - t;
            if (it >= warmup) mine[it - warmup] = dt;
            for (long i = 0; i < count; i++) wrong += buf[i] != sum(n, i);
        }
        MPI_Reduce(mine, slowest, (int)iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        long long all_wrong = 0;
        MPI_Reduce(&wrong, &all_wrong, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("{\"bytes\": %ld, \"count\": %ld, \"warmup\": %ld, \"seconds\": [", count * 4,
                   count, warmup);
            for (long k = 0; k < iters; k++) printf("%s%.9e", k ? ", " : "", slowest[k]);
            printf("], \"wrong\": %lld}\n", all_wrong);
            fflush(stdout);
        }
        free(buf);
        free(mine);
        free(slowest);
    }
    MPI_Finalize();
    return 0;
}
