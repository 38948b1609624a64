/* agenthost mcp plugin — its pure mappings (no host, no loop; fuzzed by tests/fuzz/fuzz_mcp.c): tool names,
 * a server's configuration from [mcp.NAME] or an editor's mcpServers, a tools/call result as the model reads
 * it, and the formatting they share. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envname.h"
#include "mcp.h"

/* ---- formatting --------------------------------------------------------------------------------------- */

char *mcp_fmt(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0)
    s = NULL;
  va_end(ap);
  return s;
}

/* ---- names -------------------------------------------------------------------------------------------- */

static void sanitize(const char *in, char *out, size_t cap) {
  size_t k = 0;
  for (const char *p = in; *p && k + 1 < cap; p++) {
    char c = *p;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    out[k++] = ok ? c : '_';
  }
  out[k] = '\0';
}

/* mcp__SERVER__TOOL, at most MCP_NAME_MAX bytes. */
void mcp_full_name(const char *server, const char *tool, char out[MCP_NAME_MAX + 1]) {
  char s[256], t[256], whole[600];
  sanitize(server, s, sizeof s);
  sanitize(tool, t, sizeof t);
  snprintf(whole, sizeof whole, MCP_PREFIX "%s__%s", s, t);
  if (strlen(whole) <= MCP_NAME_MAX) {
    memcpy(out, whole, strlen(whole) + 1);
    return;
  }
  uint32_t h = 2166136261u; /* FNV-1a of the untruncated name */
  for (const char *p = whole; *p; p++)
    h = (h ^ (uint8_t)*p) * 16777619u;
  snprintf(out, MCP_NAME_MAX + 1, "%.*s_%08x", MCP_NAME_MAX - 9, whole, h);
}

/* ---- server configurations ----------------------------------------------------------------------------- */

/* A list given as a JSON array of strings or a comma-separated string. New reference or NULL with *why. */
static json_t *str_list(const json_t *v, const char *what, char **why) {
  if (json_is_array(v)) {
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
      if (!json_is_string(x)) {
        *why = mcp_fmt("%s: only strings", what);
        return NULL;
      }
    }
    return json_incref((json_t *)v);
  }
  if (!json_is_string(v)) {
    *why = mcp_fmt("%s: a list of strings", what);
    return NULL;
  }
  json_t *out = json_array();
  char *copy = strdup(json_string_value(v));
  char *save = NULL;
  for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ' || *tok == '\t')
      tok++;
    size_t n = strlen(tok);
    while (n && (tok[n - 1] == ' ' || tok[n - 1] == '\t'))
      tok[--n] = '\0';
    if (n)
      json_array_append_new(out, json_string(tok));
  }
  free(copy);
  return out;
}

/* {NAME: value} from an object, an ACP list [{name, value}] or a comma list of `NAME<sep>value`. */
static json_t *str_map(const json_t *v, char sep, const char *what, char **why) {
  json_t *out = json_object();
  if (json_is_object(v)) {
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
      if (!json_is_string(x)) {
        *why = mcp_fmt("%s: %s: a string", what, k);
        json_decref(out);
        return NULL;
      }
      json_object_set(out, k, x);
    }
    return out;
  }
  if (json_is_array(v)) {
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
      const char *n = json_string_value(json_object_get(x, "name"));
      const char *val = json_string_value(json_object_get(x, "value"));
      if (!n || !*n || !val) {
        *why = mcp_fmt("%s: entries are {name, value} strings", what);
        json_decref(out);
        return NULL;
      }
      json_object_set_new(out, n, json_string(val));
    }
    return out;
  }
  json_t *items = str_list(v, what, why);
  if (!items) {
    json_decref(out);
    return NULL;
  }
  size_t i;
  json_t *x;
  json_array_foreach(items, i, x) {
    const char *s = json_string_value(x);
    const char *p = strchr(s, sep);
    if (!p || p == s) {
      *why = mcp_fmt("%s: \"%.60s\" is not NAME%cvalue", what, s, sep);
      json_decref(items);
      json_decref(out);
      return NULL;
    }
    char *key = strndup(s, (size_t)(p - s));
    const char *val = p + 1;
    while (*val == ' ')
      val++;
    json_object_set_new(out, key, json_string(val));
    free(key);
  }
  json_decref(items);
  return out;
}

static bool get_ms(const json_t *raw, const char *key, json_int_t *out, char **why) {
  json_t *v = json_object_get(raw, key);
  if (!v)
    return true;
  json_int_t n = json_is_integer(v)  ? json_integer_value(v)
                 : json_is_string(v) ? atoll(json_string_value(v))
                                     : 0;
  if (n < 1 || n > 3600000) {
    *why = mcp_fmt("%s: a number of milliseconds, 1 to 3600000", key);
    return false;
  }
  *out = n;
  return true;
}

/* The normalised configuration of one server, from [mcp.NAME] (strings) or an attached server (ACP's
 * shape). NULL with *why; *skip when it is disabled. */
json_t *mcp_normalize(const json_t *raw, bool *skip, char **why) {
  *skip = false;
  json_t *en = json_object_get(raw, "enabled");
  if (json_is_false(en) ||
      (json_is_string(en) &&
       (strcmp(json_string_value(en), "false") == 0 || strcmp(json_string_value(en), "no") == 0 ||
        strcmp(json_string_value(en), "off") == 0 || strcmp(json_string_value(en), "0") == 0))) {
    *skip = true;
    return NULL;
  }
  const char *type = json_string_value(json_object_get(raw, "type"));
  const char *command = json_string_value(json_object_get(raw, "command"));
  const char *url = json_string_value(json_object_get(raw, "url"));
  if (type && strcmp(type, "sse") == 0) {
    *why = mcp_fmt("the HTTP+SSE transport of protocol 2024-11-05 is not supported (use Streamable HTTP)");
    return NULL;
  }
  if (type && strcmp(type, "http") != 0 && strcmp(type, "stdio") != 0) {
    *why = mcp_fmt("unknown transport type \"%.40s\"", type);
    return NULL;
  }
  if (!!command == !!url) {
    *why = mcp_fmt("exactly one of command (a child on stdio) and url (Streamable HTTP) is required");
    return NULL;
  }
  json_t *out = json_object();
  json_int_t st = MCP_DEFAULT_STARTUP_MS, tt = MCP_DEFAULT_TOOL_MS;
  if (!get_ms(raw, "startup_timeout_ms", &st, why) || !get_ms(raw, "tool_timeout_ms", &tt, why)) {
    json_decref(out);
    return NULL;
  }
  json_object_set_new(out, "startup_timeout_ms", json_integer(st));
  json_object_set_new(out, "tool_timeout_ms", json_integer(tt));
  const char *lists[] = {"enabled_tools", "disabled_tools"};
  for (int i = 0; i < 2; i++) {
    json_t *v = json_object_get(raw, lists[i]);
    if (!v)
      continue;
    json_t *l = str_list(v, lists[i], why);
    if (!l) {
      json_decref(out);
      return NULL;
    }
    json_object_set_new(out, lists[i], l);
  }
  if (command) {
    if (!*command) {
      *why = mcp_fmt("command: empty");
      json_decref(out);
      return NULL;
    }
    json_object_set_new(out, "command", json_string(command));
    json_t *args = json_object_get(raw, "args");
    json_t *a = NULL;
    if (!args) {
      a = json_array();
    } else if (json_is_string(args) && json_string_value(args)[0] == '[') {
      json_t *parsed = json_loads(json_string_value(args), 0, NULL);
      a = parsed ? str_list(parsed, "args", why) : NULL;
      json_decref(parsed);
      if (!parsed && !*why)
        *why = mcp_fmt("args: not a JSON array of strings");
    } else if (json_is_string(args)) { /* words separated by blanks */
      a = json_array();
      char *copy = strdup(json_string_value(args));
      char *save = NULL;
      for (char *w = copy ? strtok_r(copy, " \t", &save) : NULL; w; w = strtok_r(NULL, " \t", &save))
        json_array_append_new(a, json_string(w));
      free(copy);
    } else {
      a = str_list(args, "args", why);
    }
    /* Not read after a refused args: its reason would replace (and leak) the first one (fuzz_mcp). */
    json_t *env = !a                            ? NULL
                  : json_object_get(raw, "env") ? str_map(json_object_get(raw, "env"), '=', "env", why)
                                                : json_object();
    if (!a || !env) {
      json_decref(a);
      json_decref(env);
      json_decref(out);
      return NULL;
    }
    const char *k;
    json_t *x;
    json_object_foreach(env, k, x) {
      if (!env_name_valid(k, strlen(k))) {
        *why = mcp_fmt("env: \"%.60s\" is not a variable name", k);
        json_decref(a);
        json_decref(env);
        json_decref(out);
        return NULL;
      }
    }
    json_object_set_new(out, "args", a);
    json_object_set_new(out, "env", env);
    json_t *cwd = json_object_get(raw, "cwd");
    if (cwd) {
      if (!json_is_string(cwd) || json_string_value(cwd)[0] != '/') {
        *why = mcp_fmt("cwd: an absolute path");
        json_decref(out);
        return NULL;
      }
      json_object_set(out, "cwd", cwd);
    }
  } else {
    if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) {
      *why = mcp_fmt("url: http:// or https://");
      json_decref(out);
      return NULL;
    }
    json_object_set_new(out, "url", json_string(url));
    json_t *h = json_object_get(raw, "headers")
                    ? str_map(json_object_get(raw, "headers"), ':', "headers", why)
                    : json_object();
    if (!h) {
      json_decref(out);
      return NULL;
    }
    json_object_set_new(out, "headers", h);
    json_t *bt = json_object_get(raw, "bearer_token_env");
    if (bt) {
      if (!json_is_string(bt) || !env_name_valid(json_string_value(bt), json_string_length(bt))) {
        *why = mcp_fmt("bearer_token_env: a variable name");
        json_decref(out);
        return NULL;
      }
      json_object_set(out, "bearer_token_env", bt);
    }
  }
  return out;
}

/* ---- tool results -------------------------------------------------------------------------------------- */

/* The result as the model reads it: {content: text, structuredContent?}; *is_error from isError. */
json_t *mcp_map_result(const json_t *result, bool *is_error, char **text_out) {
  *is_error = json_is_true(json_object_get(result, "isError"));
  size_t cap = 256, len = 0;
  char *text = malloc(cap);
  if (!text)
    return NULL;
  text[0] = '\0';
  size_t i;
  json_t *c;
  json_array_foreach(json_object_get(result, "content"), i, c) {
    const char *type = json_string_value(json_object_get(c, "type"));
    char *piece = NULL;
    if (!type) {
      continue;
    } else if (strcmp(type, "text") == 0) {
      piece = mcp_fmt("%s", json_string_value(json_object_get(c, "text"))
                                ? json_string_value(json_object_get(c, "text"))
                                : "");
    } else if (strcmp(type, "image") == 0 || strcmp(type, "audio") == 0) {
      const char *mime = json_string_value(json_object_get(c, "mimeType"));
      size_t b64 = json_string_length(json_object_get(c, "data"));
      piece = mcp_fmt("[%s: %s, %zu bytes, not shown]", type, mime ? mime : "unknown type", b64 / 4 * 3);
    } else if (strcmp(type, "resource_link") == 0) {
      const char *uri = json_string_value(json_object_get(c, "uri"));
      const char *name = json_string_value(json_object_get(c, "name"));
      piece = mcp_fmt("[resource link: %s%s%s]", uri ? uri : "?", name ? " " : "", name ? name : "");
    } else if (strcmp(type, "resource") == 0) {
      json_t *res = json_object_get(c, "resource");
      const char *uri = json_string_value(json_object_get(res, "uri"));
      const char *rtext = json_string_value(json_object_get(res, "text"));
      if (rtext)
        piece = mcp_fmt("[resource %s]\n%s", uri ? uri : "?", rtext);
      else
        piece = mcp_fmt("[resource %s: %zu bytes of binary data, not shown]", uri ? uri : "?",
                        json_string_length(json_object_get(res, "blob")) / 4 * 3);
    } else {
      piece = mcp_fmt("[%s content, not shown]", type);
    }
    if (!piece)
      continue;
    size_t n = strlen(piece);
    if (len + n + 2 > cap) {
      while (len + n + 2 > cap)
        cap *= 2;
      char *bigger = realloc(text, cap);
      if (!bigger) {
        free(piece);
        break;
      }
      text = bigger;
    }
    if (len)
      text[len++] = '\n';
    memcpy(text + len, piece, n + 1);
    len += n;
    free(piece);
  }
  json_t *out = json_pack("{s:s}", "content", text);
  json_t *sc = json_object_get(result, "structuredContent");
  if (sc)
    json_object_set(out, "structuredContent", sc);
  *text_out = text;
  return out;
}
