/* The decode roofline with the caches in it: reads exactly the bytes one
 * decoded token of a MoE GGUF reads, from the file's own layout held in
 * memory, with the plainest loop (the read of corecheck.c), token after
 * token, and reports the rate.
 *
 *   replay FILE TOKENS THREADS < RANGES
 *
 * RANGES (written by scripts/bench_vs_llamacpp.sh from the GGUF tensor
 * table), one per line:
 *   used K            experts routed per token and layer
 *   dense OFF LEN     bytes read by every token (attention, norms, router,
 *                     output head)
 *   rows OFF LEN N    a table of N rows of which each token reads one (the
 *                     token embedding)
 *   experts L OFF LEN N   layer L's expert tensor of N experts; a token
 *                     reads K of its N equal slices
 * Each token picks K distinct experts per layer (seeded xorshift, uniform:
 * the bench model's routing is spread over all experts) and one embedding
 * row, and the threads split the token's bytes evenly.
 *
 * Two loops take turns, token by token: the plain one, and the same with
 * a software prefetch PREFETCH bytes ahead (2048 unless -DPREFETCH=N;
 * charm's kernels ask that far, common/src/prefetch.rs; on some machines
 * only a prefetch keeps enough lines in flight). After 8 warm-up tokens
 * each loop reads TOKENS timed ones, and the faster loop gives the rate:
 * GB/s, tok/s and bytes per token, a bound no weight-streaming decode loop
 * should beat.
 *
 * On a machine whose last-level cache holds a good part of the bytes every
 * token reads (the dense part, hot experts), this rate exceeds a plain
 * read of a buffer larger than the cache (corecheck), and it is what a
 * decode loop that only read its weights could reach.
 *
 * Prints: GB/s tok/s bytes_per_token sink plain_GB/s prefetch_GB/s (the
 * first two for the faster loop).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef struct { size_t off, len; } span;
typedef struct { int layer; size_t off, len, n; } table;

static uint8_t *file;
static span *reads;
static size_t nreads, cap;
static int nthreads;
static pthread_barrier_t bar;
static volatile int stop, mode; /* mode 1: prefetching loop */
#ifndef PREFETCH
#define PREFETCH 2048
#endif
static uint64_t sinks[256];

static void push(size_t off, size_t len) {
  if (nreads == cap) {
    cap = cap ? 2 * cap : 1024;
    reads = realloc(reads, cap * sizeof *reads);
    if (!reads) { perror("realloc"); exit(1); }
  }
  reads[nreads++] = (span){off, len};
}

/* Sums the 8-byte words of this thread's share of the token's reads. */
static void *run(void *arg) {
  int t = (int)(intptr_t)arg;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (;;) {
    pthread_barrier_wait(&bar);
    if (stop) break;
    size_t total = 0;
    for (size_t i = 0; i < nreads; i++) total += reads[i].len;
    size_t lo = total / nthreads * t, hi = t == nthreads - 1 ? total : total / nthreads * (t + 1);
    size_t at = 0;
    for (size_t i = 0; i < nreads && at < hi; i++) {
      size_t a = reads[i].off, b = reads[i].off + reads[i].len;
      size_t from = at, to = at + reads[i].len;
      at = to;
      if (to <= lo) continue;
      if (from < lo) a += lo - from;
      if (to > hi) b -= to - hi;
      const uint64_t *w = (const uint64_t *)(file + (a & ~(size_t)7));
      size_t words = (b - (a & ~(size_t)7)) / 8, k = 0;
      if (mode)
        for (; k + 8 <= words; k += 8) {
          __builtin_prefetch((const uint8_t *)(w + k) + PREFETCH);
          s0 += w[k] + w[k + 4]; s1 += w[k + 1] + w[k + 5]; s2 += w[k + 2] + w[k + 6]; s3 += w[k + 3] + w[k + 7];
        }
      for (; k + 4 <= words; k += 4) { s0 += w[k]; s1 += w[k + 1]; s2 += w[k + 2]; s3 += w[k + 3]; }
      for (; k < words; k++) s0 += w[k];
    }
    pthread_barrier_wait(&bar);
  }
  sinks[t & 255] = s0 + s1 + s2 + s3;
  return NULL;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc != 4) { fprintf(stderr, "usage: replay FILE TOKENS THREADS < RANGES\n"); return 2; }
  int tokens = atoi(argv[2]);
  nthreads = atoi(argv[3]);
  if (tokens < 1 || nthreads < 1 || nthreads > 256) { fprintf(stderr, "bad TOKENS or THREADS\n"); return 2; }

  span dense[4096]; size_t ndense = 0;
  table tabs[4096]; size_t ntabs = 0;
  table emb = {0, 0, 0, 0};
  int used = 0, layers = 0;
  char kind[16];
  while (scanf("%15s", kind) == 1) {
    if (!strcmp(kind, "used")) {
      if (scanf("%d", &used) != 1) return 2;
    } else if (!strcmp(kind, "dense") && ndense < 4096) {
      if (scanf("%zu %zu", &dense[ndense].off, &dense[ndense].len) != 2) return 2;
      ndense++;
    } else if (!strcmp(kind, "rows")) {
      if (scanf("%zu %zu %zu", &emb.off, &emb.len, &emb.n) != 3) return 2;
    } else if (!strcmp(kind, "experts") && ntabs < 4096) {
      table *x = &tabs[ntabs++];
      if (scanf("%d %zu %zu %zu", &x->layer, &x->off, &x->len, &x->n) != 4) return 2;
      if (x->layer + 1 > layers) layers = x->layer + 1;
    } else {
      fprintf(stderr, "bad range line: %s\n", kind);
      return 2;
    }
  }
  if (used < 1 || !ntabs) { fprintf(stderr, "no experts in the ranges\n"); return 2; }

  /* The whole file in anonymous memory on huge pages, as charm's copies are. */
  FILE *f = fopen(argv[1], "rb");
  if (!f) { perror(argv[1]); return 1; }
  fseek(f, 0, SEEK_END);
  size_t size = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  file = mmap(NULL, size + 64, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (file == MAP_FAILED) { perror("mmap"); return 1; }
  madvise(file, size, MADV_HUGEPAGE);
  if (fread(file, 1, size, f) != size) { perror("read"); return 1; }
  fclose(f);

  pthread_barrier_init(&bar, NULL, nthreads + 1);
  pthread_t th[256];
  for (int t = 0; t < nthreads; t++) pthread_create(&th[t], NULL, run, (void *)(intptr_t)t);

  uint64_t rng = 0x9e3779b97f4a7c15ull;
  double secs[2] = {0, 0}, bytes = 0;
  int *pick = malloc(sizeof(int) * 4096);
  for (int tok = 0; tok < 2 * tokens + 8; tok++) {
    nreads = 0;
    for (size_t i = 0; i < ndense; i++) push(dense[i].off, dense[i].len);
    if (emb.n) {
      rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
      size_t row = emb.len / emb.n;
      push(emb.off + row * (rng % emb.n), row);
    }
    for (int l = 0; l < layers; l++) {
      size_t n = 0;
      for (size_t i = 0; i < ntabs; i++)
        if (tabs[i].layer == l) n = tabs[i].n;
      if (!n) continue;
      if ((size_t)used > n || n > 4096) { fprintf(stderr, "bad expert count\n"); return 2; }
      for (int k = 0; k < used; k++) {
        int e, dup;
        do {
          rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
          e = (int)(rng % n);
          dup = 0;
          for (int j = 0; j < k; j++) dup |= pick[j] == e;
        } while (dup);
        pick[k] = e;
      }
      for (size_t i = 0; i < ntabs; i++) {
        if (tabs[i].layer != l) continue;
        size_t slice = tabs[i].len / tabs[i].n;
        for (int k = 0; k < used; k++) push(tabs[i].off + slice * pick[k], slice);
      }
    }
    if (tok == 8) bytes = 0;
    for (size_t i = 0; i < nreads; i++) bytes += reads[i].len;
    mode = tok & 1;
    double t = now();
    pthread_barrier_wait(&bar);
    pthread_barrier_wait(&bar);
    if (tok >= 8) secs[tok & 1] += now() - t;
  }
  bytes /= 2; /* per loop */
  double dt = secs[0] < secs[1] ? secs[0] : secs[1];
  stop = 1;
  pthread_barrier_wait(&bar);
  for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
  uint64_t s = 0;
  for (int t = 0; t < 256; t++) s += sinks[t];
  printf("%.2f %.2f %.0f %llu %.2f %.2f\n", bytes / dt / 1e9, tokens / dt, bytes / tokens, (unsigned long long)(s & 1),
         bytes / secs[0] / 1e9, bytes / secs[1] / 1e9);
  return 0;
}
