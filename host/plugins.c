/* Loading modules: dlopen + the entry symbol + the ABI check, and the address ranges used to decide
 * whether a module can be unmapped (no loop handle may point into it or into a library it brought in). */
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- loaded objects -------------------------------------------------------------------------------- */

static int collect_names(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  json_t *arr = arg;
  char key[64];
  snprintf(key, sizeof key, "%lx", (unsigned long)info->dlpi_addr);
  json_t *o = json_pack("{s:s, s:s}", "name", info->dlpi_name ? info->dlpi_name : "", "base", key);
  if (o)
    json_array_append_new(arr, o);
  return 0;
}

json_t *ah__loaded_objects(void) {
  json_t *arr = json_array();
  if (arr)
    dl_iterate_phdr(collect_names, arr);
  return arr;
}

static bool in_list(json_t *list, const char *name, const char *base) {
  size_t i = 0;
  json_t *o = NULL;
  json_array_foreach(list, i, o) {
    if (strcmp(json_string_value(json_object_get(o, "name")), name) == 0 &&
        strcmp(json_string_value(json_object_get(o, "base")), base) == 0)
      return true;
  }
  return false;
}

typedef struct range_ctx {
  json_t *before;
  ah_mount *m;
  uintptr_t own_base; /* the module itself, recorded even when it was mapped before (a zombie, or kept) */
  int rc;
} range_ctx;

static int add_ranges(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  range_ctx *ctx = arg;
  char base[64];
  snprintf(base, sizeof base, "%lx", (unsigned long)info->dlpi_addr);
  if ((uintptr_t)info->dlpi_addr != ctx->own_base &&
      in_list(ctx->before, info->dlpi_name ? info->dlpi_name : "", base))
    return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD)
      continue;
    ah__range *r = realloc(ctx->m->ranges, (ctx->m->nranges + 1) * sizeof *r);
    if (!r) {
      ctx->rc = AH_ENOMEM;
      return 1;
    }
    ctx->m->ranges = r;
    r[ctx->m->nranges].start = (uintptr_t)(info->dlpi_addr + ph->p_vaddr);
    r[ctx->m->nranges].end = (uintptr_t)(info->dlpi_addr + ph->p_vaddr + ph->p_memsz);
    ctx->m->nranges++;
  }
  return 0;
}

int ah__mount_record_ranges(ah_mount *m, json_t *before) {
  range_ctx ctx = {.before = before, .m = m, .own_base = 0, .rc = 0};
  struct link_map *lm = NULL;
  if (m->dl && dlinfo(m->dl, RTLD_DI_LINKMAP, &lm) == 0 && lm)
    ctx.own_base = (uintptr_t)lm->l_addr;
  dl_iterate_phdr(add_ranges, &ctx);
  return ctx.rc;
}

bool ah__mount_in_module(const ah_mount *m, const void *addr) {
  uintptr_t a = (uintptr_t)addr;
  if (!a)
    return false;
  for (size_t i = 0; i < m->nranges; i++)
    if (a >= m->ranges[i].start && a < m->ranges[i].end)
      return true;
  return false;
}

/* ---- opening a module ----------------------------------------------------------------------------- */

#define WHY(...)                             \
  do {                                       \
    if (why)                                 \
      *why = NULL;                           \
    char *w_ = NULL;                         \
    if (asprintf(&w_, __VA_ARGS__) >= 0) {   \
      AH_LOG_E("plugins", "refused %s", w_); \
      if (why)                               \
        *why = w_;                           \
      else                                   \
        free(w_);                            \
    }                                        \
  } while (0)

int ah__plugin_open(const char *path, void **dl_out, const ah_plugin_desc **desc_out, char **why) {
  dlerror();
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char *e = dlerror(); /* copied at once: the next dl call overwrites it */
    char msg[512];
    snprintf(msg, sizeof msg, "%s", e ? e : "unknown error");
    WHY("%s: field path: dlopen failed: %s", path, msg);
    return AH_ELOAD;
  }
  dlerror();
  void *sym = dlsym(dl, AH_PLUGIN_ENTRY_SYMBOL);
  if (!sym) {
    const char *e = dlerror();
    char msg[512];
    snprintf(msg, sizeof msg, "%s", e ? e : "symbol is NULL");
    WHY("%s: field " AH_PLUGIN_ENTRY_SYMBOL ": no such exported symbol (%s)", path, msg);
    dlclose(dl);
    return AH_ELOAD;
  }
  ah_plugin_entry_fn entry = NULL;
  memcpy(&entry, &sym, sizeof entry);
  const ah_plugin_desc *d = entry(AH_ABI_VERSION);
  int rc = 0;
  if (!d) {
    WHY("%s: field descriptor: the entry returned NULL (the plugin refused host ABI %u.%u)", path,
        AH_ABI_MAJOR, AH_ABI_MINOR);
    rc = AH_EABI;
  } else if (d->struct_size < offsetof(ah_plugin_desc, may_withdraw)) {
    WHY("%s: field struct_size: %u is smaller than the smallest descriptor (%zu)", path, d->struct_size,
        offsetof(ah_plugin_desc, may_withdraw));
    rc = AH_EABI;
  } else if (AH_ABI_MAJOR_OF(d->abi) != AH_ABI_MAJOR) {
    WHY("%s: field abi: built for ABI major %u, the host has major %u", path, AH_ABI_MAJOR_OF(d->abi),
        AH_ABI_MAJOR);
    rc = AH_EABI;
  } else if (AH_ABI_MINOR_OF(d->abi) > AH_ABI_MINOR) {
    WHY("%s: field abi: built for ABI %u.%u, newer than the host's %u.%u", path, AH_ABI_MAJOR_OF(d->abi),
        AH_ABI_MINOR_OF(d->abi), AH_ABI_MAJOR, AH_ABI_MINOR);
    rc = AH_EABI;
  } else if (!d->mount) {
    WHY("%s: field mount: missing (required)", path);
    rc = AH_EINVAL;
  } else if (!ah__valid_plugin_name(d->name)) {
    WHY("%s: field name: must match [a-z][a-z0-9-]{0,31}", path);
    rc = AH_EINVAL;
  }
  if (rc) {
    dlclose(dl);
    return rc;
  }
  *dl_out = dl;
  *desc_out = d;
  return 0;
}
