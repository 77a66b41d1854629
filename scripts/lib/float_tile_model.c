// A C model of the BF16 prefill tile's inner loop
// (common/src/kernels/float_tile_x512.rs), every operand in L1, beside the
// core's fused multiply-add peak: what the tile could reach on this CPU.
//
//   gcc -O3 -march=x86-64-v4 scripts/lib/float_tile_model.c -o float_tile_model && ./float_tile_model
//
// Prints G multiply-adds per second on one thread for:
//   peak        24 independent 512-bit vfmadd chains (no loads);
//   widen RxT   R bf16 weight rows x T f32 activation rows, each 16 bf16
//               widened with vpmovzxwd + vpslld (what the tile does);
//   evenodd RxT the same with 32 bf16 per 64-byte load, even elements
//               `x << 16`, odd `x & 0xffff0000` (activations assumed
//               reordered to match).
// Each pair of rows keeps two 16-lane accumulators, as the tile does.
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define K 2048
static uint16_t W[8][K] __attribute__((aligned(64)));
static float X[8][K] __attribute__((aligned(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void peak(void) {
    __m512 a[24];
    for (int i = 0; i < 24; i++) a[i] = _mm512_set1_ps(i * 1e-3f);
    const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-6f);
    const long iters = 50000000;
    double best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        for (long it = 0; it < iters; it++) {
#pragma GCC unroll 24
            for (int i = 0; i < 24; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);
        }
        double t = now() - t0;
        if (t < best) best = t;
    }
    float sum = 0;
    for (int i = 0; i < 24; i++) sum += _mm512_reduce_add_ps(a[i]);
    printf("%-12s %5.1f G/s (checksum %g)\n", "peak", iters * 24.0 * 16 / best / 1e9, sum);
}

#define TILE(NAME, R, T, WEIGHT)                                                               \
    static void NAME(float *out) {                                                             \
        __m512 acc[R][T][2];                                                                   \
        const __m512i hi16 = _mm512_set1_epi32((int)0xffff0000);                               \
        (void)hi16;                                                                            \
        for (int r = 0; r < R; r++)                                                            \
            for (int t = 0; t < T; t++) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();     \
        for (int i = 0; i < K; i += 32) {                                                      \
            for (int h = 0; h < 2; h++) {                                                      \
                __m512 x[T];                                                                   \
                for (int t = 0; t < T; t++) x[t] = _mm512_load_ps(&X[t][i + 16 * h]);          \
                for (int r = 0; r < R; r++) {                                                  \
                    __m512 w = WEIGHT;                                                         \
                    for (int t = 0; t < T; t++) acc[r][t][h] = _mm512_fmadd_ps(w, x[t], acc[r][t][h]); \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        for (int r = 0; r < R; r++)                                                            \
            for (int t = 0; t < T; t++)                                                        \
                out[r * T + t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][t][0], acc[r][t][1])); \
    }

#define WIDEN _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_load_si256((const __m256i *)&W[r][i + 16 * h])), 16))
#define EVENODD                                                                                 \
    (h == 0 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_load_si512((const void *)&W[r][i]), 16)) \
            : _mm512_castsi512_ps(_mm512_and_si512(_mm512_load_si512((const void *)&W[r][i]), hi16)))

TILE(widen_3x4, 3, 4, WIDEN)
TILE(widen_2x6, 2, 6, WIDEN)
TILE(evenodd_3x4, 3, 4, EVENODD)
TILE(evenodd_2x6, 2, 6, EVENODD)

static void run(const char *name, void (*f)(float *), int rows, int acts) {
    float out[64];
    double best = 1e9;
    for (int rep = 0; rep < 7; rep++) {
        double t0 = now();
        for (int it = 0; it < 20000; it++) {
            f(out);
            __asm__ volatile("" : : "r"(out) : "memory");
        }
        double t = now() - t0;
        if (t < best) best = t;
    }
    printf("%-12s %5.1f G/s\n", name, 20000.0 * rows * acts * K / best / 1e9);
}

int main(void) {
    for (int r = 0; r < 8; r++)
        for (int i = 0; i < K; i++) {
            W[r][i] = rand() & 0x3fff;
            X[r][i] = (rand() % 100) * 0.01f;
        }
    peak();
    run("widen 3x4", widen_3x4, 3, 4);
    run("widen 2x6", widen_2x6, 2, 6);
    run("evenodd 3x4", evenodd_3x4, 3, 4);
    run("evenodd 2x6", evenodd_2x6, 2, 6);
    return 0;
}
