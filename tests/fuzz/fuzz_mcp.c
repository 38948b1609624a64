/* The mcp plugin's mappings (plugins/mcp/map.c): an MCP server's configuration as an editor sends it in
 * mcpServers (or [mcp.NAME] gives it) — normalised or refused with a reason, never both — a tools/call
 * result into the text the model reads, and tool names: always mcp__…, at most 64 bytes of
 * [A-Za-z0-9_-]. The input is one JSON value, used for all three. */
#include "../../plugins/mcp/mcp.h"
#include "fuzz_support.h"

static void check_name(const char *n) {
  FUZZ_CHECK(strncmp(n, MCP_PREFIX, strlen(MCP_PREFIX)) == 0 && strlen(n) <= MCP_NAME_MAX);
  for (const char *p = n; *p; p++)
    FUZZ_CHECK((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
               *p == '-' || *p == '_');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  json_error_t e;
  json_t *v = json_loadb((const char *)data, size, JSON_DECODE_ANY, &e);
  if (!v)
    return 0;
  bool skip = false;
  char *why = NULL;
  json_t *conf = mcp_normalize(v, &skip, &why);
  FUZZ_CHECK(!(conf && why));
  if (!conf && !skip)
    FUZZ_CHECK(why && why[0]);
  if (conf)
    FUZZ_CHECK(json_is_object(conf));
  json_decref(conf);
  free(why);

  bool is_error = false;
  char *text = NULL;
  json_t *out = mcp_map_result(v, &is_error, &text);
  FUZZ_CHECK(out && text && json_is_string(json_object_get(out, "content")));
  FUZZ_CHECK(strcmp(json_string_value(json_object_get(out, "content")), text) == 0);
  json_decref(out);
  free(text);

  const char *server = json_string_value(json_object_get(v, "name"));
  const char *tool = json_string_value(json_object_get(v, "tool"));
  char full[MCP_NAME_MAX + 1];
  mcp_full_name(server ? server : "s", tool ? tool : (json_is_string(v) ? json_string_value(v) : "t"), full);
  check_name(full);
  json_decref(v);
  return 0;
}
