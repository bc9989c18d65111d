/*
 * bench/tlb_probe.cu -- what one dependent global load costs after the decode step's kind of
 * weight stream, and whether that cost is the L2 (data evicted) or the address translation
 * (the GPU's TLBs thrashed by gigabytes of other pages).
 *
 * The batch-1 decode's attention kernels spend microseconds per dependent load round in the
 * engine (docs/PERFORMANCE.md: the paged decode's block-table round ~2.1 us, the merge's 9-13
 * us after its PDL wait; the attention + o_proj kernel's first key-loop pass ~8 us with every
 * K / V row already landed), and bench/code_fetch_probe.cu showed that code up to ~60 KB
 * costs nothing extra after a 256 MB stream. A DRAM round trip is ~0.6-0.8 us; a TLB miss
 * whose page-table entries are themselves out of the L2 costs several of them. This
 * measures it directly.
 *
 * A one-thread kernel follows a chain of 32 dependent 4-byte loads (ld.global.cg: the L2,
 * not the L1), each to its own 128-byte line, laid out (a) one node per 2 MB page of a 64 MB
 * buffer, (b) all 32 in one 2 MB page (4 KB apart). It stamps %globaltimer around the chain
 * (ns; the launch not included). Before each timed chain, in each mode:
 *   warm       the chain once (its lines and translations cached)
 *   s256       a 256 MB read stream at the default L2 policy (the lines evicted; 128 pages)
 *   s256_ef    the same stream read evict-first (ld.global.cs): the lines stay in the L2
 *   big        a BIG read stream (default 16 GB, 8192 pages) at the default policy
 *   big_ef     the same evict-first: lines kept, translations thrashed -- the TLB's share
 *   big_ef_pf  big_ef, then a 32-thread kernel that prefetches (prefetch.global.L2) every
 *              node's line in parallel: does a parallel touch warm the translations?
 *   big_ef_ld  the same with a load (ld.global.cg) in place of the prefetch
 *   big_pf     big (lines evicted too), then the parallel prefetch
 * Median of 15 of each. Prints ns per load.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a bench/tlb_probe.cu -o /tmp/tlb_probe
 *   /tmp/tlb_probe [--big-gb 16] [--json FILE [--commit SHA] [--command TEXT]]
 */
#include <algorithm>
#include <vector>

#include "probe_common.cuh"

enum { kNodes = 32 };

static __device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

static __device__ __forceinline__ unsigned ld_cg(const unsigned *p) {
  unsigned v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/* the chain: idx = T[idx], kNodes times; out[0] = ns, out[1] = the last index (kept live) */
__global__ void chase(const unsigned *T, unsigned start, unsigned long long *out) {
  unsigned idx = start;
  const unsigned long long t0 = gtimer();
#pragma unroll 1
  for (int i = 0; i < kNodes; i++) idx = ld_cg(T + idx);
  const unsigned long long t1 = gtimer();
  out[0] = t1 - t0;
  out[1] = idx;
}

/* one thread a node: prefetch (ld = 0) or load (ld = 1) its line, in parallel */
__global__ void touch(const unsigned *T, const unsigned *offs, int ld, unsigned *sink) {
  const unsigned *p = T + offs[threadIdx.x];
  if (ld) {
    const unsigned v = ld_cg(p);
    if (v == 0xFFFFFFFFu) sink[0] = v; /* (never) */
  } else {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p) : "memory");
  }
}

int main(int argc, char **argv) {
  probe_args pa;
  probe_args_parse(argc, argv, &pa);
  double big_gb = 16.0;
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--big-gb")) big_gb = atof(argv[++i]);
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));

  const size_t page = (size_t)2 << 20, tbytes = kNodes * page;
  const size_t small = (size_t)256 << 20, big = (size_t)(big_gb * (double)(1ull << 30)) & ~(size_t)0xFFFF;
  unsigned *T = nullptr, *offs_d = nullptr, *sink = nullptr;
  unsigned long long *out = nullptr;
  float4 *buf = nullptr;
  CK(cudaMalloc(&T, tbytes));
  CK(cudaMalloc(&buf, big));
  CK(cudaMemset(buf, 0, big));
  CK(cudaMalloc(&offs_d, kNodes * sizeof(unsigned)));
  CK(cudaMalloc(&sink, sizeof(unsigned)));
  CK(cudaMalloc(&out, 2 * sizeof(unsigned long long)));

  FILE *json = pa.json ? fopen(pa.json, "w") : nullptr;
  if (json) {
    char extra[96];
    snprintf(extra, sizeof extra, "\"big_stream_gb\": %.1f, \"nodes\": %d, ", big_gb, kNodes);
    probe_json_head(json, "tlb_probe", prop.name, pa, extra);
  }
  printf("%s, %d SMs; %d dependent ld.global.cg, ns per load (median of 15); big stream %.1f GB\n",
         prop.name, sms, kNodes, big_gb);
  const char *modes[] = {"warm", "s256", "s256_ef", "big", "big_ef", "big_ef_pf", "big_ef_ld", "big_pf"};
  const int nmodes = 8;
  printf("%-22s", "layout");
  for (int m = 0; m < nmodes; m++) printf(" | %9s", modes[m]);
  printf("\n");
  bool first = true;
  for (int layout = 0; layout < 2; layout++) {
    /* the node offsets (u32 units): a page each (a line offset that varies), or 4 KB apart */
    std::vector<unsigned> offs(kNodes), host(tbytes / sizeof(unsigned), 0u);
    for (int k = 0; k < kNodes; k++) {
      const size_t b = layout == 0 ? k * page + (size_t)((k * 37) % 16) * 128 : (size_t)k * 4096 + (size_t)((k * 37) % 16) * 128;
      offs[k] = (unsigned)(b / sizeof(unsigned));
    }
    for (int k = 0; k < kNodes; k++) host[offs[k]] = offs[(k + 1) % kNodes];
    CK(cudaMemcpy(T, host.data(), tbytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(offs_d, offs.data(), kNodes * sizeof(unsigned), cudaMemcpyHostToDevice));
    const char *lname = layout == 0 ? "a node per 2 MB page" : "32 nodes in one page";
    printf("%-22s", lname);
    double med[nmodes];
    for (int m = 0; m < nmodes; m++) {
      std::vector<double> t;
      for (int r = 0; r < 15; r++) {
        switch (m) {
        case 0: chase<<<1, 1>>>(T, offs[0], out); break;
        case 1: stream_read<<<sms * 4, 512>>>(buf, small / 16, (float *)sink, 0); break;
        case 2: stream_read<<<sms * 4, 512>>>(buf, small / 16, (float *)sink, 1); break;
        case 3: case 7: stream_read<<<sms * 4, 512>>>(buf, big / 16, (float *)sink, 0); break;
        default: stream_read<<<sms * 4, 512>>>(buf, big / 16, (float *)sink, 1); break;
        }
        if (m == 5 || m == 7) touch<<<1, kNodes>>>(T, offs_d, 0, sink);
        if (m == 6) touch<<<1, kNodes>>>(T, offs_d, 1, sink);
        chase<<<1, 1>>>(T, offs[0], out);
        CK(cudaGetLastError());
        unsigned long long h[2];
        CK(cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost));
        if (h[1] != offs[0]) {
          fprintf(stderr, "tlb_probe: the chain ended at %llu, not %u\n", h[1], offs[0]);
          return 1;
        }
        t.push_back((double)h[0] / kNodes);
      }
      std::sort(t.begin(), t.end());
      med[m] = t[t.size() / 2];
      printf(" | %9.1f", med[m]);
      fflush(stdout);
    }
    printf("\n");
    if (json) {
      fprintf(json, "%s  {\"layout\": \"%s\"", first ? "" : ",\n", lname);
      for (int m = 0; m < nmodes; m++) fprintf(json, ", \"%s_ns_per_load\": %.1f", modes[m], med[m]);
      fprintf(json, "}");
      first = false;
    }
  }
  if (json) {
    fprintf(json, "\n]}\n");
    fclose(json);
  }
  CK(cudaFree(T));
  CK(cudaFree(buf));
  CK(cudaFree(offs_d));
  CK(cudaFree(sink));
  CK(cudaFree(out));
  return 0;
}
