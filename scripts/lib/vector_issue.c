/* How many of the integer kernels' vector operations one core issues a
 * nanosecond, alone and mixed, and what an f16 widening beside each fused
 * multiply-add costs: the figures docs/benchmarks.md ("What bounds the
 * AVX2 K-quant loops") and docs/kernels.md (attention's weighted values)
 * quote. Independent operations on registers only (no memory but one
 * cached line), so each line is an issue rate, not a latency.
 *
 *   gcc -O2 -mavx2 -mf16c scripts/lib/vector_issue.c -o /tmp/vector_issue
 *   taskset -c 0 /tmp/vector_issue
 */
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static float line[16] __attribute__((aligned(64)));

#define N 100000000L
#define RATE(label, per, body)                                              \
    do {                                                                    \
        double t0 = now();                                                  \
        for (long i = 0; i < N; i++) __asm__ volatile(body ::"r"(line)      \
            : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",       \
              "xmm7", "xmm8", "xmm9");                                      \
        printf("%-44s %5.2f per ns\n", label, N * (double)(per) / (now() - t0) / 1e9); \
    } while (0)

#define X8(op) op " %%ymm14,%%ymm15,%%ymm0\n\t" op " %%ymm14,%%ymm15,%%ymm1\n\t" \
    op " %%ymm14,%%ymm15,%%ymm2\n\t" op " %%ymm14,%%ymm15,%%ymm3\n\t"          \
    op " %%ymm14,%%ymm15,%%ymm4\n\t" op " %%ymm14,%%ymm15,%%ymm5\n\t"          \
    op " %%ymm14,%%ymm15,%%ymm6\n\t" op " %%ymm14,%%ymm15,%%ymm7\n\t"

int main(void) {
    double t0 = now();
    for (long i = 0; i < N; i++)
        __asm__ volatile("add $1,%%rax\n\tadd $1,%%rax\n\tadd $1,%%rax\n\tadd $1,%%rax" ::: "rax");
    printf("%-44s %5.2f per ns (about the clock in GHz)\n", "dependent integer adds", N * 4.0 / (now() - t0) / 1e9);
    RATE("vpmaddubsw", 8, X8("vpmaddubsw"));
    RATE("vpmaddwd", 8, X8("vpmaddwd"));
    RATE("vpsignb", 8, X8("vpsignb"));
    RATE("vfmadd231ps", 8, X8("vfmadd231ps"));
    RATE("2 vpmaddubsw, 2 vpmaddwd, 2 vpsignb, 2 vpaddd", 8,
         "vpmaddubsw %%ymm14,%%ymm15,%%ymm0\n\tvpmaddwd %%ymm14,%%ymm15,%%ymm1\n\t"
         "vpmaddubsw %%ymm14,%%ymm15,%%ymm2\n\tvpmaddwd %%ymm14,%%ymm15,%%ymm3\n\t"
         "vpsignb %%ymm14,%%ymm15,%%ymm4\n\tvpsignb %%ymm14,%%ymm15,%%ymm5\n\t"
         "vpaddd %%ymm14,%%ymm15,%%ymm6\n\tvpaddd %%ymm14,%%ymm15,%%ymm7\n\t");
    RATE("fmadd, one vcvtph2ps each (fmadds)", 4,
         "vcvtph2ps (%0),%%ymm8\n\tvfmadd231ps %%ymm8,%%ymm15,%%ymm0\n\t"
         "vcvtph2ps 16(%0),%%ymm9\n\tvfmadd231ps %%ymm9,%%ymm15,%%ymm1\n\t"
         "vcvtph2ps (%0),%%ymm8\n\tvfmadd231ps %%ymm8,%%ymm15,%%ymm2\n\t"
         "vcvtph2ps 16(%0),%%ymm9\n\tvfmadd231ps %%ymm9,%%ymm15,%%ymm3\n\t");
    RATE("fmadd, one vcvtph2ps per four (fmadds)", 8,
         "vcvtph2ps (%0),%%ymm8\n\tvfmadd231ps %%ymm8,%%ymm15,%%ymm0\n\tvfmadd231ps %%ymm8,%%ymm14,%%ymm1\n\t"
         "vfmadd231ps %%ymm8,%%ymm13,%%ymm2\n\tvfmadd231ps %%ymm8,%%ymm12,%%ymm3\n\t"
         "vcvtph2ps 16(%0),%%ymm9\n\tvfmadd231ps %%ymm9,%%ymm15,%%ymm4\n\tvfmadd231ps %%ymm9,%%ymm14,%%ymm5\n\t"
         "vfmadd231ps %%ymm9,%%ymm13,%%ymm6\n\tvfmadd231ps %%ymm9,%%ymm12,%%ymm7\n\t");
    return 0;
}
