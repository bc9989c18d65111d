/*
 * bench/probe_common.cuh -- what the one-file GPU probes (bench/code_fetch_probe.cu,
 * bench/tlb_probe.cu) share: a CUDA call checked (exit 1 naming it), the L2 flush they time
 * things after, and the top of their JSON record in ../shared/BENCH.md's layout.
 */
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <cuda_runtime.h>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

/* the L2 flush: read n4 float4, at the default policy (cs = 0) or evict-first (cs = 1,
 * ld.global.cs) */
__global__ void stream_read(const float4 *p, size_t n4, float *sink, int cs) {
  float a = 0.0f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
    const float4 v = cs ? __ldcs(p + i) : p[i];
    a += v.x + v.y + v.z + v.w;
  }
  if (a == 12345.678f) sink[0] = a; /* (never: keeps the loads) */
}

/* --json FILE, --commit SHA and --command TEXT from argv (the other arguments untouched) */
struct probe_args {
  const char *json = nullptr, *commit = "unknown", *command = "";
};
static inline void probe_args_parse(int argc, char **argv, probe_args *pa) {
  for (int i = 1; i + 1 < argc; i++) {
    if (!strcmp(argv[i], "--json")) pa->json = argv[++i];
    else if (!strcmp(argv[i], "--commit")) pa->commit = argv[++i];
    else if (!strcmp(argv[i], "--command")) pa->command = argv[++i];
  }
}

/* s as a JSON string's contents (quotes and backslashes escaped, control characters
 * dropped) */
static inline void json_str(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if ((unsigned char)*s >= 0x20) fputc(*s, f);
  }
}

/* the record's top (BENCH.md: bench, device, date, commit, command, ceilings -- none
 * measured by a probe) up to the opening of "rows"; the caller writes the rows and "]}" */
static inline void probe_json_head(FILE *f, const char *bench, const char *device,
                                   const probe_args &pa, const char *extra) {
  char date[16];
  const time_t now = time(nullptr);
  strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
  fprintf(f, "{\"bench\": \"%s\", \"device\": \"", bench);
  json_str(f, device);
  fprintf(f, "\", \"date\": \"%s\", \"commit\": \"", date);
  json_str(f, pa.commit);
  fprintf(f, "\", \"command\": \"");
  json_str(f, pa.command);
  fprintf(f, "\", \"ceilings\": {}, %s\"rows\": [\n", extra ? extra : "");
}
