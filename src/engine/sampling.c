/* sampling.c -- next-token choice from float32 logits: greedy, or temperature with
 * optional top-k and top-p (nucleus) filtering, drawn from a seeded splitmix64 stream
 * (the same seed gives the same tokens). */
#include <math.h>

#include "internal.h"

void ote_sampler_init(ote_sampler *s, float temperature, int top_k, float top_p, uint64_t seed) {
  s->temperature = temperature;
  s->top_k = top_k;
  s->top_p = top_p;
  s->rng_state = seed;
}

static uint64_t next_u64(uint64_t *st) {
  uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int argmax(const float *x, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

/* idx before jdx: higher probability first, ties by the lower index (a total order, so the
 * same logits always give the same ranking). */
static int before(const float *p, int i, int j) { return p[i] > p[j] || (p[i] == p[j] && i < j); }

static void sift_down(const float *p, int *idx, int root, int n) {
  for (;;) {
    int c = 2 * root + 1;
    if (c >= n) return;
    if (c + 1 < n && before(p, idx[c], idx[c + 1])) c++;
    if (!before(p, idx[root], idx[c])) return;
    int t = idx[root]; idx[root] = idx[c]; idx[c] = t;
    root = c;
  }
}

/* Heap sort of idx[0..n) into ranking order (no globals, no recursion). */
static void rank_by_prob(const float *p, int *idx, int n) {
  for (int i = n / 2 - 1; i >= 0; i--) sift_down(p, idx, i, n);
  for (int end = n - 1; end > 0; end--) {
    int t = idx[0]; idx[0] = idx[end]; idx[end] = t;
    sift_down(p, idx, 0, end);
  }
}

int ote_sample(ote_sampler *s, const float *logits, int vocab, float *p, int *idx) {
  if (!s || s->temperature <= 0 || s->top_k == 1 || !p || !idx) return argmax(logits, vocab);
  float mx = logits[argmax(logits, vocab)];
  double sum = 0;
  for (int i = 0; i < vocab; i++) {
    p[i] = expf((logits[i] - mx) / s->temperature);
    sum += p[i];
    idx[i] = i;
  }
  int n = vocab;
  int filter = (s->top_k > 0 && s->top_k < vocab) || (s->top_p > 0 && s->top_p < 1);
  if (filter) {
    rank_by_prob(p, idx, vocab);
    if (s->top_k > 0 && s->top_k < n) n = s->top_k;
    if (s->top_p > 0 && s->top_p < 1) {
      double total = 0, cum = 0;
      for (int i = 0; i < n; i++) total += p[idx[i]];
      for (int i = 0; i < n; i++) {
        cum += p[idx[i]];
        if (cum >= s->top_p * total) { n = i + 1; break; }
      }
    }
    sum = 0;
    for (int i = 0; i < n; i++) sum += p[idx[i]];
  }
  double u = (double)(next_u64(&s->rng_state) >> 11) * (1.0 / 9007199254740992.0) * sum, cum = 0;
  for (int i = 0; i < n; i++) {
    cum += p[idx[i]];
    if (u < cum) return idx[i];
  }
  return idx[n - 1];
}
