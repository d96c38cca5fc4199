/*
 * hp CPU health check: one MPI_Allreduce (MPI_SUM) over an array of doubles.
 *
 * Every rank fills the array with rank+1, so after the reduction each element
 * must equal size*(size+1)/2 (exact in double for any realistic size). Each
 * rank checks every element and prints exactly one line on stdout:
 *
 *   HP-MPI rank=R size=S host=H sum=X expected=Y ok=1
 *
 * sum is the first element that differs from expected (or element 0 when all
 * match); ok is 1 when every element matched, else 0. The format is parsed by
 * orchestrator.health.parsers.parse_mpi_allreduce. Exit status: 0 ok, 1 wrong
 * result, 2 bad argument or out of memory.
 *
 * Build: mpicc -O2 -o mpi_allreduce mpi_allreduce.c
 * Usage: mpi_allreduce [ELEMENTS]   (default 1048576 doubles = 8 MiB)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, size, ok = 1;
    long i, n = 1L << 20;
    char host[256] = "unknown";

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc > 1)
        n = strtol(argv[1], NULL, 10);
    gethostname(host, sizeof host - 1);

    double *in = NULL, *out = NULL;
    if (n >= 1 && n <= 0x7fffffffL) {
        in = malloc(n * sizeof *in);
        out = malloc(n * sizeof *out);
    }
    if (!in || !out) {
        fprintf(stderr, "mpi_allreduce: rank %d on %s: bad element count or out of memory\n", rank, host);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (i = 0; i < n; i++)
        in[i] = rank + 1.0;

    MPI_Allreduce(in, out, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);

    double expected = (double)size * (size + 1) / 2.0, sum = out[0];
    for (i = 0; i < n; i++) {
        if (out[i] != expected) {
            ok = 0;
            sum = out[i];
            break;
        }
    }
    printf("HP-MPI rank=%d size=%d host=%s sum=%.17g expected=%.17g ok=%d\n",
           rank, size, host, sum, expected, ok);
    fflush(stdout);
    free(in);
    free(out);
    MPI_Finalize();
    return ok ? 0 : 1;
}
