/*
 * _C.c -- the CPython extension module that binds the ops-transformer C API.
 *
 * One thin wrapper per public op: the arguments arrive positionally (METH_FASTCALL),
 * tensors are turned into stack DLTensors without copying, the op runs, and a failed
 * status raises ops_transformer.Error carrying ot_last_error()'s message. Outputs are
 * allocated by the Python layer (ops.py); nothing here allocates tensor memory.
 *
 * Tensor arguments may be:
 *  - None: passed to the op as NULL;
 *  - a torch.Tensor (fast path, torch is not linked): exported with torch's C++
 *    torch._C._to_dlpack when available, else data_ptr(), shape, stride(), dtype and
 *    the device are read through their Python attributes;
 *  - any other DLPack producer (NumPy arrays, ...): its __dlpack__() capsule is
 *    borrowed for the call and released by the capsule's own destructor.
 *
 * Every wrapper takes the CUDA stream as its first argument: an int (0 = the legacy
 * default stream), or None for torch's current stream of the tensors' device (looked
 * up only for CUDA tensors); it is applied to the context of that device. CPU calls run
 * without the GIL, so other Python threads progress while a kernel runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>
#include <time.h>

#include <ops_transformer.h>

#define MAX_DIMS 8 /* the library's limit (OT_MAX_DIMS) */
#define MAX_CUDA_DEVICES 64

/* A tensor argument converted to a DLTensor; `keep` owns what the view borrows. */
typedef struct tensor_arg {
  DLTensor t;
  int64_t shape[MAX_DIMS];
  int64_t strides[MAX_DIMS];
  PyObject *keep;
  int present;
} tensor_arg;

static PyObject *ot_error_type;    /* ops_transformer.Error (subclass of RuntimeError) */
static PyObject *torch_tensor_type; /* torch.Tensor, once _register_torch was called */
static PyObject *torch_dtype_map;   /* {torch.dtype: (DLDataTypeCode, bits)} */
static PyObject *torch_stream_of;   /* device ordinal -> torch's current cudaStream_t */
static PyObject *torch_to_dlpack;   /* torch._C._to_dlpack, or NULL */
static ot_context *cpu_context;
static ot_context *cuda_contexts[MAX_CUDA_DEVICES];
/* ot_context_set_arena of each CUDA context: the arena's capsule (kept alive while
 * attached), and the size of the arena a context gets on its next use when
 * config.memory_allocator == "arena" (0: none). */
static PyObject *cuda_context_arenas[MAX_CUDA_DEVICES];
static size_t context_arena_bytes;
#define ARENA_CAPSULE "ops_transformer.arena"
static void arena_capsule_free(PyObject *cap);

static PyObject *s_data_ptr, *s_shape, *s_stride, *s_dtype, *s_is_cpu, *s_device,
    *s_get_device, *s_dlpack, *s_status;

/* ---------------------------------------------------------------------------------- */
/* Errors                                                                             */
/* ---------------------------------------------------------------------------------- */

static void raise_error(const char *message, const char *status) {
  PyObject *msg = PyUnicode_FromString(message);
  if (!msg) return;
  PyObject *exc = PyObject_CallOneArg(ot_error_type, msg);
  Py_DECREF(msg);
  if (!exc) return;
  PyObject *st = PyUnicode_FromString(status);
  if (st) {
    PyObject_SetAttr(exc, s_status, st);
    Py_DECREF(st);
  }
  PyErr_SetObject(ot_error_type, exc);
  Py_DECREF(exc);
}

static PyObject *raise_status(ot_status status) {
  const char *msg = ot_last_error();
  raise_error(msg && *msg ? msg : ot_status_string(status), ot_status_string(status));
  return NULL;
}

static int arg_error(const char *op, int index, const char *what) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s: argument %d: %s", op, index, what);
  raise_error(buf, ot_status_string(OT_ERR_INVALID_ARGUMENT));
  return -1;
}

/* ---------------------------------------------------------------------------------- */
/* Tensors                                                                            */
/* ---------------------------------------------------------------------------------- */

static int int64_tuple(PyObject *seq, int64_t *out, int *n) {
  PyObject *fast = PySequence_Fast(seq, "expected a sequence");
  if (!fast) return -1;
  Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
  if (len > MAX_DIMS) {
    Py_DECREF(fast);
    *n = (int)len;
    return 1;
  }
  PyObject **items = PySequence_Fast_ITEMS(fast);
  for (Py_ssize_t i = 0; i < len; i++) {
    out[i] = PyLong_AsLongLong(items[i]);
    if (out[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return -1;
    }
  }
  *n = (int)len;
  Py_DECREF(fast);
  return 0;
}

static int from_torch(const char *op, int index, PyObject *obj, tensor_arg *a) {
  /* dtype */
  PyObject *dtype = PyObject_GetAttr(obj, s_dtype);
  if (!dtype) return -1;
  PyObject *code = torch_dtype_map ? PyDict_GetItemWithError(torch_dtype_map, dtype) : NULL;
  if (!code) {
    if (!PyErr_Occurred()) {
      PyObject *r = PyObject_Str(dtype);
      char buf[160];
      snprintf(buf, sizeof buf, "dtype %s is not supported (float32, float16, bfloat16, "
               "int32, int64)", r ? PyUnicode_AsUTF8(r) : "?");
      Py_XDECREF(r);
      PyErr_Clear();
      Py_DECREF(dtype);
      return arg_error(op, index, buf);
    }
    Py_DECREF(dtype);
    return -1;
  }
  a->t.dtype.code = (uint8_t)PyLong_AsLong(PyTuple_GET_ITEM(code, 0));
  a->t.dtype.bits = (uint8_t)PyLong_AsLong(PyTuple_GET_ITEM(code, 1));
  a->t.dtype.lanes = 1;
  Py_DECREF(dtype);

  /* device: get_device() is -1 on the CPU (and on devices other than CUDA, which
   * is_cpu tells apart), the ordinal on CUDA. */
  PyObject *dev_index = PyObject_CallMethodNoArgs(obj, s_get_device);
  if (!dev_index) return -1;
  long ordinal = PyLong_AsLong(dev_index);
  Py_DECREF(dev_index);
  if (ordinal >= 0) {
    a->t.device.device_type = kDLCUDA;
    a->t.device.device_id = (int32_t)ordinal;
  } else {
    PyObject *is_cpu = PyObject_GetAttr(obj, s_is_cpu);
    if (!is_cpu) return -1;
    int cpu = is_cpu == Py_True;
    Py_DECREF(is_cpu);
    if (!cpu) {
      PyObject *dev = PyObject_GetAttr(obj, s_device);
      PyObject *r = dev ? PyObject_Str(dev) : NULL;
      char buf[160];
      snprintf(buf, sizeof buf, "device %s is not supported (cpu or cuda)",
               r ? PyUnicode_AsUTF8(r) : "?");
      Py_XDECREF(r);
      Py_XDECREF(dev);
      PyErr_Clear();
      return arg_error(op, index, buf);
    }
    a->t.device.device_type = kDLCPU;
    a->t.device.device_id = 0;
  }

  /* shape and strides */
  PyObject *shape = PyObject_GetAttr(obj, s_shape);
  if (!shape) return -1;
  int ndim = 0, ndim2 = 0;
  int rc = int64_tuple(shape, a->shape, &ndim);
  Py_DECREF(shape);
  if (rc < 0) return -1;
  if (rc > 0) return arg_error(op, index, "more than 8 dimensions");
  PyObject *stride = PyObject_CallMethodNoArgs(obj, s_stride);
  if (!stride) return -1;
  rc = int64_tuple(stride, a->strides, &ndim2);
  Py_DECREF(stride);
  if (rc < 0) return -1;

  PyObject *ptr = PyObject_CallMethodNoArgs(obj, s_data_ptr);
  if (!ptr) return -1;
  a->t.data = PyLong_AsVoidPtr(ptr);
  Py_DECREF(ptr);
  if (PyErr_Occurred()) return -1;
  a->t.ndim = ndim;
  a->t.shape = a->shape;
  a->t.strides = a->strides;
  a->t.byte_offset = 0;
  return 0;
}

static int from_dlpack(const char *op, int index, PyObject *obj, tensor_arg *a) {
  PyObject *meth = PyObject_GetAttr(obj, s_dlpack);
  if (!meth) {
    PyErr_Clear();
    char buf[200];
    snprintf(buf, sizeof buf, "expected a tensor (torch.Tensor, NumPy array or a DLPack "
             "producer) or None, got %s", Py_TYPE(obj)->tp_name);
    return arg_error(op, index, buf);
  }
  PyObject *capsule = PyObject_CallNoArgs(meth);
  Py_DECREF(meth);
  if (!capsule) return -1;
  DLManagedTensor *m = (DLManagedTensor *)PyCapsule_GetPointer(capsule, "dltensor");
  if (!m) {
    Py_DECREF(capsule);
    return -1;
  }
  /* The capsule is not renamed "used_dltensor": its destructor frees the tensor when
   * `keep` is released after the call. */
  a->keep = capsule;
  a->t = m->dl_tensor;
  if (a->t.ndim > MAX_DIMS) return arg_error(op, index, "more than 8 dimensions");
  return 0;
}

/* Converts args[index] (a tensor or None). */
static int tensor_from(const char *op, int index, PyObject *obj, tensor_arg *a) {
  memset(&a->t, 0, sizeof a->t);
  a->keep = NULL;
  a->present = 0;
  if (obj == Py_None) return 0;
  a->present = 1;
  if (torch_tensor_type && PyObject_TypeCheck(obj, (PyTypeObject *)torch_tensor_type)) {
    /* torch's C++ DLPack export reads everything in one call, faster than the five
     * attribute reads of from_torch; from_torch remains for what it refuses (meta
     * tensors, odd dtypes) and explains why. */
    if (torch_to_dlpack) {
      PyObject *capsule = PyObject_CallOneArg(torch_to_dlpack, obj);
      if (capsule) {
        DLManagedTensor *m = (DLManagedTensor *)PyCapsule_GetPointer(capsule, "dltensor");
        if (m && m->dl_tensor.ndim <= MAX_DIMS) {
          a->keep = capsule;
          a->t = m->dl_tensor;
          return 0;
        }
        Py_DECREF(capsule);
      }
      PyErr_Clear();
    }
    return from_torch(op, index, obj, a);
  }
  return from_dlpack(op, index, obj, a);
}

static const DLTensor *T(const tensor_arg *a) { return a->present ? &a->t : NULL; }

/* ---------------------------------------------------------------------------------- */
/* Argument parsing: a format of one letter per argument after the stream:            */
/*   T tensor or None, f float, i int, L int64                                        */
/* ---------------------------------------------------------------------------------- */

typedef struct call {
  const char *op;
  ot_context *ctx;
  int ntensors;
  tensor_arg tensors[12];
  double f[8];
  long long i[8];
} call;

static void call_release(call *c) {
  for (int k = 0; k < c->ntensors; k++) Py_CLEAR(c->tensors[k].keep);
}

/* Give CUDA context `ctx` (device d) a new arena of context_arena_bytes. */
static int attach_new_arena(ot_context *ctx, int d) {
  ot_arena *a = NULL;
  ot_status st = ot_arena_create(ctx, context_arena_bytes, &a);
  if (st == OT_OK) {
    st = ot_context_set_arena(ctx, a);
    if (st != OT_OK) ot_arena_destroy(a);
  }
  if (st != OT_OK) {
    raise_status(st);
    return -1;
  }
  PyObject *cap = PyCapsule_New(a, ARENA_CAPSULE, arena_capsule_free);
  if (!cap) {
    ot_context_set_arena(ctx, NULL);
    ot_arena_destroy(a);
    return -1;
  }
  cuda_context_arenas[d] = cap;
  return 0;
}

/* Detach every CUDA context's arena (each is destroyed with its last reference). */
static void detach_context_arenas(void) {
  for (int d = 0; d < MAX_CUDA_DEVICES; d++) {
    if (!cuda_context_arenas[d]) continue;
    if (cuda_contexts[d]) ot_context_set_arena(cuda_contexts[d], NULL);
    Py_CLEAR(cuda_context_arenas[d]);
  }
}

static ot_context *context_for(const char *op, DLDevice dev, PyObject *stream) {
  if (dev.device_type == kDLCPU) return cpu_context;
  if (dev.device_id < 0 || dev.device_id >= MAX_CUDA_DEVICES) {
    arg_error(op, 0, "CUDA device ordinal out of range");
    return NULL;
  }
  ot_context *ctx = cuda_contexts[dev.device_id];
  if (!ctx) {
    ot_context_options opt = ot_context_default_options();
    opt.device_type = kDLCUDA;
    opt.device_id = dev.device_id;
    ot_status st = ot_context_create(&opt, &ctx);
    if (st != OT_OK) {
      raise_status(st);
      return NULL;
    }
    cuda_contexts[dev.device_id] = ctx;
  }
  /* stream None: torch's current stream of that device. */
  PyObject *owned = NULL;
  if (stream == Py_None) {
    if (!torch_stream_of) {
      arg_error(op, 0, "a CUDA tensor needs an explicit stream without torch");
      return NULL;
    }
    PyObject *ord = PyLong_FromLong(dev.device_id);
    if (!ord) return NULL;
    owned = stream = PyObject_CallOneArg(torch_stream_of, ord);
    Py_DECREF(ord);
    if (!stream) return NULL;
  }
  void *s = PyLong_AsVoidPtr(stream);
  Py_XDECREF(owned);
  if (PyErr_Occurred()) return NULL;
  ot_status st = ot_context_set_stream(ctx, s);
  if (st != OT_OK) {
    raise_status(st);
    return NULL;
  }
  if (context_arena_bytes && !cuda_context_arenas[dev.device_id] &&
      attach_new_arena(ctx, dev.device_id) < 0)
    return NULL;
  return ctx;
}

static int parse(call *c, const char *op, const char *fmt, PyObject *const *args,
                 Py_ssize_t nargs) {
  Py_ssize_t want = (Py_ssize_t)strlen(fmt) + 1;
  c->op = op;
  c->ntensors = 0;
  c->ctx = NULL;
  if (nargs != want) {
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", op, want, nargs);
    return -1;
  }
  int nf = 0, ni = 0;
  const tensor_arg *first = NULL;
  for (Py_ssize_t k = 1; k < want; k++) {
    PyObject *o = args[k];
    switch (fmt[k - 1]) {
      case 'T': {
        tensor_arg *a = &c->tensors[c->ntensors++];
        if (tensor_from(op, (int)k, o, a) < 0) return -1;
        if (a->present && !first) first = a;
        break;
      }
      case 'f':
        c->f[nf] = PyFloat_AsDouble(o);
        if (c->f[nf] == -1.0 && PyErr_Occurred()) return -1;
        nf++;
        break;
      case 'i':
      case 'L':
        c->i[ni] = PyLong_AsLongLong(o);
        if (c->i[ni] == -1 && PyErr_Occurred()) return -1;
        ni++;
        break;
      default:
        PyErr_SetString(PyExc_SystemError, "bad format");
        return -1;
    }
  }
  DLDevice dev = {kDLCPU, 0};
  if (first) dev = first->t.device;
  c->ctx = context_for(op, dev, args[0]);
  return c->ctx ? 0 : -1;
}

/* Runs EXPR (an ot_status expression) with the GIL released on the CPU. */
#define RUN(c, EXPR)                                                   \
  do {                                                                 \
    ot_status st_;                                                     \
    if (ot_context_device((c).ctx).device_type == kDLCPU) {            \
      Py_BEGIN_ALLOW_THREADS st_ = (EXPR);                             \
      Py_END_ALLOW_THREADS                                             \
    } else {                                                           \
      st_ = (EXPR);                                                    \
    }                                                                  \
    call_release(&(c));                                                \
    if (st_ != OT_OK) return raise_status(st_);                        \
    Py_RETURN_NONE;                                                    \
  } while (0)

#define PARSE(c, op, fmt)                                   \
  call c;                                                   \
  if (parse(&c, op, fmt, args, nargs) < 0) {                \
    call_release(&c);                                       \
    return NULL;                                            \
  }

#define TS(c, k) T(&(c).tensors[k])

/* ---------------------------------------------------------------------------------- */
/* Ops                                                                                */
/* ---------------------------------------------------------------------------------- */

/* (stream, x, residual, weight, eps, out, residual_out, rstd) */
static PyObject *py_rmsnorm_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PARSE(c, "rmsnorm_forward", "TTTfTTT");
  RUN(c, ot_rmsnorm_forward(c.ctx, TS(c, 0), TS(c, 1), TS(c, 2), (float)c.f[0], TS(c, 3),
                            TS(c, 4), TS(c, 5)));
}

/* (stream, dy, dresidual_out, h, weight, rstd, eps, dx, dweight) */
static PyObject *py_rmsnorm_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PARSE(c, "rmsnorm_backward", "TTTTTfTT");
  RUN(c, ot_rmsnorm_backward(c.ctx, TS(c, 0), TS(c, 1), TS(c, 2), TS(c, 3), TS(c, 4),
                             (float)c.f[0], TS(c, 5), TS(c, 6)));
}

/* (stream, x, residual, weight, bias, eps, out, residual_out, mean, rstd) */
static PyObject *py_layernorm_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PARSE(c, "layernorm_forward", "TTTTfTTTT");
  RUN(c, ot_layernorm_forward(c.ctx, TS(c, 0), TS(c, 1), TS(c, 2), TS(c, 3), (float)c.f[0],
                              TS(c, 4), TS(c, 5), TS(c, 6), TS(c, 7)));
}

/* (stream, dy, dresidual_out, h, weight, mean, rstd, eps, dx, dweight, dbias) */
static PyObject *py_layernorm_backward(PyObject *self, PyObject *const *args,
                                       Py_ssize_t nargs) {
  PARSE(c, "layernorm_backward", "TTTTTTfTTT");
  RUN(c, ot_layernorm_backward(c.ctx, TS(c, 0), TS(c, 1), TS(c, 2), TS(c, 3), TS(c, 4),
                               TS(c, 5), (float)c.f[0], TS(c, 6), TS(c, 7), TS(c, 8)));
}

static ot_rope_params rope_params(const call *c) {
  ot_rope_params p = ot_rope_default_params();
  p.mode = (ot_rope_mode)c->i[0];
  p.rotary_dim = (int)c->i[1];
  p.theta = (float)c->f[0];
  p.llama3_factor = (float)c->f[1];
  p.llama3_low_freq_factor = (float)c->f[2];
  p.llama3_high_freq_factor = (float)c->f[3];
  p.llama3_original_max_position = (int)c->i[2];
  return p;
}

/* (stream, mode, rotary_dim, theta, l3_factor, l3_low, l3_high, l3_orig_max,
 *  q, k, positions, cos_sin_cache, q_out, k_out) */
static PyObject *py_rope_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PARSE(c, "rope_forward", "iiffffiTTTTTT");
  ot_rope_params p = rope_params(&c);
  RUN(c, ot_rope_forward(c.ctx, &p, TS(c, 0), TS(c, 1), TS(c, 2), TS(c, 3), TS(c, 4),
                         TS(c, 5)));
}

/* (stream, mode, ..., dq_out, dk_out, positions, cos_sin_cache, dq, dk) */
static PyObject *py_rope_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PARSE(c, "rope_backward", "iiffffiTTTTTT");
  ot_rope_params p = rope_params(&c);
  RUN(c, ot_rope_backward(c.ctx, &p, TS(c, 0), TS(c, 1), TS(c, 2), TS(c, 3), TS(c, 4),
                          TS(c, 5)));
}

/* (stream, kind, gate, up, out) */
static PyObject *py_glu_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PARSE(c, "glu_forward", "iTTT");
  RUN(c, ot_glu_forward(c.ctx, (ot_glu_kind)c.i[0], TS(c, 0), TS(c, 1), TS(c, 2)));
}

/* (stream, kind, dout, gate, up, dgate, dup) */
static PyObject *py_glu_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PARSE(c, "glu_backward", "iTTTTT");
  RUN(c, ot_glu_backward(c.ctx, (ot_glu_kind)c.i[0], TS(c, 0), TS(c, 1), TS(c, 2), TS(c, 3),
                         TS(c, 4)));
}

/* (stream, kind, dout, gate, up, dgate, dup, out) */
static PyObject *py_glu_backward_recompute(PyObject *self, PyObject *const *args,
                                           Py_ssize_t nargs) {
  PARSE(c, "glu_backward_recompute", "iTTTTTT");
  RUN(c, ot_glu_backward_recompute(c.ctx, (ot_glu_kind)c.i[0], TS(c, 0), TS(c, 1), TS(c, 2),
                                   TS(c, 3), TS(c, 4), TS(c, 5)));
}

/* (stream, x, out) */
static PyObject *py_softmax_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PARSE(c, "softmax_forward", "TT");
  RUN(c, ot_softmax_forward(c.ctx, TS(c, 0), TS(c, 1)));
}

/* (stream, dy, y, dx) */
static PyObject *py_softmax_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PARSE(c, "softmax_backward", "TTT");
  RUN(c, ot_softmax_backward(c.ctx, TS(c, 0), TS(c, 1), TS(c, 2)));
}

static ot_cross_entropy_params ce_params(const call *c) {
  ot_cross_entropy_params p = ot_cross_entropy_default_params();
  p.ignore_index = (int64_t)c->i[0];
  p.label_smoothing = (float)c->f[0];
  p.reduction = (ot_reduction)c->i[1];
  return p;
}

/* (stream, ignore_index, label_smoothing, reduction, logits, labels, loss, lse) */
static PyObject *py_cross_entropy_forward(PyObject *self, PyObject *const *args,
                                          Py_ssize_t nargs) {
  PARSE(c, "cross_entropy_forward", "LfiTTTT");
  ot_cross_entropy_params p = ce_params(&c);
  RUN(c, ot_cross_entropy_forward(c.ctx, &p, TS(c, 0), TS(c, 1), TS(c, 2), TS(c, 3)));
}

/* (stream, ignore_index, label_smoothing, reduction, dloss, logits, labels, lse, dlogits) */
static PyObject *py_cross_entropy_backward(PyObject *self, PyObject *const *args,
                                           Py_ssize_t nargs) {
  PARSE(c, "cross_entropy_backward", "LfiTTTTT");
  ot_cross_entropy_params p = ce_params(&c);
  RUN(c, ot_cross_entropy_backward(c.ctx, &p, TS(c, 0), TS(c, 1), TS(c, 2), TS(c, 3),
                                   TS(c, 4)));
}

static ot_attention_params attn_params(const call *c) {
  ot_attention_params p = ot_attention_default_params();
  p.softmax_scale = (float)c->f[0];
  p.causal = (int)c->i[0];
  p.window_left = (int)c->i[1];
  p.window_right = (int)c->i[2];
  p.softcap = (float)c->f[1];
  p.deterministic = (int)c->i[3];
  return p;
}

/* (stream, scale, causal, window_left, window_right, softcap, deterministic,
 *  q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse) */
static PyObject *py_attention_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PARSE(c, "attention_forward", "fiiifiTTTTTTT");
  ot_attention_params p = attn_params(&c);
  RUN(c, ot_attention_forward(c.ctx, &p, TS(c, 0), TS(c, 1), TS(c, 2), TS(c, 3), TS(c, 4),
                              TS(c, 5), TS(c, 6)));
}

/* (stream, params..., q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, dq, dk, dv) */
static PyObject *py_attention_backward(PyObject *self, PyObject *const *args,
                                       Py_ssize_t nargs) {
  PARSE(c, "attention_backward", "fiiifiTTTTTTTTTTT");
  ot_attention_params p = attn_params(&c);
  RUN(c, ot_attention_backward(c.ctx, &p, TS(c, 0), TS(c, 1), TS(c, 2), TS(c, 3), TS(c, 4),
                               TS(c, 5), TS(c, 6), TS(c, 7), TS(c, 8), TS(c, 9), TS(c, 10)));
}

/* (stream, x, weight, bias, y) */
static PyObject *py_linear_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PARSE(c, "linear_forward", "TTTT");
  RUN(c, ot_linear_forward(c.ctx, TS(c, 0), TS(c, 1), TS(c, 2), TS(c, 3)));
}

/* (stream, dy, x, weight, dx, dweight, dbias) */
static PyObject *py_linear_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PARSE(c, "linear_backward", "TTTTTT");
  RUN(c, ot_linear_backward(c.ctx, TS(c, 0), TS(c, 1), TS(c, 2), TS(c, 3), TS(c, 4),
                            TS(c, 5)));
}

/* (stream, ignore_index, label_smoothing, reduction, chunk_tokens, hidden, weight, labels,
 *  loss, dhidden, dweight, workspace) */
static PyObject *py_linear_cross_entropy(PyObject *self, PyObject *const *args,
                                         Py_ssize_t nargs) {
  PARSE(c, "linear_cross_entropy", "LfiLTTTTTTT");
  ot_linear_cross_entropy_params p = ot_linear_cross_entropy_default_params();
  p.ce = ce_params(&c);
  p.chunk_tokens = (int64_t)c.i[2];
  RUN(c, ot_linear_cross_entropy(c.ctx, &p, TS(c, 0), TS(c, 1), TS(c, 2), TS(c, 3), TS(c, 4),
                                 TS(c, 5), TS(c, 6)));
}

/* (tokens, hidden_size, vocab_size, dtype_code, dtype_bits, chunk_tokens) -> bytes */
static PyObject *py_linear_cross_entropy_workspace_size(PyObject *self, PyObject *args) {
  long long T, H, V, chunk;
  int code, bits;
  if (!PyArg_ParseTuple(args, "LLLiiL", &T, &H, &V, &code, &bits, &chunk)) return NULL;
  ot_linear_cross_entropy_params p = ot_linear_cross_entropy_default_params();
  p.chunk_tokens = chunk;
  DLDataType dt = {(uint8_t)code, (uint8_t)bits, 1};
  size_t bytes = 0;
  ot_status st = ot_linear_cross_entropy_workspace_size(&p, T, H, V, dt, &bytes);
  if (st != OT_OK) return raise_status(st);
  return PyLong_FromSize_t(bytes);
}

/* (stream, lr, beta1, beta2, eps, weight_decay, step, params, grads, exp_avg, exp_avg_sq,
 *  master_params or None): the lists are sequences of tensors of equal length. */
static PyObject *py_adamw_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  static const char op[] = "adamw_step";
  if (nargs != 12) {
    PyErr_Format(PyExc_TypeError, "%s() takes 12 arguments (%zd given)", op, nargs);
    return NULL;
  }
  ot_adamw_params hp = ot_adamw_default_params();
  double f[5];
  for (int k = 0; k < 5; k++) {
    f[k] = PyFloat_AsDouble(args[1 + k]);
    if (f[k] == -1.0 && PyErr_Occurred()) return NULL;
  }
  hp.lr = (float)f[0];
  hp.beta1 = (float)f[1];
  hp.beta2 = (float)f[2];
  hp.eps = (float)f[3];
  hp.weight_decay = (float)f[4];
  hp.step = (int64_t)PyLong_AsLongLong(args[6]);
  if (hp.step == -1 && PyErr_Occurred()) return NULL;
  const int nlists = args[11] == Py_None ? 4 : 5;
  PyObject *fast[5] = {NULL, NULL, NULL, NULL, NULL};
  Py_ssize_t n = -1;
  for (int l = 0; l < nlists; l++) {
    fast[l] = PySequence_Fast(args[7 + l], "adamw_step: expected a sequence of tensors");
    if (!fast[l]) goto fail_lists;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast[l]);
    if (n >= 0 && len != n) {
      PyErr_Format(PyExc_ValueError, "adamw_step: list %d has %zd tensors, list 0 has %zd", l,
                   len, n);
      goto fail_lists;
    }
    n = len;
  }
  if (n > INT32_MAX) {
    PyErr_SetString(PyExc_ValueError, "adamw_step: too many tensors");
    goto fail_lists;
  }
  {
    tensor_arg *ta = (tensor_arg *)calloc((size_t)(n * nlists + 1), sizeof *ta);
    const DLTensor **dl = (const DLTensor **)calloc((size_t)(n * 5 + 1), sizeof *dl);
    ot_context *ctx = NULL;
    ot_status st = OT_OK;
    int ok = ta && dl;
    if (!ok) PyErr_NoMemory();
    for (int l = 0; ok && l < nlists; l++)
      for (Py_ssize_t i = 0; ok && i < n; i++) {
        tensor_arg *a = &ta[l * n + i];
        if (tensor_from(op, 7 + l, PySequence_Fast_GET_ITEM(fast[l], i), a) < 0) ok = 0;
        else dl[l * n + i] = T(a);
      }
    if (ok && n > 0) {
      DLDevice dev = ta[0].present ? ta[0].t.device : (DLDevice){kDLCPU, 0};
      ctx = context_for(op, dev, args[0]);
      ok = ctx != NULL;
    }
    if (ok) {
      if (n == 0) ctx = cpu_context;
      const DLTensor *const *lists[5] = {dl, dl + n, dl + 2 * n, dl + 3 * n,
                                         nlists == 5 ? dl + 4 * n : NULL};
      if (ot_context_device(ctx).device_type == kDLCPU) {
        Py_BEGIN_ALLOW_THREADS st = ot_adamw_step(ctx, &hp, (int)n, lists[0], lists[1],
                                                  lists[2], lists[3], lists[4]);
        Py_END_ALLOW_THREADS
      } else {
        st = ot_adamw_step(ctx, &hp, (int)n, lists[0], lists[1], lists[2], lists[3], lists[4]);
      }
    }
    for (Py_ssize_t k = 0; ta && k < n * nlists; k++) Py_CLEAR(ta[k].keep);
    free(ta);
    free(dl);
    for (int l = 0; l < 5; l++) Py_XDECREF(fast[l]);
    if (!ok) return NULL;
    if (st != OT_OK) return raise_status(st);
    Py_RETURN_NONE;
  }
fail_lists:
  for (int l = 0; l < 5; l++) Py_XDECREF(fast[l]);
  return NULL;
}

/* The C-side baseline of bench_binding.py: the mean time in ns of one call of
 * ot_softmax_forward (which = 0) or ot_rmsnorm_forward (which = 1) on a float32
 * [1, n] tensor, made from C in a loop of `iters` calls; wall-clock time, or the
 * calling thread's CPU time when thread_clock is true. */
static PyObject *py_bench_c_call(PyObject *self, PyObject *args) {
  int which, n, iters, thread_clock = 0;
  if (!PyArg_ParseTuple(args, "iii|p", &which, &n, &iters, &thread_clock)) return NULL;
  clockid_t clock = thread_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
  if (n < 1 || n > 1 << 20 || iters < 1) {
    PyErr_SetString(PyExc_ValueError, "bad size");
    return NULL;
  }
  float *x = PyMem_Calloc((size_t)n * 3, sizeof(float));
  if (!x) return PyErr_NoMemory();
  for (int i = 0; i < n; i++) x[i] = (float)i / (float)n, x[n + i] = 1.0f;
  int64_t shape[2] = {1, n}, wshape[1] = {n};
  DLTensor tx = {x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, NULL, 0};
  DLTensor tw = {x + n, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, wshape, NULL, 0};
  DLTensor to = {x + 2 * n, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, NULL, 0};
  ot_status st = OT_OK;
  struct timespec t0, t1;
  clock_gettime(clock, &t0);
  for (int k = 0; k < iters && st == OT_OK; k++)
    st = which == 0 ? ot_softmax_forward(cpu_context, &tx, &to)
                    : ot_rmsnorm_forward(cpu_context, &tx, NULL, &tw, 1e-6f, &to, NULL, NULL);
  clock_gettime(clock, &t1);
  PyMem_Free(x);
  if (st != OT_OK) return raise_status(st);
  double ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / iters;
  return PyFloat_FromDouble(ns);
}

/* ---------------------------------------------------------------------------------- */
/* Module                                                                             */
/* ---------------------------------------------------------------------------------- */

static PyObject *py_register_torch(PyObject *self, PyObject *args) {
  PyObject *type, *map, *stream_of, *to_dlpack = Py_None;
  if (!PyArg_ParseTuple(args, "OO!O|O", &type, &PyDict_Type, &map, &stream_of, &to_dlpack))
    return NULL;
  if (!PyType_Check(type)) {
    PyErr_SetString(PyExc_TypeError, "expected torch.Tensor");
    return NULL;
  }
  Py_XSETREF(torch_tensor_type, Py_NewRef(type));
  Py_XSETREF(torch_dtype_map, Py_NewRef(map));
  Py_XSETREF(torch_stream_of, Py_NewRef(stream_of));
  Py_CLEAR(torch_to_dlpack);
  if (to_dlpack != Py_None) torch_to_dlpack = Py_NewRef(to_dlpack);
  Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------- */
/* Memory: tracker counters and arenas (ops_transformer.profiler)                      */
/* ---------------------------------------------------------------------------------- */

static PyObject *counter_tuple(const ot_memory_counter *c) {
  return Py_BuildValue("(KKKK)", (unsigned long long)c->current, (unsigned long long)c->peak,
                       (unsigned long long)c->allocs, (unsigned long long)c->frees);
}

/* memory_counters() -> {"tags": {name: (current, peak, allocs, frees)}, "ops": {...}} */
static PyObject *py_memory_counters(PyObject *self, PyObject *unused) {
  static const char *tag_names[OT_MEMORY_NUM_TAGS] = {"weights", "kv_cache", "activations",
                                                      "workspace", "other"};
  PyObject *tags = PyDict_New(), *ops = PyDict_New(), *out = NULL;
  if (!tags || !ops) goto done;
  for (int t = 0; t < OT_MEMORY_NUM_TAGS; t++) {
    ot_memory_counter c;
    if (ot_memory_tag_counter((ot_memory_tag)t, &c) != OT_OK) {
      raise_status(OT_ERR_INTERNAL);
      goto done;
    }
    PyObject *v = counter_tuple(&c);
    if (!v || PyDict_SetItemString(tags, tag_names[t], v) < 0) {
      Py_XDECREF(v);
      goto done;
    }
    Py_DECREF(v);
  }
  for (int i = 0, n = ot_memory_op_count(); i < n; i++) {
    const char *name = ot_memory_op_name(i);
    ot_memory_counter c;
    if (!name || ot_memory_op_counter(name, &c) != OT_OK) continue;
    PyObject *v = counter_tuple(&c);
    if (!v || PyDict_SetItemString(ops, name, v) < 0) {
      Py_XDECREF(v);
      goto done;
    }
    Py_DECREF(v);
  }
  ot_memory_counter tot;
  ot_memory_total_counter(&tot);
  PyObject *total = counter_tuple(&tot);
  if (!total) goto done;
  out = Py_BuildValue("{sOsOsO}", "tags", tags, "ops", ops, "total", total);
  Py_DECREF(total);
done:
  Py_XDECREF(tags);
  Py_XDECREF(ops);
  return out;
}

static PyObject *py_memory_reset_peaks(PyObject *self, PyObject *unused) {
  ot_memory_reset_peaks();
  Py_RETURN_NONE;
}

static void arena_capsule_free(PyObject *cap) {
  ot_arena_destroy((ot_arena *)PyCapsule_GetPointer(cap, ARENA_CAPSULE));
}

/* arena_create(reserve_bytes, device=-1) -> capsule (device -1: host, else CUDA ordinal) */
static PyObject *py_arena_create(PyObject *self, PyObject *args) {
  unsigned long long bytes;
  int device = -1;
  if (!PyArg_ParseTuple(args, "K|i", &bytes, &device)) return NULL;
  DLDevice dev = {device < 0 ? kDLCPU : kDLCUDA, device < 0 ? 0 : device};
  PyObject *zero = PyLong_FromLong(0);
  if (!zero) return NULL;
  ot_context *ctx = context_for("arena_create", dev, zero);
  Py_DECREF(zero);
  if (!ctx) return NULL;
  ot_arena *a = NULL;
  ot_status st = ot_arena_create(ctx, (size_t)bytes, &a);
  if (st != OT_OK) return raise_status(st);
  PyObject *cap = PyCapsule_New(a, ARENA_CAPSULE, arena_capsule_free);
  if (!cap) ot_arena_destroy(a);
  return cap;
}

/* arena_alloc(arena, bytes, tag, op=None) -> address; arena_free(arena, address) */
static PyObject *py_arena_alloc(PyObject *self, PyObject *args) {
  PyObject *cap;
  unsigned long long bytes;
  int tag;
  const char *op = NULL;
  if (!PyArg_ParseTuple(args, "OKi|z", &cap, &bytes, &tag, &op)) return NULL;
  ot_arena *a = (ot_arena *)PyCapsule_GetPointer(cap, ARENA_CAPSULE);
  if (!a) return NULL;
  void *p = NULL;
  ot_status st = ot_arena_alloc_tagged(a, (size_t)bytes, NULL, (ot_memory_tag)tag, op, &p);
  if (st != OT_OK) return raise_status(st);
  return PyLong_FromVoidPtr(p);
}

static PyObject *py_arena_free(PyObject *self, PyObject *args) {
  PyObject *cap, *addr;
  if (!PyArg_ParseTuple(args, "OO", &cap, &addr)) return NULL;
  ot_arena *a = (ot_arena *)PyCapsule_GetPointer(cap, ARENA_CAPSULE);
  if (!a) return NULL;
  void *p = PyLong_AsVoidPtr(addr);
  if (PyErr_Occurred()) return NULL;
  ot_status st = ot_arena_free(a, p, NULL);
  if (st != OT_OK) return raise_status(st);
  Py_RETURN_NONE;
}

static PyObject *py_arena_stats(PyObject *self, PyObject *cap) {
  ot_arena *a = (ot_arena *)PyCapsule_GetPointer(cap, ARENA_CAPSULE);
  if (!a) return NULL;
  ot_arena_stats s;
  ot_status st = ot_arena_get_stats(a, &s);
  if (st != OT_OK) return raise_status(st);
  return Py_BuildValue("{sKsKsKsKsKsdsKsKsKsKsK}", "reserved", (unsigned long long)s.reserved,
                       "in_use", (unsigned long long)s.in_use, "peak",
                       (unsigned long long)s.peak, "free_total",
                       (unsigned long long)s.free_total, "largest_free",
                       (unsigned long long)s.largest_free, "fragmentation", s.fragmentation,
                       "live_blocks", (unsigned long long)s.live_blocks, "free_blocks",
                       (unsigned long long)s.free_blocks, "num_allocs",
                       (unsigned long long)s.num_allocs, "num_frees",
                       (unsigned long long)s.num_frees, "num_failed",
                       (unsigned long long)s.num_failed);
}

/* context_arena_policy(bytes): CUDA contexts' temporaries from an arena of `bytes` each
 * (created on a context's next use; 0: none). A change detaches the existing arenas
 * first; the current policy again changes nothing (config stores every option when an
 * override ends, and a detach there would free blocks a captured graph still uses). */
static PyObject *py_context_arena_policy(PyObject *self, PyObject *arg) {
  unsigned long long bytes = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return NULL;
  if ((size_t)bytes == context_arena_bytes) Py_RETURN_NONE;
  detach_context_arenas();
  context_arena_bytes = (size_t)bytes;
  Py_RETURN_NONE;
}

/* context_arena(device) -> the arena capsule of CUDA device `device`'s context, or None. */
static PyObject *py_context_arena(PyObject *self, PyObject *arg) {
  long d = PyLong_AsLong(arg);
  if (PyErr_Occurred()) return NULL;
  if (d < 0 || d >= MAX_CUDA_DEVICES || !cuda_context_arenas[d]) Py_RETURN_NONE;
  return Py_NewRef(cuda_context_arenas[d]);
}

/* ---------------------------------------------------------------------------------- */
/* Paged KV cache (ot_kv_cache_*), ot_kv_append / ot_rope_kv_append, paged attention  */
/* ---------------------------------------------------------------------------------- */

/* The cache object: a capsule owning the ot_kv_cache, with references to what the cache
 * needs alive -- this module (whose contexts the cache uses; module_free destroys them)
 * and the arena its pages come from, if any. Tensors exported from it (layer views)
 * hold a reference to the capsule, so the pages outlive the Python KVCache object. */
#define KV_CACHE_CAPSULE "ops_transformer.kv_cache"

typedef struct kv_cache_handle {
  ot_kv_cache *cache;
  DLDevice device;
  PyObject *module;
  PyObject *arena; /* the arena capsule, or NULL */
} kv_cache_handle;

static void kv_cache_capsule_free(PyObject *cap) {
  kv_cache_handle *h = (kv_cache_handle *)PyCapsule_GetPointer(cap, KV_CACHE_CAPSULE);
  if (!h) {
    PyErr_Clear();
    return;
  }
  ot_kv_cache_destroy(h->cache); /* before the arena and the contexts go */
  Py_XDECREF(h->arena);
  Py_XDECREF(h->module);
  PyMem_Free(h);
}

static kv_cache_handle *kv_handle(PyObject *cap) {
  return (kv_cache_handle *)PyCapsule_GetPointer(cap, KV_CACHE_CAPSULE);
}

/* The cache args[at] of a fastcall binding that takes `want` arguments. */
static kv_cache_handle *kv_args(const char *op, PyObject *const *args, Py_ssize_t nargs,
                                Py_ssize_t want, int at) {
  if (nargs != want) {
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", op, want, nargs);
    return NULL;
  }
  return kv_handle(args[at]);
}

/* An int argument (PyLong_AsInt is public only from Python 3.13). */
static int int_arg(PyObject *o, int *out) {
  long v = PyLong_AsLong(o);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (v < INT32_MIN || v > INT32_MAX) {
    PyErr_SetString(PyExc_OverflowError, "int argument out of range");
    return -1;
  }
  *out = (int)v;
  return 0;
}

/* DLPack 1.0's versioned managed tensor, declared here because the dlpack.h this builds
 * with is 0.6 (the layout is DLPack's ABI). NumPy makes arrays from the legacy
 * (unversioned) capsule read-only; from this one, without the read-only flag, writable. */
typedef struct dl_version {
  uint32_t major, minor;
} dl_version;

typedef struct dl_managed_versioned {
  dl_version version;
  void *manager_ctx;
  void (*deleter)(struct dl_managed_versioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} dl_managed_versioned;

/* A tensor this module exports, as either capsule kind: a view of memory `owner` keeps
 * alive (the cache capsule: a reference is held until the consumer calls the deleter),
 * or, with owner NULL, of host memory allocated with the record and freed with it. */
typedef struct exported_tensor {
  DLManagedTensor legacy;
  dl_managed_versioned versioned;
  int64_t shape[MAX_DIMS];
  PyObject *owner;
} exported_tensor;

static void exported_tensor_free(exported_tensor *e) {
  if (e->owner) {
    /* consumers may call the deleter from any thread */
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF(e->owner);
    PyGILState_Release(g);
  }
  free(e);
}

static void exported_legacy_delete(DLManagedTensor *m) {
  exported_tensor_free((exported_tensor *)m->manager_ctx);
}

static void exported_versioned_delete(dl_managed_versioned *m) {
  exported_tensor_free((exported_tensor *)m->manager_ctx);
}

/* The capsules' own destructors: a capsule never consumed (still named "dltensor" /
 * "dltensor_versioned") deletes its tensor; a consumer renames it "used_..." and owns
 * the tensor. */
static void dltensor_capsule_free(PyObject *cap) {
  if (!PyCapsule_IsValid(cap, "dltensor")) return;
  DLManagedTensor *m = (DLManagedTensor *)PyCapsule_GetPointer(cap, "dltensor");
  if (m && m->deleter) m->deleter(m);
}

static void dltensor_versioned_capsule_free(PyObject *cap) {
  if (!PyCapsule_IsValid(cap, "dltensor_versioned")) return;
  dl_managed_versioned *m =
      (dl_managed_versioned *)PyCapsule_GetPointer(cap, "dltensor_versioned");
  if (m && m->deleter) m->deleter(m);
}

/* A DLPack capsule ("dltensor_versioned" when `versioned`, else "dltensor") of a
 * contiguous tensor: data (owned by `owner`) or, with data NULL, `bytes` of new host
 * memory (returned in *host, uninitialized). */
static PyObject *export_tensor(void *data, DLDevice device, DLDataType dtype, int ndim,
                               const int64_t *shape, PyObject *owner, size_t bytes,
                               void **host, int versioned) {
  exported_tensor *e = (exported_tensor *)malloc(sizeof *e + (data ? 0 : bytes));
  if (!e) return PyErr_NoMemory();
  memset(e, 0, sizeof *e);
  for (int d = 0; d < ndim; d++) e->shape[d] = shape[d];
  if (!data) {
    data = e + 1; /* sizeof *e is a multiple of 8 */
    *host = data;
  }
  const DLTensor t = {data, device, ndim, dtype, e->shape, NULL, 0};
  e->owner = owner;
  Py_XINCREF(owner);
  PyObject *cap;
  if (versioned) {
    e->versioned = (dl_managed_versioned){{1, 0}, e, exported_versioned_delete, 0, t};
    cap = PyCapsule_New(&e->versioned, "dltensor_versioned", dltensor_versioned_capsule_free);
  } else {
    e->legacy = (DLManagedTensor){t, e, exported_legacy_delete};
    cap = PyCapsule_New(&e->legacy, "dltensor", dltensor_capsule_free);
  }
  if (!cap) exported_tensor_free(e);
  return cap;
}

/* kv_cache_create(num_layers, num_pages, block_size, heads_kv, head_dim, dtype_code,
 *                 dtype_bits, device, arena) -> cache
 * device: -1 the host, else the CUDA ordinal; arena: an arena capsule or None. */
static PyObject *py_kv_cache_create(PyObject *self, PyObject *args) {
  int num_layers, block_size, heads_kv, head_dim, code, bits, device;
  long long num_pages;
  PyObject *arena_cap;
  if (!PyArg_ParseTuple(args, "iLiiiiiiO", &num_layers, &num_pages, &block_size, &heads_kv,
                        &head_dim, &code, &bits, &device, &arena_cap))
    return NULL;
  ot_arena *arena = NULL;
  if (arena_cap != Py_None && !(arena = (ot_arena *)PyCapsule_GetPointer(arena_cap,
                                                                         ARENA_CAPSULE)))
    return NULL;
  DLDevice dev = {device < 0 ? kDLCPU : kDLCUDA, device < 0 ? 0 : device};
  ot_context *ctx = context_for("kv_cache_create", dev, Py_None);
  if (!ctx) return NULL;
  ot_kv_cache_params p = {num_layers, (int64_t)num_pages, block_size, heads_kv, head_dim,
                          {(uint8_t)code, (uint8_t)bits, 1}};
  kv_cache_handle *h = (kv_cache_handle *)PyMem_Calloc(1, sizeof *h);
  if (!h) return PyErr_NoMemory();
  ot_status st = ot_kv_cache_create(ctx, &p, arena, &h->cache);
  if (st != OT_OK) {
    PyMem_Free(h);
    return raise_status(st);
  }
  h->device = dev;
  h->module = Py_NewRef(self);
  if (arena) h->arena = Py_NewRef(arena_cap);
  PyObject *cap = PyCapsule_New(h, KV_CACHE_CAPSULE, kv_cache_capsule_free);
  if (!cap) {
    ot_kv_cache_destroy(h->cache);
    Py_XDECREF(h->arena);
    Py_DECREF(h->module);
    PyMem_Free(h);
  }
  return cap;
}

/* kv_cache_layer(cache, layer, versioned) -> (k_pages, v_pages): DLPack capsules
 * (versioned: DLPack 1.0's) viewing the pages [num_pages, heads_kv, block_size,
 * head_dim]; each keeps the cache alive. */
static PyObject *py_kv_cache_layer(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  kv_cache_handle *h = kv_args("kv_cache_layer", args, nargs, 3, 0);
  if (!h) return NULL;
  int layer, versioned = PyObject_IsTrue(args[2]);
  if (versioned < 0 || int_arg(args[1], &layer) < 0) return NULL;
  DLTensor k, v;
  ot_status st = ot_kv_cache_layer(h->cache, layer, &k, &v);
  if (st != OT_OK) return raise_status(st);
  PyObject *kc =
      export_tensor(k.data, k.device, k.dtype, k.ndim, k.shape, args[0], 0, NULL, versioned);
  if (!kc) return NULL;
  PyObject *vc =
      export_tensor(v.data, v.device, v.dtype, v.ndim, v.shape, args[0], 0, NULL, versioned);
  if (!vc) {
    Py_DECREF(kc);
    return NULL;
  }
  PyObject *out = PyTuple_Pack(2, kc, vc);
  Py_DECREF(kc);
  Py_DECREF(vc);
  return out;
}

/* Sequence ids (and token counts) from Python sequences of ints: `buf` when n <= cap,
 * else PyMem (the caller frees *out when it differs from buf). */
static int int64_list(const char *op, const char *name, PyObject *seq, int64_t *buf,
                      Py_ssize_t cap, int64_t **out, Py_ssize_t *n) {
  PyObject *fast = PySequence_Fast(seq, "expected a sequence of ints");
  if (!fast) return -1;
  Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
  if (len > INT32_MAX) {
    Py_DECREF(fast);
    char what[96];
    snprintf(what, sizeof what, "%s: more than 2^31 - 1 entries", name);
    return arg_error(op, 1, what);
  }
  int64_t *p = len <= cap ? buf : (int64_t *)PyMem_Malloc((size_t)len * sizeof *p);
  if (!p) {
    Py_DECREF(fast);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < len; i++) {
    p[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    if (p[i] == -1 && PyErr_Occurred()) {
      if (p != buf) PyMem_Free(p);
      Py_DECREF(fast);
      return -1;
    }
  }
  Py_DECREF(fast);
  *out = p;
  *n = len;
  return 0;
}

#define KV_STACK_IDS 64

/* kv_cache_reserve(stream, cache, seq_ids, num_tokens): the stream orders the
 * copy-on-write copies on CUDA. */
static PyObject *py_kv_cache_reserve(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  static const char op[] = "kv_cache_reserve";
  kv_cache_handle *h = kv_args(op, args, nargs, 4, 1);
  if (!h) return NULL;
  int64_t ids_buf[KV_STACK_IDS], tok_buf[KV_STACK_IDS], *ids = NULL, *tok = NULL;
  Py_ssize_t n = 0, nt = 0;
  PyObject *result = NULL;
  if (int64_list(op, "seq_ids", args[2], ids_buf, KV_STACK_IDS, &ids, &n) < 0) return NULL;
  if (int64_list(op, "num_tokens", args[3], tok_buf, KV_STACK_IDS, &tok, &nt) < 0) goto done;
  if (nt != n) {
    char what[128];
    snprintf(what, sizeof what, "num_tokens: %zd entries, seq_ids has %zd", nt, n);
    arg_error(op, 3, what);
    goto done;
  }
  if (!context_for(op, h->device, args[0])) goto done;
  ot_status st = ot_kv_cache_reserve(h->cache, (int)n, ids, tok);
  if (st != OT_OK) {
    raise_status(st);
    goto done;
  }
  result = Py_NewRef(Py_None);
done:
  if (ids && ids != ids_buf) PyMem_Free(ids);
  if (tok && tok != tok_buf) PyMem_Free(tok);
  return result;
}

/* kv_cache_page_table(cache, seq_ids, versioned) -> (indptr, indices, last_page_len):
 * DLPack capsules of new int32 host arrays [n + 1], [pages of the batch], [n]. */
static PyObject *py_kv_cache_page_table(PyObject *self, PyObject *const *args,
                                        Py_ssize_t nargs) {
  static const char op[] = "kv_cache_page_table";
  kv_cache_handle *h = kv_args(op, args, nargs, 3, 0);
  if (!h) return NULL;
  int versioned = PyObject_IsTrue(args[2]);
  if (versioned < 0) return NULL;
  int64_t ids_buf[KV_STACK_IDS], *ids = NULL;
  Py_ssize_t n = 0;
  if (int64_list(op, "seq_ids", args[1], ids_buf, KV_STACK_IDS, &ids, &n) < 0) return NULL;
  PyObject *caps[3] = {NULL, NULL, NULL}, *result = NULL;
  /* the batch's pages first, so that indices is allocated at its size */
  int64_t total = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    int64_t pages = 0;
    ot_status st = ot_kv_cache_seq_length(h->cache, ids[i], NULL, &pages);
    if (st != OT_OK) {
      raise_status(st);
      goto done;
    }
    total += pages;
  }
  const DLDevice host = {kDLCPU, 0};
  const DLDataType i32 = {kDLInt, 32, 1};
  const int64_t shapes[3] = {n + 1, total, n};
  int32_t *arrays[3];
  for (int k = 0; k < 3; k++) {
    caps[k] = export_tensor(NULL, host, i32, 1, &shapes[k], NULL,
                            (size_t)shapes[k] * sizeof(int32_t), (void **)&arrays[k],
                            versioned);
    if (!caps[k]) goto done;
  }
  ot_status st = ot_kv_cache_page_table(h->cache, (int)n, ids, arrays[0], arrays[1], total,
                                        arrays[2]);
  if (st != OT_OK) {
    raise_status(st);
    goto done;
  }
  result = PyTuple_Pack(3, caps[0], caps[1], caps[2]);
done:
  for (int k = 0; k < 3; k++) Py_XDECREF(caps[k]);
  if (ids && ids != ids_buf) PyMem_Free(ids);
  return result;
}

/* kv_cache_seq(cache, what, seq_id) -> int or tuple; `what`: 0 add_sequence (seq_id
 * ignored) -> new id, 1 free_sequence -> None, 2 fork -> new id, 3 seq_length ->
 * (tokens, pages). The bookkeeping calls, which do no device work. */
static PyObject *py_kv_cache_seq(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  kv_cache_handle *h = kv_args("kv_cache_seq", args, nargs, 3, 0);
  if (!h) return NULL;
  int what;
  if (int_arg(args[1], &what) < 0) return NULL;
  int64_t id = 0, a = 0, b = 0;
  if (what != 0) {
    id = PyLong_AsLongLong(args[2]);
    if (id == -1 && PyErr_Occurred()) return NULL;
  }
  ot_status st;
  switch (what) {
    case 0: st = ot_kv_cache_add_sequence(h->cache, &a); break;
    case 1: st = ot_kv_cache_free_sequence(h->cache, id); break;
    case 2: st = ot_kv_cache_fork(h->cache, id, &a); break;
    case 3: st = ot_kv_cache_seq_length(h->cache, id, &a, &b); break;
    default: PyErr_SetString(PyExc_ValueError, "kv_cache_seq: what: 0 .. 3"); return NULL;
  }
  if (st != OT_OK) return raise_status(st);
  if (what == 1) Py_RETURN_NONE;
  if (what == 3) return Py_BuildValue("(LL)", (long long)a, (long long)b);
  return PyLong_FromLongLong(a);
}

/* kv_cache_info(cache) -> dict of ot_kv_cache_info, plus the dtype and device. */
static PyObject *py_kv_cache_info(PyObject *self, PyObject *cap) {
  kv_cache_handle *h = kv_handle(cap);
  if (!h) return NULL;
  ot_kv_cache_info i;
  ot_status st = ot_kv_cache_get_info(h->cache, &i);
  if (st != OT_OK) return raise_status(st);
  return Py_BuildValue("{sisisisisLsLsLsLsK}", "num_layers", i.num_layers, "block_size",
                       i.block_size, "heads_kv", i.heads_kv, "head_dim", i.head_dim,
                       "num_pages", (long long)i.num_pages, "free_pages",
                       (long long)i.free_pages, "shared_pages", (long long)i.shared_pages,
                       "num_sequences", (long long)i.num_sequences, "bytes",
                       (unsigned long long)i.bytes);
}

static ot_paged_kv paged_kv(const call *c, int first) {
  ot_paged_kv kv = {TS(*c, first), TS(*c, first + 1), TS(*c, first + 2), TS(*c, first + 3),
                    TS(*c, first + 4)};
  return kv;
}

/* (stream, rope, k_pages, v_pages, indptr, indices, last_page_len, cu_seqlens_new,
 *  k_new, v_new, positions, q, q_out, k_out): rope is None or the tuple of rope_forward's
 * parameters (mode, rotary_dim, theta, l3_factor, l3_low, l3_high, l3_orig_max).
 * ot_rope_kv_append when k_out is not None, else ot_kv_append. */
static PyObject *py_kv_append(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  static const char op[] = "kv_append";
  if (nargs != 14) {
    PyErr_Format(PyExc_TypeError, "%s() takes 14 arguments (%zd given)", op, nargs);
    return NULL;
  }
  call r; /* only the rope parameters, in the slots rope_params reads */
  int has_rope = args[1] != Py_None;
  if (has_rope && !PyArg_ParseTuple(args[1], "LLddddL;kv_append: rope: expected (mode, "
                                    "rotary_dim, theta, factor, low, high, original_max)",
                                    &r.i[0], &r.i[1], &r.f[0], &r.f[1], &r.f[2], &r.f[3],
                                    &r.i[2]))
    return NULL;
  ot_rope_params p = has_rope ? rope_params(&r) : ot_rope_default_params();
  PyObject *rest[13]; /* the stream and the tensors, for parse() */
  rest[0] = args[0];
  for (int k = 1; k < 13; k++) rest[k] = args[k + 1];
  call c;
  if (parse(&c, op, "TTTTTTTTTTTT", rest, 13) < 0) {
    call_release(&c);
    return NULL;
  }
  ot_paged_kv kv = paged_kv(&c, 0);
  if (TS(c, 11))
    RUN(c, ot_rope_kv_append(c.ctx, has_rope ? &p : NULL, &kv, TS(c, 5), TS(c, 6), TS(c, 7),
                             TS(c, 8), TS(c, 9), TS(c, 10), TS(c, 11)));
  RUN(c, ot_kv_append(c.ctx, &kv, TS(c, 5), TS(c, 6), TS(c, 7), has_rope ? &p : NULL,
                      TS(c, 8), TS(c, 9), TS(c, 10)));
}

/* (stream, scale, causal, window_left, window_right, softcap, deterministic,
 *  q, cu_seqlens_q, k_pages, v_pages, indptr, indices, last_page_len, out, lse) */
static PyObject *py_paged_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PARSE(c, "paged_attention", "fiiifiTTTTTTTTT");
  ot_attention_params p = attn_params(&c);
  ot_paged_kv kv = paged_kv(&c, 2);
  RUN(c, ot_paged_attention(c.ctx, &p, TS(c, 0), TS(c, 1), &kv, TS(c, 7), TS(c, 8)));
}

static PyObject *py_last_error(PyObject *self, PyObject *unused) {
  return PyUnicode_FromString(ot_last_error());
}

static PyObject *py_has_cuda(PyObject *self, PyObject *unused) {
  return PyBool_FromLong(ot_has_cuda());
}

static PyObject *py_version(PyObject *self, PyObject *unused) {
  return PyUnicode_FromString(ot_version_string());
}

#define FAST(name, fn, doc) {name, (PyCFunction)(void (*)(void))fn, METH_FASTCALL, doc}

static PyMethodDef methods[] = {
    FAST("rmsnorm_forward", py_rmsnorm_forward, NULL),
    FAST("rmsnorm_backward", py_rmsnorm_backward, NULL),
    FAST("layernorm_forward", py_layernorm_forward, NULL),
    FAST("layernorm_backward", py_layernorm_backward, NULL),
    FAST("rope_forward", py_rope_forward, NULL),
    FAST("rope_backward", py_rope_backward, NULL),
    FAST("glu_forward", py_glu_forward, NULL),
    FAST("glu_backward", py_glu_backward, NULL),
    FAST("glu_backward_recompute", py_glu_backward_recompute, NULL),
    FAST("softmax_forward", py_softmax_forward, NULL),
    FAST("softmax_backward", py_softmax_backward, NULL),
    FAST("cross_entropy_forward", py_cross_entropy_forward, NULL),
    FAST("cross_entropy_backward", py_cross_entropy_backward, NULL),
    FAST("attention_forward", py_attention_forward, NULL),
    FAST("attention_backward", py_attention_backward, NULL),
    FAST("linear_forward", py_linear_forward, NULL),
    FAST("linear_backward", py_linear_backward, NULL),
    FAST("linear_cross_entropy", py_linear_cross_entropy, NULL),
    {"linear_cross_entropy_workspace_size", py_linear_cross_entropy_workspace_size, METH_VARARGS,
     "Bytes of workspace of ot_linear_cross_entropy (T, H, V, dtype code, bits, chunk)."},
    FAST("adamw_step", py_adamw_step, NULL),
    FAST("kv_append", py_kv_append, NULL),
    FAST("paged_attention", py_paged_attention, NULL),
    {"_register_torch", py_register_torch, METH_VARARGS,
     "_register_torch(torch.Tensor, {dtype: (dlpack_code, bits)}, stream_of): enable the\n"
     "torch fast path; stream_of(ordinal) returns torch's current CUDA stream as an int;\n"
     "to_dlpack (optional) is torch._C._to_dlpack."},
    {"_bench_c_call", py_bench_c_call, METH_VARARGS,
     "_bench_c_call(which, n, iters, thread_clock=False) -> ns per C call\n"
     "(0 softmax, 1 rmsnorm; [1, n] float32)."},
    {"memory_counters", py_memory_counters, METH_NOARGS,
     "The C memory tracker: {'tags': {tag: (current, peak, allocs, frees)}, 'ops': {...},\n"
     "'total': (...)}."},
    {"memory_reset_peaks", py_memory_reset_peaks, METH_NOARGS, "ot_memory_reset_peaks()."},
    {"arena_create", py_arena_create, METH_VARARGS,
     "arena_create(reserve_bytes, device=-1) -> arena (device -1: host, else CUDA ordinal)."},
    {"arena_alloc", py_arena_alloc, METH_VARARGS,
     "arena_alloc(arena, bytes, tag, op=None) -> address (ot_arena_alloc_tagged)."},
    {"arena_free", py_arena_free, METH_VARARGS, "arena_free(arena, address)."},
    {"arena_stats", py_arena_stats, METH_O, "ot_arena_get_stats as a dict."},
    {"context_arena_policy", py_context_arena_policy, METH_O,
     "context_arena_policy(bytes): CUDA contexts take their temporaries from an arena of "
     "`bytes` (ot_context_set_arena), created on next use; 0: none."},
    {"context_arena", py_context_arena, METH_O,
     "context_arena(device) -> the arena of that CUDA device's context, or None."},
    {"kv_cache_create", py_kv_cache_create, METH_VARARGS,
     "kv_cache_create(num_layers, num_pages, block_size, heads_kv, head_dim, dtype_code,\n"
     "dtype_bits, device, arena) -> cache (device -1: host, else CUDA ordinal; arena or None)."},
    FAST("kv_cache_layer", py_kv_cache_layer,
         "kv_cache_layer(cache, layer, versioned) -> (k_pages, v_pages) DLPack capsules\n"
         "(views; versioned: DLPack 1.0 capsules)."),
    FAST("kv_cache_reserve", py_kv_cache_reserve,
         "kv_cache_reserve(stream, cache, seq_ids, num_tokens)."),
    FAST("kv_cache_page_table", py_kv_cache_page_table,
         "kv_cache_page_table(cache, seq_ids, versioned) -> (indptr, indices, last_page_len)\n"
         "int32 host DLPack capsules."),
    FAST("kv_cache_seq", py_kv_cache_seq,
         "kv_cache_seq(cache, what, seq_id): 0 add, 1 free, 2 fork, 3 (tokens, pages)."),
    {"kv_cache_info", py_kv_cache_info, METH_O, "ot_kv_cache_get_info as a dict."},
    {"last_error", py_last_error, METH_NOARGS, "ot_last_error() of this thread."},
    {"has_cuda", py_has_cuda, METH_NOARGS, "Whether the library was built with CUDA."},
    {"version", py_version, METH_NOARGS, "The linked library's version string."},
    {NULL, NULL, 0, NULL}};

static void module_free(void *m) {
  ot_context_destroy(cpu_context);
  cpu_context = NULL;
  for (int k = 0; k < MAX_CUDA_DEVICES; k++) {
    ot_context_destroy(cuda_contexts[k]); /* gives its arena's blocks back first */
    cuda_contexts[k] = NULL;
    Py_CLEAR(cuda_context_arenas[k]);
  }
}

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "ops_transformer._C",
                                        "CPython binding of the ops-transformer C API.", -1,
                                        methods, NULL, NULL, NULL, module_free};

#define INTERN(var, s) \
  if (!(var = PyUnicode_InternFromString(s))) return NULL

PyMODINIT_FUNC PyInit__C(void) {
  INTERN(s_data_ptr, "data_ptr");
  INTERN(s_shape, "shape");
  INTERN(s_stride, "stride");
  INTERN(s_dtype, "dtype");
  INTERN(s_is_cpu, "is_cpu");
  INTERN(s_device, "device");
  INTERN(s_get_device, "get_device");
  INTERN(s_dlpack, "__dlpack__");
  INTERN(s_status, "status");

  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  ot_error_type = PyErr_NewExceptionWithDoc(
      "ops_transformer.Error",
      "An ops-transformer call failed; the message is the C library's ot_last_error(),\n"
      "and `status` names the ot_status (e.g. 'invalid argument').",
      PyExc_RuntimeError, NULL);
  if (!ot_error_type || PyModule_AddObjectRef(m, "Error", ot_error_type) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  ot_status st = ot_context_create(NULL, &cpu_context);
  if (st != OT_OK) {
    raise_status(st);
    Py_DECREF(m);
    return NULL;
  }
  PyModule_AddIntConstant(m, "VERSION_NUMBER", ot_version());
  return m;
}
