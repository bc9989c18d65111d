/* safetensors.c -- the safetensors reader.
 *
 * Format: 8 bytes little-endian N, then N bytes of JSON: {"name": {"dtype": "BF16",
 * "shape": [d0, ...], "data_offsets": [begin, end]}, ..., "__metadata__": {...}}, then the
 * data; offsets count from the first byte after the header. Files are mmap'ed; every
 * header field is checked against the file's size before anything is read. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "internal.h"

bool ote_st_dtype(const char *s, DLDataType *out) {
  if (!strcmp(s, "F32")) { *out = OTE_F32; return true; }
  if (!strcmp(s, "F16")) { *out = OTE_F16; return true; }
  if (!strcmp(s, "BF16")) { *out = OTE_BF16; return true; }
  return false;
}

/* Bytes per element of every safetensors dtype (0 when unknown). */
static size_t st_elem_size(const char *s) {
  static const struct { const char *n; size_t sz; } T[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2},  {"U8", 1},  {"BOOL", 1},
      {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
    if (!strcmp(s, T[i].n)) return T[i].sz;
  return 0;
}

static int cmp_tensor(const void *a, const void *b) {
  return strcmp(((const ote_st_tensor *)a)->name, ((const ote_st_tensor *)b)->name);
}

static bool json_u64(const cJSON *it, uint64_t *out) {
  if (!cJSON_IsNumber(it)) return false;
  double d = it->valuedouble;
  if (d < 0 || d > 9007199254740992.0 || d != (double)(uint64_t)d) return false;
  *out = (uint64_t)d;
  return true;
}

/* Parses the header of an mmap'ed file and appends its tensors. */
static ot_status parse_header(ote_st_set *set, int fi) {
  const char *path = set->paths[fi];
  const uint8_t *base = set->maps[fi];
  size_t size = set->sizes[fi];
  if (size < 8)
    return ote_error(OT_ERR_INVALID_ARGUMENT,
                     "%s: truncated safetensors file (%zu bytes, no 8-byte header length)", path, size);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
  if (hlen < 2 || hlen > size - 8 || hlen > (100u << 20))
    return ote_error(OT_ERR_INVALID_ARGUMENT,
                     "%s: bad safetensors header length %llu (file has %zu bytes; truncated or not "
                     "a safetensors file)", path, (unsigned long long)hlen, size);
  cJSON *root = cJSON_ParseWithLength((const char *)base + 8, (size_t)hlen);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: the safetensors header is not a valid JSON object",
                     path);
  }
  const uint8_t *data = base + 8 + hlen;
  size_t data_size = size - 8 - (size_t)hlen;
  int n = cJSON_GetArraySize(root);
  ote_st_tensor *grown = realloc(set->tensors, sizeof *grown * (size_t)(set->n_tensors + n + 1));
  if (!grown) { cJSON_Delete(root); return ote_error(OT_ERR_OOM, "%s: out of memory", path); }
  set->tensors = grown;
  ot_status st = OT_OK;
  const cJSON *e;
  cJSON_ArrayForEach(e, root) {
    if (!strcmp(e->string, "__metadata__")) continue;
    const char *name = e->string;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) ||
        cJSON_GetArraySize(offs) != 2) {
      st = ote_error(OT_ERR_INVALID_ARGUMENT,
                     "%s: tensor %s: header entry needs \"dtype\", \"shape\" and \"data_offsets\" [begin, end]",
                     path, name);
      break;
    }
    ote_st_tensor t;
    memset(&t, 0, sizeof t);
    size_t esz = st_elem_size(dt->valuestring);
    if (!esz || strlen(dt->valuestring) >= sizeof t.dtype) {
      st = ote_error(OT_ERR_INVALID_ARGUMENT, "%s: tensor %s: unknown dtype \"%s\"", path, name,
                     dt->valuestring);
      break;
    }
    snprintf(t.dtype, sizeof t.dtype, "%s", dt->valuestring);
    t.ndim = cJSON_GetArraySize(shape);
    if (t.ndim > 8) {
      st = ote_error(OT_ERR_INVALID_ARGUMENT, "%s: tensor %s: %d dimensions (at most 8)", path, name,
                     t.ndim);
      break;
    }
    uint64_t numel = 1;
    bool ok = true;
    for (int i = 0; i < t.ndim && ok; i++) {
      uint64_t d;
      ok = json_u64(cJSON_GetArrayItem(shape, i), &d) && d < (1ull << 40);
      if (ok) {
        t.shape[i] = (int64_t)d;
        if (d && numel > UINT64_MAX / d) ok = false;
        numel *= d;
      }
    }
    uint64_t b = 0, en = 0;
    if (!ok || !json_u64(cJSON_GetArrayItem(offs, 0), &b) || !json_u64(cJSON_GetArrayItem(offs, 1), &en)) {
      st = ote_error(OT_ERR_INVALID_ARGUMENT, "%s: tensor %s: bad shape or data_offsets", path, name);
      break;
    }
    if (b > en || en > data_size) {
      st = ote_error(OT_ERR_INVALID_ARGUMENT,
                     "%s: tensor %s: data_offsets [%llu, %llu] run past the end of the data (%zu "
                     "bytes; truncated file?)", path, name, (unsigned long long)b,
                     (unsigned long long)en, data_size);
      break;
    }
    if (numel > UINT64_MAX / esz || en - b != numel * esz) {
      st = ote_error(OT_ERR_INVALID_ARGUMENT,
                     "%s: tensor %s: data_offsets hold %llu bytes but shape and dtype %s need %llu",
                     path, name, (unsigned long long)(en - b), t.dtype,
                     (unsigned long long)(numel * esz));
      break;
    }
    t.data = data + b;
    t.nbytes = (size_t)(en - b);
    t.file = fi;
    t.name = strdup(name);
    if (!t.name) { st = ote_error(OT_ERR_OOM, "%s: out of memory", path); break; }
    set->tensors[set->n_tensors++] = t;
  }
  cJSON_Delete(root);
  return st;
}

static ot_status map_file(ote_st_set *set, const char *path) {
  char **paths = realloc(set->paths, sizeof *paths * (size_t)(set->n_files + 1));
  if (paths) set->paths = paths;
  void **maps = realloc(set->maps, sizeof *maps * (size_t)(set->n_files + 1));
  if (maps) set->maps = maps;
  size_t *sizes = realloc(set->sizes, sizeof *sizes * (size_t)(set->n_files + 1));
  if (sizes) set->sizes = sizes;
  if (!paths || !maps || !sizes) return ote_error(OT_ERR_OOM, "%s: out of memory", path);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: cannot open the file", path);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: not a regular file", path);
  }
  void *m = NULL;
  size_t size = (size_t)st.st_size;
  if (size > 0) {
    m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      close(fd);
      return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: mmap failed", path);
    }
  }
  close(fd);
  int fi = set->n_files++;
  set->paths[fi] = strdup(path);
  set->maps[fi] = m;
  set->sizes[fi] = size;
  if (!set->paths[fi]) return ote_error(OT_ERR_OOM, "%s: out of memory", path);
  return parse_header(set, fi);
}

static ot_status finish(ote_st_set *set) {
  if (set->n_tensors > 1) qsort(set->tensors, (size_t)set->n_tensors, sizeof *set->tensors, cmp_tensor);
  for (int i = 1; i < set->n_tensors; i++)
    if (!strcmp(set->tensors[i].name, set->tensors[i - 1].name))
      return ote_error(OT_ERR_INVALID_ARGUMENT, "tensor %s is in two files: %s and %s",
                       set->tensors[i].name, set->paths[set->tensors[i - 1].file],
                       set->paths[set->tensors[i].file]);
  return OT_OK;
}

ot_status ote_st_open_file(ote_st_set *set, const char *path) {
  memset(set, 0, sizeof *set);
  ot_status st = map_file(set, path);
  if (st == OT_OK) st = finish(set);
  if (st != OT_OK) ote_st_close(set);
  return st;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The shard names: from model.safetensors.index.json's weight_map, else every
 * *.safetensors in the directory, sorted. */
static ot_status list_shards(const char *dir, char ***names_out, int *n_out) {
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  char **names = NULL;
  int n = 0;
  FILE *f = fopen(path, "rb");
  if (f) {
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    rewind(f);
    char *text = len >= 0 && len < (64L << 20) ? malloc((size_t)len + 1) : NULL;
    size_t got = text ? fread(text, 1, (size_t)len, f) : 0;
    fclose(f);
    if (!text || got != (size_t)len) {
      free(text);
      return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: cannot read the file", path);
    }
    cJSON *root = cJSON_ParseWithLength(text, got);
    free(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
      cJSON_Delete(root);
      return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: not valid JSON with a \"weight_map\" object",
                       path);
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
      if (!cJSON_IsString(e) || strchr(e->valuestring, '/')) {
        cJSON_Delete(root);
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
        return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: weight_map[\"%s\"] is not a file name", path,
                         e->string);
      }
      bool seen = false;
      for (int i = 0; i < n && !seen; i++) seen = !strcmp(names[i], e->valuestring);
      if (seen) continue;
      char **g = realloc(names, sizeof *names * (size_t)(n + 1));
      if (!g) break;
      names = g;
      names[n++] = strdup(e->valuestring);
    }
    cJSON_Delete(root);
  } else {
    DIR *d = opendir(dir);
    if (!d) return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: cannot open the directory", dir);
    struct dirent *de;
    while ((de = readdir(d))) {
      size_t l = strlen(de->d_name);
      if (l <= 12 || strcmp(de->d_name + l - 12, ".safetensors")) continue;
      char **g = realloc(names, sizeof *names * (size_t)(n + 1));
      if (!g) break;
      names = g;
      names[n++] = strdup(de->d_name);
    }
    closedir(d);
  }
  if (n == 0) {
    free(names);
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: no *.safetensors files", dir);
  }
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  *names_out = names;
  *n_out = n;
  return OT_OK;
}

ot_status ote_st_open_dir(ote_st_set *set, const char *dir) {
  memset(set, 0, sizeof *set);
  char **names = NULL;
  int n = 0;
  OTE_TRY(list_shards(dir, &names, &n));
  ot_status st = OT_OK;
  for (int i = 0; i < n && st == OT_OK; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, names[i] ? names[i] : "");
    st = map_file(set, path);
  }
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
  if (st == OT_OK) st = finish(set);
  if (st != OT_OK) ote_st_close(set);
  return st;
}

const ote_st_tensor *ote_st_find(const ote_st_set *set, const char *name) {
  ote_st_tensor key;
  key.name = (char *)name;
  if (set->n_tensors == 0) return NULL;
  return bsearch(&key, set->tensors, (size_t)set->n_tensors, sizeof key, cmp_tensor);
}

void ote_st_close(ote_st_set *set) {
  for (int i = 0; i < set->n_tensors; i++) free(set->tensors[i].name);
  free(set->tensors);
  for (int i = 0; i < set->n_files; i++) {
    if (set->maps[i]) munmap(set->maps[i], set->sizes[i]);
    free(set->paths[i]);
  }
  free(set->paths);
  free(set->maps);
  free(set->sizes);
  memset(set, 0, sizeof *set);
}
