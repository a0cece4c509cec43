/*
 * mpi_hello: smallest useful MPI check for berth's tests.
 *
 * Build: mpicc -O2 -o mpi_hello tests/images/mpi_hello.c
 * Run:   srun --mpi=pmix -N2 -n4 ./mpi_hello
 *
 * Every rank prints "rank R of N on HOST". The ranks then sum their rank
 * numbers with MPI_Allreduce; rank 0 prints the result and every rank exits
 * with status 1 if the sum is not N*(N-1)/2.
 */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank = 0, size = 0;
    char host[256] = "?";
    long sum = 0, expected, mine;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof(host) - 1);

    printf("rank %d of %d on %s\n", rank, size, host);
    fflush(stdout);

    mine = rank;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    expected = (long)size * (size - 1) / 2;

    if (rank == 0) {
        printf("allreduce sum=%ld expected=%ld %s\n", sum, expected,
               sum == expected ? "ok" : "FAILED");
        fflush(stdout);
    }

    MPI_Finalize();
    return sum == expected ? 0 : 1;
}
