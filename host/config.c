/* agenthost — configuration: defaults, INI file (libinih), environment, command line. See config.h.
 *
 * Layers are applied in order defaults → file → environment → command line, each one overwriting what
 * the one before set; within a layer the last occurrence of a key wins. Defaults that depend on other
 * settings (runtime_dir on state_dir, a plugin's path on plugin_dir) are filled in last.
 *
 * Line numbers. Debian's libinih is built without INI_HANDLER_LINENO, so the handler is not told the
 * line. The file is therefore read into memory and fed to ini_parse_stream() by our own reader, one line
 * per call; inih calls the handler for a line before it asks for the next one, so the reader's line
 * counter is the line of the pair being handled. The reader also
 *  - strips leading blanks, which turns off inih's multi-line continuation (an indented "key = value"
 *    after another key would otherwise be glued to the previous value);
 *  - reads a "key = value" line longer than inih's line buffer itself (inih would silently cut it and
 *    parse the rest as a new line) and hands inih a short stand-in (long_line), so values have no length
 *    limit but the file's; refuses any other over-long line and a section name longer than inih's
 *    section buffer (49 bytes; inih would cut it);
 *  - sees section headers, so an empty [plugin.NAME] section still names a plugin and an unknown or bad
 *    section is reported at its own line.
 * Before parsing, the whole file is checked for NUL bytes, control characters and invalid UTF-8 (jansson
 * strings must be UTF-8, and the values end up in logs and JSON).
 */
#include "config.h"
#include "usage.h"

#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agenthost/errors.h"
#include "hooks.h"
#include "readall.h"
#include "store.h"

/* Fallbacks so that this file compiles on its own; the meson build defines all three. */
#ifndef AH_INSTALL_PLUGIN_DIR
#define AH_INSTALL_PLUGIN_DIR "/usr/local/lib/agenthost/plugins"
#endif
#ifndef AH_BUILD_HOST_DIR
#define AH_BUILD_HOST_DIR ""
#endif
#ifndef AH_BUILD_PLUGIN_DIR
#define AH_BUILD_PLUGIN_DIR ""
#endif

#define CONFIG_LOG "config"
/* Plugin and provider names: [a-z][a-z0-9-]*, at most this long ("provider." + name fits inih's 49-byte
 * section buffer). */
#define NAME_MAX_LEN 40
#define SECTION_MAX_LEN 49
#define KEY_MAX_LEN 64
#define FILE_MAX_BYTES (4u * 1024u * 1024u)
/* Longest user-supplied text quoted in a message (escaped). */
#define QUOTE_MAX 96

typedef enum section_kind {
  SECTION_INVALID = 0,
  SECTION_HOST,
  SECTION_PLUGIN,
  SECTION_PROVIDER,
  SECTION_MCP,     /* [mcp.NAME]: an MCP server, handed to the mcp plugin as its config's `servers` */
  SECTION_HOOK,    /* [hook.NAME]: a command hook (docs/hooks.md) */
  SECTION_UNKNOWN, /* warned about once, its keys ignored */
} section_kind;

typedef struct loader {
  ah_config *cfg;
  char *const *envp;
  int rc;    /* 0, AH_ECONFIG or AH_ENOMEM */
  char *err; /* the first error */

  /* Which defaults still apply when all layers are read. */
  bool plugin_dir_set;
  /* Where default_provider was set ("" = the default) and where each provider was first named. */
  char *default_provider_where;
  json_t *provider_where;
  json_t *hook_where; /* where each [hook.NAME] began, for the checks at the end */

  /* The file being parsed. */
  char *long_value; /* the value of a line longer than inih's buffer, until its pair is handled */
  const char *file;
  const char *buf;
  size_t len;
  size_t pos;
  int lineno;
  char *section; /* as inih reports it */
  section_kind kind;
  const char *name; /* plugin or provider name inside `section` */

  /* Warnings are logged only when the load succeeds: after an error (say a syntax error that leaves
   * inih in the previous section) they would be noise. */
  json_t *warnings;
} loader;

static const char *const mode_names[] = {"serve", "sdk", "acp"};
static const char *const provider_types[] = {"echo", "acp", "openai"};
static const char *const default_plugins[] = {"browser", "remote"};

/* ---- small helpers ---------------------------------------------------------------------------------- */

static void fail(loader *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail(loader *L, const char *fmt, ...) {
  if (L->rc)
    return; /* the first error is the one reported */
  va_list ap;
  va_start(ap, fmt);
  char *msg = NULL;
  if (vasprintf(&msg, fmt, ap) < 0) {
    L->rc = AH_ENOMEM;
    L->err = NULL;
  } else {
    L->rc = AH_ECONFIG;
    L->err = msg;
  }
  va_end(ap);
}

static void warn(loader *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void warn(loader *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *msg = NULL;
  if (vasprintf(&msg, fmt, ap) >= 0) {
    json_t *s = json_string(msg);
    if (!s || json_array_append_new(L->warnings, s) != 0) /* a message that is not UTF-8 is dropped */
      AH_LOG_W(CONFIG_LOG, "%s", msg);
    free(msg);
  }
  va_end(ap);
}

static void fail_nomem(loader *L) {
  if (L->rc)
    return;
  L->rc = AH_ENOMEM;
  L->err = strdup("out of memory");
}

/* `s` escaped for a message (log.h rules) into `buf`, cut at `cap` bytes. */
static const char *esc(char *buf, size_t cap, const char *s) {
  ah__log_escape(buf, cap, s ? s : "", s ? strlen(s) : 0);
  return buf;
}

/* A key whose value may be a credential: its value is never quoted in a message or a log. */
static bool key_is_secret(const char *key) {
  static const char *const words[] = {"token", "key", "secret", "password"};
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
    if (strcasestr(key, words[i]))
      return true;
  return false;
}

/* " \"value\"" for a message, or "" when the key is secret-like. */
static const char *quote_value(char *buf, size_t cap, const char *key, const char *value) {
  if (key_is_secret(key)) {
    buf[0] = '\0';
    return buf;
  }
  char tmp[QUOTE_MAX];
  snprintf(buf, cap, " \"%s\"", esc(tmp, sizeof tmp, value));
  return buf;
}

bool ah__config_name_valid(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > NAME_MAX_LEN || s[0] < 'a' || s[0] > 'z')
    return false;
  for (size_t i = 1; i < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
      return false;
  return true;
}

static bool key_valid(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > KEY_MAX_LEN || s[0] < 'a' || s[0] > 'z')
    return false;
  for (size_t i = 1; i < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
      return false;
  return true;
}

/* Length of the valid UTF-8 sequence at `s` (at most `n` bytes), 0 when invalid (overlong, surrogate,
 * above U+10FFFF, cut short). */
static size_t utf8_len(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  size_t len = c < 0x80                   ? 1
               : (c >= 0xc2 && c <= 0xdf) ? 2
               : (c >= 0xe0 && c <= 0xef) ? 3
               : (c >= 0xf0 && c <= 0xf4) ? 4
                                          : 0;
  if (len == 0 || n < len)
    return 0;
  for (size_t i = 1; i < len; i++)
    if ((s[i] & 0xc0) != 0x80)
      return 0;
  if (c == 0xe0 && s[1] < 0xa0)
    return 0; /* overlong */
  if (c == 0xed && s[1] >= 0xa0)
    return 0; /* surrogate */
  if (c == 0xf0 && s[1] < 0x90)
    return 0; /* overlong */
  if (c == 0xf4 && s[1] >= 0x90)
    return 0; /* above U+10FFFF */
  return len;
}

/* NULL when `s` is valid UTF-8 without control characters (tab allowed), else what is wrong. */
static const char *text_problem(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s);
  for (size_t i = 0; i < n;) {
    if ((p[i] < 0x20 && p[i] != '\t') || p[i] == 0x7f)
      return "a control character";
    size_t len = utf8_len(p + i, n - i);
    if (len == 0)
      return "invalid UTF-8";
    i += len;
  }
  return NULL;
}

static const char *env_get(char *const *envp, const char *name) {
  size_t n = strlen(name);
  const char *found = NULL;
  for (char *const *e = envp; e && *e; e++)
    if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
      found = *e + n + 1; /* the last one, as with duplicate keys */
  return found;
}

/* The value of an XDG base directory variable, or NULL when unset, empty or relative (the XDG spec says
 * to ignore a relative one). */
static const char *env_abs(char *const *envp, const char *name) {
  const char *v = env_get(envp, name);
  return v && v[0] == '/' ? v : NULL;
}

/* `dir` + "/" + `rest` without doubling slashes; NULL on OOM. */
static char *path_join(const char *dir, const char *rest) {
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/')
    n--;
  char *out = NULL;
  if (asprintf(&out, "%.*s%s%s", (int)n, dir, n == 1 && dir[0] == '/' ? "" : "/", rest) < 0)
    return NULL;
  return out;
}

static bool replace_str(loader *L, char **slot, const char *value) {
  char *copy = strdup(value);
  if (!copy) {
    fail_nomem(L);
    return false;
  }
  free(*slot);
  *slot = copy;
  return true;
}

static bool obj_set_new(loader *L, json_t *obj, const char *key, json_t *value) {
  if (!value || json_object_set_new(obj, key, value) != 0) {
    fail_nomem(L);
    return false;
  }
  return true;
}

/* ---- plugin and provider entries ------------------------------------------------------------------- */

/* The entry of plugin `name`, created with enabled = false and modes = ["serve"] on first mention. */
static json_t *plugin_entry(loader *L, const char *name) {
  json_t *p = json_object_get(L->cfg->plugins, name);
  if (p)
    return p;
  p = json_pack("{s:b, s:[s]}", "enabled", 0, "modes", "serve");
  if (!p || json_object_set_new(L->cfg->plugins, name, p) != 0) {
    fail_nomem(L);
    return NULL;
  }
  return p;
}

/* The server `name` of [mcp.NAME]: [plugin.mcp]'s `servers` entry, created empty on first mention. */
static json_t *mcp_entry(loader *L, const char *name) {
  json_t *p = plugin_entry(L, "mcp");
  json_t *servers = p ? json_object_get(p, "servers") : NULL;
  if (p && !servers && (!(servers = json_object()) || json_object_set_new(p, "servers", servers) != 0)) {
    fail_nomem(L);
    return NULL;
  }
  json_t *srv = servers ? json_object_get(servers, name) : NULL;
  if (servers && !srv && (!(srv = json_object()) || json_object_set_new(servers, name, srv) != 0)) {
    fail_nomem(L);
    return NULL;
  }
  return srv;
}

/* The hook `name` of [hook.NAME], created empty on first mention (file order is the order hooks run). */
static json_t *hook_entry(loader *L, const char *name, const char *where) {
  json_t *h = json_object_get(L->cfg->hooks, name);
  if (h)
    return h;
  h = json_object();
  if (!h || json_object_set_new(L->cfg->hooks, name, h) != 0 ||
      json_object_set_new(L->hook_where, name, json_string(where)) != 0) {
    fail_nomem(L);
    return NULL;
  }
  return h;
}

/* The entry of provider `name`, created empty on first mention; `where` is remembered for messages. */
static json_t *provider_entry(loader *L, const char *name, const char *where) {
  json_t *p = json_object_get(L->cfg->providers, name);
  if (p)
    return p;
  p = json_object();
  if (!p || json_object_set_new(L->cfg->providers, name, p) != 0 ||
      json_object_set_new(L->provider_where, name, json_string(where)) != 0) {
    fail_nomem(L);
    return NULL;
  }
  return p;
}

/* ---- values ---------------------------------------------------------------------------------------- */

static int parse_bool(const char *s) {
  static const char *const yes[] = {"true", "yes", "on", "1"};
  static const char *const no[] = {"false", "no", "off", "0"};
  for (size_t i = 0; i < 4; i++) {
    if (strcasecmp(s, yes[i]) == 0)
      return 1;
    if (strcasecmp(s, no[i]) == 0)
      return 0;
  }
  return -1;
}

/* A list value: a JSON array of strings when it starts with '[' (for items with commas or blanks), else
 * comma-separated items with blanks trimmed and empty items dropped. A new array, or NULL when the JSON
 * is not an array of strings (or out of memory: *nomem). keep_empty keeps empty items (as ""). */
static json_t *parse_list(const char *s, bool allow_json, bool keep_empty, bool *nomem);

json_t *ah__config_list(const char *s) {
  bool nomem = false;
  return s ? parse_list(s, true, false, &nomem) : json_array();
}

bool ah__config_mode_valid(const char *mode) {
  return mode &&
         (strcmp(mode, "ask") == 0 || strcmp(mode, "accept_edits") == 0 || strcmp(mode, "read_only") == 0);
}

static json_t *parse_list(const char *s, bool allow_json, bool keep_empty, bool *nomem) {
  *nomem = false;
  if (allow_json && s[0] == '[') {
    json_t *v = json_loads(s, JSON_DECODE_ANY, NULL);
    size_t i;
    json_t *x;
    bool ok = json_is_array(v);
    json_array_foreach(v, i, x) {
      ok = ok && json_is_string(x);
    }
    if (!ok) {
      json_decref(v);
      return NULL;
    }
    return v;
  }
  json_t *arr = json_array();
  for (const char *p = s; arr;) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    while (n && (*p == ' ' || *p == '\t')) {
      p++;
      n--;
    }
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
      n--;
    if ((n || keep_empty) && json_array_append_new(arr, json_stringn(p, n)) != 0) {
      json_decref(arr);
      arr = NULL;
    }
    if (!end)
      break;
    p = end + 1;
  }
  *nomem = arr == NULL;
  return arr;
}

/* "serve, sdk" → ["serve", "sdk"] (blanks trimmed, duplicates dropped) into *out. Returns 0, -1 with
 * the offending item (escaped) in `bad` when an item is not a mode, or AH_ENOMEM. */
static int parse_modes(const char *s, json_t **out, char *bad, size_t badcap) {
  bool nomem = false;
  json_t *items = parse_list(s, false, true, &nomem);
  json_t *arr = json_array();
  if (!items || !arr) {
    json_decref(items);
    json_decref(arr);
    return AH_ENOMEM;
  }
  size_t i = 0;
  json_t *item = NULL;
  json_array_foreach(items, i, item) {
    const char *mode = NULL;
    for (size_t k = 0; k < sizeof mode_names / sizeof mode_names[0]; k++)
      if (strcmp(json_string_value(item), mode_names[k]) == 0)
        mode = mode_names[k];
    if (!mode) {
      ah__log_escape(bad, badcap, json_string_value(item), json_string_length(item));
      json_decref(items);
      json_decref(arr);
      return -1;
    }
    bool dup = false;
    size_t j = 0;
    json_t *v = NULL;
    json_array_foreach(arr, j, v) {
      dup |= strcmp(json_string_value(v), mode) == 0;
    }
    if (!dup && json_array_append_new(arr, json_string(mode)) != 0) {
      json_decref(items);
      json_decref(arr);
      return AH_ENOMEM;
    }
  }
  json_decref(items);
  *out = arr;
  return 0;
}

static bool check_abs_path(loader *L, const char *where, const char *key, const char *value) {
  if (value[0] == '/')
    return true;
  char q[QUOTE_MAX + 8];
  fail(L, "%s: must be an absolute path, got%s (relative paths and ~ are not expanded)", where,
       value[0] ? quote_value(q, sizeof q, key, value) : " an empty value");
  return false;
}

/* Apply one setting from any layer. `where` names it for messages: "FILE:LINE: [section] key",
 * "AGENTHOST_X" or "--flag". */
static void apply(loader *L, section_kind kind, const char *name, const char *key, const char *value,
                  const char *where) {
  char q[QUOTE_MAX + 8];
  const char *problem = text_problem(value);
  if (problem) {
    fail(L, "%s: value contains %s", where, problem);
    return;
  }

  if (kind == SECTION_HOST) {
    ah_config *cfg = L->cfg;
    if (strcmp(key, "state_dir") == 0 || strcmp(key, "runtime_dir") == 0 || strcmp(key, "plugin_dir") == 0) {
      if (!check_abs_path(L, where, key, value))
        return;
      char **slot = key[0] == 's' ? &cfg->state_dir : key[0] == 'r' ? &cfg->runtime_dir : &cfg->plugin_dir;
      if (replace_str(L, slot, value) && key[0] == 'p')
        L->plugin_dir_set = true;
    } else if (strcmp(key, "log_level") == 0) {
      ah_log_level level = ah__log_level_parse(value);
      if (level == AH_LOG_INVALID) {
        fail(L, "%s: unknown log level%s (expected error, warn, info or debug)", where,
             quote_value(q, sizeof q, key, value));
        return;
      }
      cfg->log_level = level;
    } else if (strcmp(key, "synchronous") == 0) {
      /* The store's durability (docs/sessions.md): normal survives a killed process, full a power loss. */
      if (strcmp(value, "off") != 0 && strcmp(value, "normal") != 0 && strcmp(value, "full") != 0) {
        fail(L, "%s: unknown synchronous mode%s (expected off, normal or full)", where,
             quote_value(q, sizeof q, key, value));
        return;
      }
      replace_str(L, &cfg->synchronous, value);
    } else if (strcmp(key, "default_mode") == 0) {
      /* A new session's mode (docs/sessions.md "Modes"). */
      if (!ah__config_mode_valid(value)) {
        fail(L, "%s: unknown mode%s (expected ask, accept_edits or read_only)", where,
             quote_value(q, sizeof q, key, value));
        return;
      }
      replace_str(L, &cfg->default_mode, value);
    } else if (strcmp(key, "prices") == 0) {
      /* A price table (docs/usage.md): read and checked now, so a bad one is a configuration error. */
      if (!check_abs_path(L, where, key, value))
        return;
      char why[320];
      ah_prices *p = ah__prices_load(value, why, sizeof why);
      if (!p) {
        fail(L, "%s: %s", where, why);
        return;
      }
      ah__prices_free(p);
      replace_str(L, &cfg->prices, value);
    } else if (strcmp(key, "record_dir") == 0) {
      /* Recordings of the surfaces' connections (docs/usage.md "Recordings"): off unless set. */
      if (!check_abs_path(L, where, key, value))
        return;
      replace_str(L, &cfg->record_dir, value);
    } else if (strcmp(key, "record_surfaces") == 0) {
      json_t *list = ah__config_list(value);
      if (!list) {
        fail(L, "%s: a list of surface (plugin) names is required", where);
        return;
      }
      json_decref(cfg->record_surfaces);
      cfg->record_surfaces = list;
    } else if (strcmp(key, "record_max_bytes") == 0 || strcmp(key, "record_max_files") == 0) {
      char *end = NULL;
      errno = 0;
      unsigned long long n = strtoull(value, &end, 10);
      bool bytes = strcmp(key, "record_max_bytes") == 0;
      if (errno || *end || !value[0] || value[0] == '-' || n < 1 || n > (bytes ? (1ULL << 40) : 10000)) {
        fail(L, "%s: must be a whole number from 1 to %s%s", where, bytes ? "2^40 (bytes)" : "10000",
             quote_value(q, sizeof q, key, value));
        return;
      }
      if (bytes)
        cfg->record_max_bytes = n;
      else
        cfg->record_max_files = (int)n;
    } else if (strcmp(key, "idle_unload_s") == 0) {
      /* seconds, a fraction allowed ("0.5"); 0 = never */
      char *end = NULL;
      errno = 0;
      double v = strtod(value, &end);
      if (errno || *end || !value[0] || value[strspn(value, "0123456789.")] || !(v >= 0) || v > 31536000.0 ||
          (v > 0 && v < 0.001)) {
        fail(L, "%s: must be a number of seconds from 0.001 to 31536000, or 0 (never)%s", where,
             quote_value(q, sizeof q, key, value));
        return;
      }
      cfg->idle_unload_ms = v == 0 ? UINT64_MAX : (uint64_t)(v * 1000.0 + 0.5);
    } else if (strcmp(key, "lease_ttl_ms") == 0) {
      char *end = NULL;
      errno = 0;
      unsigned long long n = strtoull(value, &end, 10);
      if (errno || *end || !value[0] || value[0] == '-' || n < 300 || n > 3600000) {
        fail(L, "%s: must be a whole number of milliseconds from 300 to 3600000%s", where,
             quote_value(q, sizeof q, key, value));
        return;
      }
      cfg->lease_ttl_ms = n;
    } else if (strcmp(key, "store_url") == 0) {
      /* The shared store (docs/scaling.md). A password inside it would be printed wherever the string is:
       * refused (its value is never quoted). */
      const char *at = strchr(value, '@');
      const char *scheme = strstr(value, "://");
      bool uri_password = scheme && at && memchr(scheme + 3, ':', (size_t)(at - scheme - 3)) != NULL;
      if (!value[0] || strcasestr(value, "password") || uri_password) {
        fail(L, "%s: %s", where,
             value[0] ? "must not hold a password: set store_password_file, or AGENTHOST_HOST_STORE_PASSWORD"
                      : "must not be empty");
        return;
      }
      replace_str(L, &cfg->store_url, value);
    } else if (strcmp(key, "store_password_file") == 0) {
      if (!check_abs_path(L, where, key, value))
        return;
      replace_str(L, &cfg->store_password_file, value);
    } else if (strcmp(key, "store_password") == 0) {
      replace_str(L, &cfg->store_password, value);
    } else if (strcmp(key, "default_provider") == 0) {
      if (!ah__config_name_valid(value)) {
        fail(L, "%s: bad provider name%s (expected [a-z][a-z0-9-]*, at most %d characters)", where,
             quote_value(q, sizeof q, key, value), NAME_MAX_LEN);
        return;
      }
      if (replace_str(L, &cfg->default_provider, value))
        replace_str(L, &L->default_provider_where, where);
    } else {
      /* Only the key's name is logged: an unknown key may well hold a secret. */
      warn(L, "%s: unknown key ignored", where);
    }
    return;
  }

  if (!key_valid(key)) {
    fail(L, "%s: bad key name (expected [a-z][a-z0-9_]*, at most %d characters)", where, KEY_MAX_LEN);
    return;
  }

  if (kind == SECTION_PLUGIN) {
    json_t *p = plugin_entry(L, name);
    if (!p)
      return;
    if (strcmp(key, "enabled") == 0) {
      int b = parse_bool(value);
      if (b < 0) {
        fail(L, "%s: not a boolean%s (expected true/false, yes/no, on/off or 1/0)", where,
             quote_value(q, sizeof q, key, value));
        return;
      }
      obj_set_new(L, p, "enabled", json_boolean(b));
    } else if (strcmp(key, "modes") == 0) {
      char bad[QUOTE_MAX] = "";
      json_t *modes = NULL;
      int r = parse_modes(value, &modes, bad, sizeof bad);
      if (r == AH_ENOMEM)
        fail_nomem(L);
      else if (r < 0)
        fail(L, "%s: unknown mode \"%s\" (expected a comma-separated list of serve, sdk, acp)", where, bad);
      else
        obj_set_new(L, p, "modes", modes);
    } else if (strcmp(key, "path") == 0) {
      if (check_abs_path(L, where, key, value))
        obj_set_new(L, p, "path", json_string(value));
    } else {
      obj_set_new(L, p, key, json_string(value));
    }
    return;
  }

  if (kind == SECTION_MCP) {
    static const char *const keys[] = {"command",
                                       "args",
                                       "env",
                                       "cwd",
                                       "url",
                                       "headers",
                                       "bearer_token_env",
                                       "enabled",
                                       "enabled_tools",
                                       "disabled_tools",
                                       "startup_timeout_ms",
                                       "tool_timeout_ms"};
    bool known = false;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
      known |= strcmp(key, keys[i]) == 0;
    if (!known) {
      warn(L, "%s: unknown key ignored", where); /* only its name: it may hold a secret */
      return;
    }
    json_t *srv = mcp_entry(L, name);
    if (srv)
      obj_set_new(L, srv, key, json_string(value));
    return;
  }

  if (kind == SECTION_HOOK) {
    json_t *hk = hook_entry(L, name, where);
    if (!hk)
      return;
    bool nomem = false;
    if (strcmp(key, "event") == 0) {
      if (!ah__hook_point_valid(value)) {
        fail(L, "%s: unknown hook event%s (expected %s)", where, quote_value(q, sizeof q, key, value),
             AH_HOOK_POINTS_TEXT);
        return;
      }
      obj_set_new(L, hk, key, json_string(value));
    } else if (strcmp(key, "command") == 0 || strcmp(key, "cwd") == 0) {
      if (!value[0]) {
        fail(L, "%s: must not be empty", where);
        return;
      }
      if (key[0] == 'c' && key[1] == 'w' && !check_abs_path(L, where, key, value))
        return;
      obj_set_new(L, hk, key, json_string(value));
    } else if (strcmp(key, "match") == 0 || strcmp(key, "args") == 0 || strcmp(key, "env") == 0) {
      json_t *list = parse_list(value, true, false, &nomem);
      if (!list) {
        if (nomem)
          fail_nomem(L);
        else
          fail(L, "%s: a JSON list must be an array of strings", where);
        return;
      }
      size_t i;
      json_t *x;
      json_array_foreach(list, i, x) {
        const char *eq = strchr(json_string_value(x), '=');
        if (key[0] == 'e' && (!eq || eq == json_string_value(x))) {
          fail(L, "%s: item %zu is not NAME=value", where, i + 1); /* the value may be a secret */
          json_decref(list);
          return;
        }
      }
      obj_set_new(L, hk, key, list);
    } else if (strcmp(key, "timeout_ms") == 0) {
      char *end = NULL;
      errno = 0;
      long long v = strtoll(value, &end, 10);
      if (errno || !value[0] || *end || v < 1 || v > AH_HOOK_MAX_TIMEOUT_MS) {
        fail(L, "%s: not a number of milliseconds from 1 to %d%s", where, AH_HOOK_MAX_TIMEOUT_MS,
             quote_value(q, sizeof q, key, value));
        return;
      }
      obj_set_new(L, hk, key, json_integer(v));
    } else if (strcmp(key, "on_error") == 0) {
      if (strcmp(value, "deny") != 0 && strcmp(value, "allow") != 0) {
        fail(L, "%s: expected deny or allow%s", where, quote_value(q, sizeof q, key, value));
        return;
      }
      obj_set_new(L, hk, key, json_string(value));
    } else if (strcmp(key, "enabled") == 0) {
      int b = parse_bool(value);
      if (b < 0) {
        fail(L, "%s: not a boolean%s (expected true/false, yes/no, on/off or 1/0)", where,
             quote_value(q, sizeof q, key, value));
        return;
      }
      obj_set_new(L, hk, key, json_boolean(b));
    } else {
      warn(L, "%s: unknown key ignored", where); /* only its name: it may hold a secret */
    }
    return;
  }

  if (kind == SECTION_PROVIDER) {
    json_t *p = provider_entry(L, name, where);
    if (!p)
      return;
    if (strcmp(key, "type") == 0 && !ah__config_name_valid(value)) {
      /* echo, or the name of the plugin that provides the type (acp, openai, or a third party's). */
      fail(L,
           "%s: bad provider type%s (expected echo or a plugin name: [a-z][a-z0-9-]*, at most %d characters)",
           where, quote_value(q, sizeof q, key, value), NAME_MAX_LEN);
      return;
    }
    obj_set_new(L, p, key, json_string(value));
  }
}

/* ---- the file -------------------------------------------------------------------------------------- */

/* Classify `section` (as inih will report it) at the current line: warn about an unknown one, refuse a
 * bad plugin or provider name, and make the plugin or provider exist. */
static void begin_section(loader *L, const char *section) {
  char *copy = strdup(section);
  if (!copy) {
    fail_nomem(L);
    return;
  }
  free(L->section);
  L->section = copy;
  L->name = NULL;
  L->kind = SECTION_UNKNOWN;

  char f[512];
  char s[QUOTE_MAX];
  char where[1024];
  esc(f, sizeof f, L->file);
  esc(s, sizeof s, section);
  snprintf(where, sizeof where, "%s:%d: [%s]", f, L->lineno, s);

  /* The sections that name something: [plugin.NAME], [provider.NAME], [mcp.NAME], [hook.NAME]. */
  static const struct {
    const char *prefix;
    section_kind kind;
    const char *what;
  } named[] = {{"plugin", SECTION_PLUGIN, "plugin"},
               {"provider", SECTION_PROVIDER, "provider"},
               {"mcp", SECTION_MCP, "MCP server"},
               {"hook", SECTION_HOOK, "hook"}};
  size_t k = 0;
  size_t plen = 0;
  for (; k < sizeof named / sizeof named[0]; k++) {
    plen = strlen(named[k].prefix);
    if (strncmp(section, named[k].prefix, plen) == 0 && (section[plen] == '.' || section[plen] == '\0'))
      break;
  }
  if (strcmp(section, "host") == 0) {
    L->kind = SECTION_HOST;
  } else if (k < sizeof named / sizeof named[0]) {
    const char *name = section[plen] ? section + plen + 1 : "";
    if (!ah__config_name_valid(name)) {
      fail(L, "%s: bad %s name (expected [a-z][a-z0-9-]*, at most %d characters)", where, named[k].what,
           NAME_MAX_LEN);
      return;
    }
    /* Into our copy: inih's buffer for the section name is not ours to keep. */
    L->name = copy + (name - section);
    L->kind = named[k].kind;
    if (L->kind == SECTION_PLUGIN)
      plugin_entry(L, name);
    else if (L->kind == SECTION_PROVIDER)
      provider_entry(L, name, where);
    else if (L->kind == SECTION_MCP)
      mcp_entry(L, name);
    else
      hook_entry(L, name, where);
  } else if (section[0]) {
    warn(L, "%s: unknown section ignored (expected host, plugin.NAME, provider.NAME, mcp.NAME or hook.NAME)",
         where);
  }
}

/* inih's scan for a section's ']' or a key's '='/':': stops at one of `chars` or at an inline comment
 * (';' after a blank). */
static const char *find_chars_or_comment(const char *s, const char *end, const char *chars) {
  bool was_space = false;
  while (s < end && !strchr(chars, *s) && !(was_space && *s == ';')) {
    was_space = *s == ' ' || *s == '\t' || *s == '\r';
    s++;
  }
  return s;
}

static bool ini_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* A line longer than inih's buffer (its size `num`): a comment is handed on as a blank line; a
 * "key = value" is read here as inih reads one — the key and value trimmed, a value's inline comment (a
 * ';' after a blank) cut — and inih gets "key = \x01", which on_pair replaces by the value kept in
 * L->long_value (inih handles a line before it asks for the next). A control byte never reaches inih
 * from the file (checked before), so the placeholder cannot be a value. Anything else is refused. */
static char *long_line(loader *L, char *str, int num, const char *start, size_t n) {
  char f[512];
  const char *end = start + n;
  while (end > start && ini_space(end[-1]))
    end--;
  if (start < end && (*start == ';' || *start == '#')) {
    snprintf(str, (size_t)num, "\n");
    return str;
  }
  const char *delim = start < end && *start != '[' ? find_chars_or_comment(start, end, "=:") : end;
  const char *key_end = delim;
  while (key_end > start && ini_space(key_end[-1]))
    key_end--;
  size_t kn = (size_t)(key_end - start);
  if (delim >= end || (*delim != '=' && *delim != ':') || kn == 0 || kn + 8 > (size_t)num) {
    fail(L, "%s:%d: line too long (the limit is %d bytes, except for a key = value line)",
         esc(f, sizeof f, L->file), L->lineno, num - 3);
    return NULL;
  }
  const char *v = delim + 1;
  while (v < end && ini_space(*v))
    v++;
  const char *v_end = find_chars_or_comment(v, end, "");
  while (v_end > v && ini_space(v_end[-1]))
    v_end--;
  free(L->long_value);
  L->long_value = strndup(v, (size_t)(v_end - v));
  if (!L->long_value) {
    fail_nomem(L);
    return NULL;
  }
  snprintf(str, (size_t)num, "%.*s = \x01\n", (int)kn, start);
  return str;
}

/* ini_reader: hand inih the next line of the in-memory file, counting lines. */
static char *read_line(char *str, int num, void *stream) {
  loader *L = stream;
  if (L->rc || L->pos >= L->len)
    return NULL;
  const char *start = L->buf + L->pos;
  const char *nl = memchr(start, '\n', L->len - L->pos);
  size_t n = nl ? (size_t)(nl - start) : L->len - L->pos;
  L->pos += n + (nl ? 1 : 0);
  L->lineno++;

  char f[512];
  if (L->lineno == 1 && n >= 3 && memcmp(start, "\xef\xbb\xbf", 3) == 0) {
    start += 3; /* a UTF-8 byte order mark */
    n -= 3;
  }
  while (n && (*start == ' ' || *start == '\t')) {
    start++;
    n--;
  }
  if (num < 3 || n > (size_t)num - 3)
    return long_line(L, str, num, start, n);
  memcpy(str, start, n);
  str[n] = '\n';
  str[n + 1] = '\0';

  if (n && start[0] == '[') {
    const char *end = find_chars_or_comment(start + 1, start + n, "]");
    if (end < start + n && *end == ']') {
      size_t sn = (size_t)(end - start - 1);
      if (sn > SECTION_MAX_LEN) {
        char s[QUOTE_MAX];
        char head[SECTION_MAX_LEN + 1];
        snprintf(head, sizeof head, "%.*s", SECTION_MAX_LEN, start + 1);
        fail(L, "%s:%d: [%s...]: section name too long (at most %d bytes)", esc(f, sizeof f, L->file),
             L->lineno, esc(s, sizeof s, head), SECTION_MAX_LEN);
        return NULL;
      }
      char section[SECTION_MAX_LEN + 1];
      memcpy(section, start + 1, sn);
      section[sn] = '\0';
      begin_section(L, section);
      if (L->rc)
        return NULL;
    }
  }
  return str;
}

/* ini_handler: one "key = value" of the current line. Always returns 1: our own errors are recorded in
 * the loader (with a better message than inih's line number) and stop the reader. */
static int on_pair(void *user, const char *section, const char *key, const char *value) {
  loader *L = user;
  if (L->rc)
    return 1;
  if (!L->section || strcmp(section, L->section) != 0) {
    begin_section(L, section);
    if (L->rc)
      return 1;
  }
  char f[512];
  char s[QUOTE_MAX];
  char k[QUOTE_MAX];
  char where[1024];
  snprintf(where, sizeof where, "%s:%d: [%s] %s", esc(f, sizeof f, L->file), L->lineno,
           esc(s, sizeof s, section), esc(k, sizeof k, key));
  if (L->kind == SECTION_UNKNOWN) {
    if (!section[0])
      warn(L, "%s:%d: key %s outside any section ignored", f, L->lineno, k);
    return 1;
  }
  if (value && strcmp(value, "\x01") == 0 && L->long_value) { /* a long line's value (long_line) */
    apply(L, L->kind, L->name, key, L->long_value, where);
    free(L->long_value);
    L->long_value = NULL;
    return 1;
  }
  apply(L, L->kind, L->name, key, value ? value : "", where);
  return 1;
}

/* Read `path` whole (a regular file of at most FILE_MAX_BYTES). `src` names where the path came from. */
static char *slurp(loader *L, const char *path, const char *src, size_t *len) {
  char f[512];
  char ebuf[128];
  esc(f, sizeof f, path);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    fail(L, "%s%s%s: cannot read: %s", src, src[0] ? ": " : "", f, strerror_r(errno, ebuf, sizeof ebuf));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    fail(L, "%s%s%s: cannot read: not a regular file", src, src[0] ? ": " : "", f);
    close(fd);
    return NULL;
  }
  size_t cap = st.st_size > 0 && (uintmax_t)st.st_size < FILE_MAX_BYTES ? (size_t)st.st_size + 1 : 4096;
  size_t n = 0;
  char *buf = malloc(cap);
  while (buf) {
    if (n == cap) {
      if (cap > FILE_MAX_BYTES) {
        fail(L, "%s%s%s: too large (the limit is %u bytes)", src, src[0] ? ": " : "", f, FILE_MAX_BYTES);
        break;
      }
      char *nb = realloc(buf, cap * 2);
      if (!nb)
        break;
      buf = nb;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      fail(L, "%s%s%s: cannot read: %s", src, src[0] ? ": " : "", f, strerror_r(errno, ebuf, sizeof ebuf));
      break;
    }
    if (r == 0) {
      if (n > FILE_MAX_BYTES) {
        fail(L, "%s%s%s: too large (the limit is %u bytes)", src, src[0] ? ": " : "", f, FILE_MAX_BYTES);
        break;
      }
      close(fd);
      *len = n;
      return buf;
    }
    n += (size_t)r;
  }
  if (!buf || !L->rc)
    fail_nomem(L);
  free(buf);
  close(fd);
  return NULL;
}

static void parse_file(loader *L, const char *path, const char *src) {
  size_t len = 0;
  char *buf = slurp(L, path, src, &len);
  if (!buf)
    return;
  L->file = path;
  L->buf = buf;
  L->len = len;
  char f[512];
  esc(f, sizeof f, path);

  /* NUL bytes, control characters and invalid UTF-8 are refused at their line before inih sees them. A
   * CR is allowed only as part of a CRLF line end. */
  int line = 1;
  for (size_t i = 0; i < len;) {
    const unsigned char c = (unsigned char)buf[i];
    const char *problem = NULL;
    if (c == '\n') {
      line++;
      i++;
      continue;
    }
    if (c == '\r' && (i + 1 == len || buf[i + 1] == '\n')) {
      i++;
      continue;
    }
    if (c == 0)
      problem = "NUL byte";
    else if ((c < 0x20 && c != '\t') || c == 0x7f)
      problem = "control character";
    else if (utf8_len((const unsigned char *)buf + i, len - i) == 0)
      problem = "invalid UTF-8";
    if (problem) {
      fail(L, "%s:%d: %s", f, line, problem);
      break;
    }
    i += utf8_len((const unsigned char *)buf + i, len - i);
  }

  if (!L->rc) {
    if (!replace_str(L, &L->cfg->file, path)) {
      free(buf);
      return;
    }
    int r = ini_parse_stream(read_line, L, on_pair, L);
    if (r == -2) {
      fail_nomem(L);
    } else if (r > 0) {
      /* Our reader stops at our first error, so a syntax error inih reports comes before it. */
      free(L->err);
      L->err = NULL;
      L->rc = 0;
      fail(L, "%s:%d: syntax error (expected [section] or key = value)", f, r);
    }
  }
  free(buf);
  free(L->long_value);
  L->long_value = NULL;
  L->buf = NULL;
  L->file = NULL;
}

/* The file to read: --config, else AGENTHOST_CONFIG (both must exist), else the XDG one if it exists. */
static void load_file(loader *L, const ah_cli_overrides *cli) {
  if (cli && cli->config_file) {
    if (!cli->config_file[0])
      fail(L, "--config: empty file name");
    else
      parse_file(L, cli->config_file, "--config");
    return;
  }
  const char *env = env_get(L->envp, "AGENTHOST_CONFIG");
  if (env && env[0]) {
    parse_file(L, env, "AGENTHOST_CONFIG");
    return;
  }
  const char *xdg = env_abs(L->envp, "XDG_CONFIG_HOME");
  const char *home = env_abs(L->envp, "HOME");
  char *path = xdg    ? path_join(xdg, "agenthost/agenthost.ini")
               : home ? path_join(home, ".config/agenthost/agenthost.ini")
                      : NULL;
  if (!path) {
    if (xdg || home)
      fail_nomem(L);
    return;
  }
  struct stat st;
  if (stat(path, &st) == 0 || (errno != ENOENT && errno != ENOTDIR))
    parse_file(L, path, "");
  free(path);
}

/* ---- the environment ------------------------------------------------------------------------------- */

/* "MY_PLUGIN" → "my-plugin" (n bytes of `s`). */
static char *env_to_name(const char *s, size_t n) {
  char *out = malloc(n + 1);
  if (!out)
    return NULL;
  for (size_t i = 0; i < n; i++)
    out[i] = s[i] == '_' ? '-' : (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] - 'A' + 'a' : s[i]);
  out[n] = '\0';
  return out;
}

static char *env_to_key(const char *s) {
  char *out = strdup(s);
  for (char *p = out; p && *p; p++)
    if (*p >= 'A' && *p <= 'Z')
      *p = (char)(*p - 'A' + 'a');
  return out;
}

/* Split the <NAME>_<KEY> part of AGENTHOST_PLUGIN_… / AGENTHOST_PROVIDER_… (see config.h). */
static void env_entry(loader *L, section_kind kind, const char *var, const char *rest, const char *value,
                      json_t *known) {
  const char *what = kind == SECTION_PLUGIN ? "plugin" : "provider";
  if (!rest[0]) {
    fail(L, "%s: expected AGENTHOST_%s_<NAME>_<KEY>", var, kind == SECTION_PLUGIN ? "PLUGIN" : "PROVIDER");
    return;
  }
  size_t split = 0;
  int matches = 0;
  char *first_match = NULL;
  for (size_t i = 1; rest[i]; i++) {
    if (rest[i] != '_' || !rest[i + 1])
      continue;
    char *cand = env_to_name(rest, i);
    if (!cand) {
      free(first_match);
      fail_nomem(L);
      return;
    }
    if (json_object_get(known, cand)) {
      if (++matches == 1) {
        split = i;
        first_match = cand;
        continue;
      }
      fail(L, "%s: ambiguous: %s \"%s\" or \"%s\" (set it in the file)", var, what, first_match, cand);
      free(cand);
      free(first_match);
      return;
    }
    free(cand);
  }
  free(first_match);
  if (matches == 0) {
    const char *u = strchr(rest, '_');
    split = u ? (size_t)(u - rest) : 0;
  }
  if (split == 0 || !rest[split + 1]) {
    fail(L, "%s: expected AGENTHOST_%s_<NAME>_<KEY>", var, kind == SECTION_PLUGIN ? "PLUGIN" : "PROVIDER");
    return;
  }
  char *name = env_to_name(rest, split);
  char *key = env_to_key(rest + split + 1);
  if (!name || !key)
    fail_nomem(L);
  else if (!ah__config_name_valid(name))
    fail(L, "%s: bad %s name (expected [a-z][a-z0-9-]*, at most %d characters)", var, what, NAME_MAX_LEN);
  else
    apply(L, kind, name, key, value, var);
  free(name);
  free(key);
}

static void load_env(loader *L) {
  /* Names known before the environment is read decide how AGENTHOST_PLUGIN_A_B_C splits; names the
   * environment itself creates are not used, so the result does not depend on the variables' order. */
  json_t *known_plugins = json_copy(L->cfg->plugins);
  json_t *known_providers = json_copy(L->cfg->providers);
  if (!known_plugins || !known_providers)
    fail_nomem(L);
  for (char *const *e = L->envp; e && *e && !L->rc; e++) {
    if (strncmp(*e, "AGENTHOST_", 10) != 0)
      continue;
    const char *eq = strchr(*e, '=');
    if (!eq)
      continue;
    char var[128];
    char v[QUOTE_MAX];
    size_t vn = (size_t)(eq - *e);
    if (vn >= sizeof var) {
      warn(L, "%s: variable name too long, ignored", esc(v, sizeof v, *e));
      continue;
    }
    memcpy(var, *e, vn);
    var[vn] = '\0';
    const char *value = eq + 1;
    /* AGENTHOST_CONFIG names the file (read above); AGENTHOST_BIN is the clients' (the program they run). */
    if (strcmp(var, "AGENTHOST_CONFIG") == 0 || strcmp(var, "AGENTHOST_BIN") == 0)
      continue;
    const char *rest = var + 10;
    bool upper = rest[0] != '\0';
    for (const char *p = rest; *p; p++)
      upper &= (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_';
    if (upper && strncmp(rest, "HOST_", 5) == 0 && rest[5]) {
      char *key = env_to_key(rest + 5);
      if (!key)
        fail_nomem(L);
      else
        apply(L, SECTION_HOST, NULL, key, value, var);
      free(key);
    } else if (upper && strncmp(rest, "PLUGIN_", 7) == 0) {
      env_entry(L, SECTION_PLUGIN, var, rest + 7, value, known_plugins);
    } else if (upper && strncmp(rest, "PROVIDER_", 9) == 0) {
      env_entry(L, SECTION_PROVIDER, var, rest + 9, value, known_providers);
    } else {
      warn(L,
           "%s: not a configuration variable (expected AGENTHOST_HOST_<KEY>, "
           "AGENTHOST_PLUGIN_<NAME>_<KEY> or AGENTHOST_PROVIDER_<NAME>_<KEY>), ignored",
           esc(v, sizeof v, var));
    }
  }
  json_decref(known_plugins);
  json_decref(known_providers);
}

/* ---- the command line ------------------------------------------------------------------------------ */

static void load_cli(loader *L, const ah_cli_overrides *cli) {
  if (!cli)
    return;
  struct {
    const char *value;
    section_kind kind;
    const char *name;
    const char *key;
    const char *flag;
  } flags[] = {
      {cli->state_dir, SECTION_HOST, NULL, "state_dir", "--state-dir"},
      {cli->runtime_dir, SECTION_HOST, NULL, "runtime_dir", "--runtime-dir"},
      {cli->plugin_dir, SECTION_HOST, NULL, "plugin_dir", "--plugin-dir"},
      {cli->log_level, SECTION_HOST, NULL, "log_level", "--log-level"},
      {cli->listen, SECTION_PLUGIN, "browser", "listen", "--listen"},
      {cli->token_file, SECTION_PLUGIN, "browser", "token_file", "--token-file"},
  };
  for (size_t i = 0; i < sizeof flags / sizeof flags[0] && !L->rc; i++)
    if (flags[i].value)
      apply(L, flags[i].kind, flags[i].name, flags[i].key, flags[i].value, flags[i].flag);
}

/* ---- defaults -------------------------------------------------------------------------------------- */

static void load_defaults(loader *L) {
  ah_config *cfg = L->cfg;
  cfg->log_level = AH_LOG_INFO;
  cfg->default_provider = strdup("echo");
  cfg->synchronous = strdup("normal");
  cfg->default_mode = strdup("ask");
  L->default_provider_where = strdup("");
  cfg->plugins = json_object();
  cfg->providers = json_object();
  cfg->hooks = json_object();
  L->provider_where = json_object();
  L->hook_where = json_object();
  if (!cfg->default_provider || !cfg->synchronous || !cfg->default_mode || !L->default_provider_where ||
      !cfg->plugins || !cfg->providers || !L->provider_where || !cfg->hooks || !L->hook_where) {
    fail_nomem(L);
    return;
  }
  for (size_t i = 0; i < sizeof default_plugins / sizeof default_plugins[0]; i++) {
    json_t *p = plugin_entry(L, default_plugins[i]);
    if (!p || !obj_set_new(L, p, "enabled", json_true()))
      return;
  }
  /* The MCP client in every mode: an editor's mcpServers (acp) and [mcp.NAME] work without more config. */
  json_t *mcp = plugin_entry(L, "mcp");
  if (!mcp || !obj_set_new(L, mcp, "enabled", json_true()) ||
      !obj_set_new(L, mcp, "modes", json_pack("[s, s, s]", "serve", "sdk", "acp")))
    return;
  json_t *echo = provider_entry(L, "echo", "the default provider");
  if (echo)
    obj_set_new(L, echo, "type", json_string("echo"));
}

/* True when the running executable sits in the build tree's host directory. */
static bool running_from_build_tree(void) {
  if (!AH_BUILD_HOST_DIR[0] || !AH_BUILD_PLUGIN_DIR[0])
    return false;
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0)
    return false;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (!slash)
    return false;
  *slash = '\0';
  if (strcmp(exe, AH_BUILD_HOST_DIR) == 0)
    return true;
  char *real = realpath(AH_BUILD_HOST_DIR, NULL);
  bool same = real && strcmp(exe, real) == 0;
  free(real);
  return same;
}

static void finish(loader *L) {
  ah_config *cfg = L->cfg;
  if (!cfg->state_dir) {
    const char *xdg = env_abs(L->envp, "XDG_STATE_HOME");
    const char *home = env_abs(L->envp, "HOME");
    if (!xdg && !home) {
      fail(L, "cannot choose state_dir: neither XDG_STATE_HOME nor HOME is an absolute path "
              "(set [host] state_dir or --state-dir)");
      return;
    }
    cfg->state_dir = xdg ? path_join(xdg, "agenthost") : path_join(home, ".local/state/agenthost");
    if (!cfg->state_dir) {
      fail_nomem(L);
      return;
    }
  }
  if (!cfg->runtime_dir) {
    const char *xdg = env_abs(L->envp, "XDG_RUNTIME_DIR");
    cfg->runtime_dir = xdg ? path_join(xdg, "agenthost") : path_join(cfg->state_dir, "run");
    if (!cfg->runtime_dir) {
      fail_nomem(L);
      return;
    }
  }
  /* In the build tree each plugin lives in plugins/NAME/NAME.so (meson.build); installed, in one dir. */
  bool build_layout = false;
  if (!cfg->plugin_dir) {
    build_layout = running_from_build_tree();
    cfg->plugin_dir = strdup(build_layout ? AH_BUILD_PLUGIN_DIR : AH_INSTALL_PLUGIN_DIR);
    if (!cfg->plugin_dir) {
      fail_nomem(L);
      return;
    }
  }

  const char *name = NULL;
  json_t *p = NULL;
  json_object_foreach(cfg->plugins, name, p) {
    if (json_object_get(p, "path"))
      continue;
    char *file = NULL;
    int r = build_layout ? asprintf(&file, "%s/%s.so", name, name) : asprintf(&file, "%s.so", name);
    char *path = r < 0 ? NULL : path_join(cfg->plugin_dir, file);
    free(file);
    bool ok = path && obj_set_new(L, p, "path", json_string(path));
    free(path);
    if (!ok) {
      fail_nomem(L);
      return;
    }
  }

  json_object_foreach(cfg->providers, name, p) {
    if (json_object_get(p, "type"))
      continue;
    /* A provider named after a type needs no type line ([provider.acp] is an ACP agent). */
    bool named_type = false;
    for (size_t i = 0; i < sizeof provider_types / sizeof provider_types[0]; i++)
      named_type |= strcmp(name, provider_types[i]) == 0;
    if (!named_type) {
      fail(L, "%s: provider \"%s\" needs type = echo, acp or openai",
           json_string_value(json_object_get(L->provider_where, name)), name);
      return;
    }
    if (!obj_set_new(L, p, "type", json_string(name)))
      return;
  }

  json_t *hk = NULL;
  json_object_foreach(cfg->hooks, name, hk) {
    const char *where = json_string_value(json_object_get(L->hook_where, name));
    const char *ev = json_string_value(json_object_get(hk, "event"));
    if (!ev || !json_object_get(hk, "command")) {
      fail(L, "%s: a hook needs %s", where, ev ? "command" : "event");
      return;
    }
    bool guards = strcmp(ev, "before_tool") == 0 || strcmp(ev, "prompt_submit") == 0;
    if ((!json_object_get(hk, "timeout_ms") &&
         !obj_set_new(L, hk, "timeout_ms", json_integer(AH_HOOK_DEFAULT_TIMEOUT_MS))) ||
        (!json_object_get(hk, "on_error") &&
         !obj_set_new(L, hk, "on_error", json_string(guards ? "deny" : "allow"))) ||
        (!json_object_get(hk, "enabled") && !obj_set_new(L, hk, "enabled", json_true())))
      return;
  }

  if (!json_object_get(cfg->providers, cfg->default_provider))
    fail(L, "%s: no provider named \"%s\" is configured", L->default_provider_where, cfg->default_provider);
}

/* ---- public ---------------------------------------------------------------------------------------- */

int ah__config_load(ah_config *cfg, const ah_cli_overrides *cli, char *const *envp, char **err) {
  extern char **environ;
  if (err)
    *err = NULL;
  if (!cfg)
    return AH_EINVAL;
  memset(cfg, 0, sizeof *cfg);
  loader L = {.cfg = cfg, .envp = envp ? envp : environ, .warnings = json_array()};
  if (!L.warnings)
    fail_nomem(&L);

  if (!L.rc)
    load_defaults(&L);
  if (!L.rc)
    load_file(&L, cli);
  if (!L.rc)
    load_env(&L);
  if (!L.rc)
    load_cli(&L, cli);
  if (!L.rc)
    finish(&L);

  size_t i = 0;
  json_t *w = NULL;
  json_array_foreach(L.warnings, i, w) {
    if (!L.rc)
      AH_LOG_W(CONFIG_LOG, "%s", json_string_value(w));
  }
  json_decref(L.warnings);
  free(L.section);
  free(L.default_provider_where);
  json_decref(L.provider_where);
  json_decref(L.hook_where);
  if (L.rc) {
    ah__config_free(cfg);
    if (err)
      *err = L.err;
    else
      free(L.err);
    return L.rc;
  }
  return 0;
}

void ah__config_free(ah_config *cfg) {
  if (!cfg)
    return;
  free(cfg->file);
  free(cfg->state_dir);
  free(cfg->runtime_dir);
  free(cfg->plugin_dir);
  free(cfg->default_provider);
  free(cfg->synchronous);
  free(cfg->default_mode);
  free(cfg->prices);
  free(cfg->record_dir);
  free(cfg->store_url);
  free(cfg->store_password_file);
  if (cfg->store_password)
    explicit_bzero(cfg->store_password, strlen(cfg->store_password));
  free(cfg->store_password);
  json_decref(cfg->record_surfaces);
  json_decref(cfg->plugins);
  json_decref(cfg->providers);
  json_decref(cfg->hooks);
  memset(cfg, 0, sizeof *cfg);
}

json_t *ah__config_plugins_for_mode(const ah_config *cfg, const char *mode) {
  json_t *out = json_array();
  if (!out || !cfg || !cfg->plugins || !mode)
    return out;
  const char *name = NULL;
  json_t *p = NULL;
  json_object_foreach(cfg->plugins, name, p) {
    if (!json_is_true(json_object_get(p, "enabled")))
      continue;
    size_t i = 0;
    json_t *m = NULL;
    bool in_mode = false;
    json_array_foreach(json_object_get(p, "modes"), i, m) {
      in_mode |= json_is_string(m) && strcmp(json_string_value(m), mode) == 0;
    }
    if (in_mode && json_array_append_new(out, json_string(name)) != 0) {
      json_decref(out);
      return NULL;
    }
  }
  /* A configured provider of a type other than echo is served by the plugin of that name (type acp →
   * plugin acp), wanted in every mode so that the sessions of every surface can use it. */
  json_object_foreach(cfg->providers, name, p) {
    const char *type = json_string_value(json_object_get(p, "type"));
    bool listed = false;
    size_t i = 0;
    json_t *n = NULL;
    json_array_foreach(out, i, n) {
      listed |= type && strcmp(json_string_value(n), type) == 0;
    }
    if (!type || strcmp(type, "echo") == 0 || listed)
      continue;
    if (json_array_append_new(out, json_string(type)) != 0) {
      json_decref(out);
      return NULL;
    }
  }
  return out;
}

void ah__config_token_path(const ah_config *cfg, char *path, size_t cap) {
  const char *tf = json_string_value(json_object_get(json_object_get(cfg->plugins, "browser"), "token_file"));
  if (tf && *tf)
    snprintf(path, cap, "%s", tf);
  else
    snprintf(path, cap, "%s/token", cfg->state_dir ? cfg->state_dir : "");
}

char *ah__config_module_path(const ah_config *cfg, const char *name, const json_t *pc) {
  const char *p = json_string_value(json_object_get(pc, "path"));
  if (p)
    return strdup(p);
  char *path = NULL;
  const char *dir = cfg && cfg->plugin_dir ? cfg->plugin_dir : ".";
  /* Installed modules sit in plugin_dir/NAME.so; a build tree has plugin_dir/NAME/NAME.so. */
  if (asprintf(&path, "%s/%s.so", dir, name) < 0)
    return NULL;
  if (access(path, F_OK) != 0) {
    free(path);
    if (asprintf(&path, "%s/%s/%s.so", dir, name, name) < 0)
      return NULL;
  }
  return path;
}

int ah__config_store(const ah_config *cfg, struct ah_store_opts *opts,
                     const struct ah_store_backend **backend, char *path_buf, size_t path_cap,
                     char **password, char **why) {
  *password = NULL;
  *backend = &ah__store_sqlite;
  if (!cfg->store_url) {
    if (snprintf(path_buf, path_cap, "%s/agenthost.db", cfg->state_dir) >= (int)path_cap) {
      if (why && asprintf(why, "the state directory's path is too long") < 0)
        *why = NULL;
      return AH_ECONFIG;
    }
    opts->path = path_buf;
    return 0;
  }
#ifndef AH_HAVE_POSTGRESQL
  if (why && asprintf(why, "[host] store_url is set, but this agenthost was built without the PostgreSQL "
                           "backend (libpq)") < 0)
    *why = NULL;
  return AH_ECONFIG;
#else
  *backend = &ah__store_pg;
  opts->url = cfg->store_url;
  opts->path = NULL;
  if (cfg->store_password) {
    *password = strdup(cfg->store_password);
  } else if (cfg->store_password_file) {
    size_t len = 0;
    char *text = NULL;
    FILE *f = fopen(cfg->store_password_file, "re");
    const char *err = f ? NULL : strerror(errno);
    int rc = f ? ah__read_all(f, 4096, &text, &len) : AH_EIO;
    if (f)
      fclose(f);
    if (rc != 0 || !text) {
      if (why && asprintf(why, "[host] store_password_file %s cannot be read: %s", cfg->store_password_file,
                          err ? err : ah_strerror(rc)) < 0)
        *why = NULL;
      free(text);
      return AH_ECONFIG;
    }
    text[strcspn(text, "\r\n")] = '\0';
    *password = text;
  }
  opts->password = *password;
  return 0;
#endif
}
