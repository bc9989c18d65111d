/* example.c -- RMSNorm of a [2, 8] float32 tensor on the CPU backend, then a bad
 * call to show the error message. Build: see examples/c/CMakeLists.txt or Makefile. */
#include <stdio.h>

#include <ops_transformer.h>

int main(void) {
  enum { ROWS = 2, H = 8 };
  float x[ROWS][H], weight[H], out[ROWS][H];
  for (int i = 0; i < H; i++) weight[i] = 0.5f + 0.25f * (float)i;
  for (int r = 0; r < ROWS; r++)
    for (int i = 0; i < H; i++) x[r][i] = (float)(r + 1) * (float)(i - 3);

  /* DLPack views of the caller's memory: NULL strides mean contiguous row-major. */
  int64_t x_shape[2] = {ROWS, H}, w_shape[1] = {H};
  DLDataType f32 = {kDLFloat, 32, 1};
  DLDevice cpu = {kDLCPU, 0};
  DLTensor tx = {.data = x, .device = cpu, .ndim = 2, .dtype = f32, .shape = x_shape};
  DLTensor tw = {.data = weight, .device = cpu, .ndim = 1, .dtype = f32, .shape = w_shape};
  DLTensor tout = {.data = out, .device = cpu, .ndim = 2, .dtype = f32, .shape = x_shape};

  ot_context *ctx = NULL;
  if (ot_context_create(NULL, &ctx) != OT_OK) { /* NULL options: the CPU, all threads */
    fprintf(stderr, "ot_context_create: %s\n", ot_last_error());
    return 1;
  }
  /* out = x / sqrt(mean(x^2) + eps) * weight; no residual, rstd not saved. */
  ot_status st = ot_rmsnorm_forward(ctx, &tx, NULL, &tw, 1e-6f, &tout, NULL, NULL);
  if (st != OT_OK) {
    fprintf(stderr, "ot_rmsnorm_forward: %s: %s\n", ot_status_string(st), ot_last_error());
    ot_context_destroy(ctx);
    return 1;
  }
  int ok = 1;
  for (int r = 0; r < ROWS; r++) {
    double ms = 0; /* out / weight has mean square 1 */
    for (int i = 0; i < H; i++) ms += (double)(out[r][i] / weight[i]) * (out[r][i] / weight[i]) / H;
    printf("row %d: out[0..3] = %+.4f %+.4f %+.4f %+.4f  mean((out/w)^2) = %.5f\n", r,
           out[r][0], out[r][1], out[r][2], out[r][3], ms);
    if (ms < 0.999 || ms > 1.001) ok = 0;
  }

  /* A weight of the wrong length is rejected with a message naming the argument. */
  int64_t bad_shape[1] = {H - 1};
  tw.shape = bad_shape;
  st = ot_rmsnorm_forward(ctx, &tx, NULL, &tw, 1e-6f, &tout, NULL, NULL);
  printf("bad call: %s: %s\n", ot_status_string(st), ot_last_error());
  if (st != OT_ERR_INVALID_ARGUMENT) ok = 0;

  printf("ops_transformer %s (CUDA backend %s): %s\n", ot_version_string(),
         ot_has_cuda() ? "built" : "not built", ok ? "ok" : "FAILED");
  ot_context_destroy(ctx);
  return ok ? 0 : 1;
}
