/* Point-to-point bandwidth between ranks 0 and 1 (berth bench/mpi.sh).
 * For each message size: REPS timed rounds of WINDOW non-blocking sends from
 * rank 0 to rank 1 and a 1-byte acknowledgement back; prints the median
 * bandwidth of the rounds, in MB/s (10^6 bytes per second).
 * Usage: mpi_bw [max_bytes]  (default 4 MiB) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define WINDOW 16
#define REPS 15

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int rank, size;
    long max = argc > 1 ? atol(argv[1]) : 4L << 20;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) {
        if (rank == 0) fprintf(stderr, "mpi_bw: needs 2 ranks\n");
        MPI_Finalize();
        return 2;
    }
    char *buf = malloc(max * WINDOW);
    char ack = 0;
    MPI_Request req[WINDOW];
    MPI_Status st[WINDOW];
    if (rank == 0) printf("# bytes MB/s(median of %d)\n", REPS);
    for (long bytes = 1024; bytes <= max; bytes *= 4) {
        double rates[REPS];
        for (int r = -2; r < REPS; r++) { /* two warm-up rounds */
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (rank == 0) {
                for (int w = 0; w < WINDOW; w++)
                    MPI_Isend(buf + w * bytes, (int)bytes, MPI_CHAR, 1, 1, MPI_COMM_WORLD, &req[w]);
                MPI_Waitall(WINDOW, req, st);
                MPI_Recv(&ack, 1, MPI_CHAR, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else if (rank == 1) {
                for (int w = 0; w < WINDOW; w++)
                    MPI_Irecv(buf + w * bytes, (int)bytes, MPI_CHAR, 0, 1, MPI_COMM_WORLD, &req[w]);
                MPI_Waitall(WINDOW, req, st);
                MPI_Send(&ack, 1, MPI_CHAR, 0, 2, MPI_COMM_WORLD);
            }
            double t = MPI_Wtime() - t0;
            if (r >= 0) rates[r] = (double)bytes * WINDOW / t / 1e6;
        }
        qsort(rates, REPS, sizeof rates[0], cmp);
        if (rank == 0) printf("%ld %.1f\n", bytes, rates[REPS / 2]);
        fflush(stdout);
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
