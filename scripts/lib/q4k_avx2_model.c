/* A C model of charm's AVX2 Q4_K loop over four activation rows
 * (common/src/gguf/qdot/tiled/x86.rs, `body_avx2` with scales formed
 * ahead), the activations in L1 and the codes in L2, to split the loop's time between its
 * integer products and its per-block float term (docs/kernels.md, "What
 * bounds it"). Variants: the whole loop; the integer sums only (the float
 * term replaced by one 32-bit add a row); the float term with the
 * activations' `dx * f32(S)` loaded instead of formed; the float term
 * without its min part `(dmin · mn) * (dx * f32(S))` (not Q4_K's result:
 * what that part costs).
 *
 *   gcc -O2 -mavx2 -mf16c scripts/lib/q4k_avx2_model.c -o /tmp/q4k_model
 *   taskset -c 0 /tmp/q4k_model
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define CHUNKS 32 /* an 8192-wide row */
#define ROWS 16   /* weight rows: 16 x 32 x 128 bytes of codes, in L2 */

static uint8_t codes[ROWS][CHUNKS][128] __attribute__((aligned(64)));
static float factors[ROWS][CHUNKS][16] __attribute__((aligned(64))); /* d·sc, dmin·mn */
static int8_t qt[4][CHUNKS * 256 + 64] __attribute__((aligned(64)));
static float dx[4][CHUNKS * 8] __attribute__((aligned(64)));
static int32_t tot[4][CHUNKS * 8] __attribute__((aligned(64)));
static float xs[4][CHUNKS * 8] __attribute__((aligned(64)));
static float out[ROWS][4][8];

enum { WHOLE, INTEGER, XS, NOMIN };

#define STEP(k, w0, w1, j)                                                              \
    t##k = _mm256_add_epi16(t##k, _mm256_add_epi16(                                     \
        _mm256_maddubs_epi16(w0, _mm256_load_si256((const __m256i *)(q##k + 32 * j))), \
        _mm256_maddubs_epi16(w1, _mm256_load_si256((const __m256i *)(q##k + 128 + 32 * j)))))

#define TERM(k)                                                                          \
    do {                                                                                 \
        __m256i i = _mm256_madd_epi16(t##k, ones);                                       \
        if (variant == INTEGER) {                                                        \
            ia##k = _mm256_add_epi32(ia##k, i);                                          \
        } else {                                                                         \
            __m256 x = _mm256_load_ps(dx[k] + 8 * c);                                    \
            if (variant == NOMIN) {                                                      \
                acc##k = _mm256_add_ps(acc##k, _mm256_mul_ps(_mm256_mul_ps(ds, x),         \
                                                             _mm256_cvtepi32_ps(i)));      \
                break;                                                                   \
            }                                                                            \
            __m256 s = variant == XS ? _mm256_load_ps(xs[k] + 8 * c)                     \
                : _mm256_mul_ps(x, _mm256_cvtepi32_ps(_mm256_load_si256(                 \
                      (const __m256i *)(tot[k] + 8 * c))));                              \
            acc##k = _mm256_add_ps(acc##k, _mm256_sub_ps(                                \
                _mm256_mul_ps(_mm256_mul_ps(ds, x), _mm256_cvtepi32_ps(i)),              \
                _mm256_mul_ps(dm, s)));                                                  \
        }                                                                                \
    } while (0)

static inline __attribute__((always_inline)) void row(int r, int variant) {
    const __m256i m = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    __m256i ia0 = _mm256_setzero_si256(), ia1 = ia0, ia2 = ia0, ia3 = ia0;
    for (int c = 0; c < CHUNKS; c++) {
        const int8_t *q0 = qt[0] + 256 * c, *q1 = qt[1] + 256 * c, *q2 = qt[2] + 256 * c,
                     *q3 = qt[3] + 256 * c;
        __m256i t0 = _mm256_setzero_si256(), t1 = t0, t2 = t0, t3 = t0;
        for (int j = 0; j < 4; j++) {
            __m256i w = _mm256_load_si256((const __m256i *)(codes[r][c] + 32 * j));
            __m256i w0 = _mm256_and_si256(w, m), w1 = _mm256_and_si256(_mm256_srli_epi16(w, 4), m);
            STEP(0, w0, w1, j);
            STEP(1, w0, w1, j);
            STEP(2, w0, w1, j);
            STEP(3, w0, w1, j);
        }
        __m256 ds = _mm256_load_ps(factors[r][c]), dm = _mm256_load_ps(factors[r][c] + 8);
        TERM(0);
        TERM(1);
        TERM(2);
        TERM(3);
    }
    if (variant == INTEGER) {
        acc0 = _mm256_castsi256_ps(ia0), acc1 = _mm256_castsi256_ps(ia1);
        acc2 = _mm256_castsi256_ps(ia2), acc3 = _mm256_castsi256_ps(ia3);
    }
    _mm256_storeu_ps(out[r][0], acc0);
    _mm256_storeu_ps(out[r][1], acc1);
    _mm256_storeu_ps(out[r][2], acc2);
    _mm256_storeu_ps(out[r][3], acc3);
}

static __attribute__((noinline)) void whole(int r) { row(r, WHOLE); }
static __attribute__((noinline)) void integer(int r) { row(r, INTEGER); }
static __attribute__((noinline)) void loaded_xs(int r) { row(r, XS); }
static __attribute__((noinline)) void nomin(int r) { row(r, NOMIN); }


int main(void) {
    uint32_t s = 1;
#define RND() (s = s * 1103515245u + 12345u, s >> 16)
    for (size_t i = 0; i < sizeof codes; i++) ((uint8_t *)codes)[i] = RND();
    for (size_t i = 0; i < sizeof qt; i++) ((int8_t *)qt)[i] = (int8_t)(RND() % 255 - 127);
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < CHUNKS; c++)
            for (int l = 0; l < 16; l++) factors[r][c][l] = (RND() % 64) * 0.001f;
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < CHUNKS * 8; l++) {
            dx[k][l] = (RND() % 100 + 1) * 0.0001f;
            tot[k][l] = RND() % 2000 - 1000;
            xs[k][l] = dx[k][l] * tot[k][l];
        }
    void (*f[4])(int) = {whole, integer, loaded_xs, nomin};
    const char *name[4] = {"whole loop", "integer sums only", "dx * f32(S) loaded", "without the min term"};
    double best[4] = {0};
    for (int round = 0; round < 7; round++)
        for (int v = 0; v < 4; v++) {
            long reps = 20000;
            double t0 = now();
            for (long n = 0; n < reps; n++)
                for (int r = 0; r < ROWS; r++) f[v](r);
            double g = reps * ROWS * CHUNKS * 1024.0 / (now() - t0) / 1e9;
            if (g > best[v]) best[v] = g;
        }
    for (int v = 0; v < 4; v++) printf("%-22s %6.1f G multiply-adds/s (best of 7)\n", name[v], best[v]);
    float sum = 0;
    for (int r = 0; r < ROWS; r++) sum += out[r][0][0];
    return sum == 12345.f;
}
