/* The mcp plugin's pure mappings (plugins/mcp/map.c): a server's configuration as an editor or
 * [mcp.NAME] gives it, a tools/call result as the model reads it, tool names. The first test is the
 * fuzzing finding of its name (tests/fuzz/corpus/mcp holds the input too). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "mcp.h"

static json_t *parse(const char *text) {
  json_error_t e;
  json_t *v = json_loads(text, 0, &e);
  cr_assert_not_null(v, "%s", e.text);
  return v;
}

/* fuzz_mcp: args refused, then a bad env replaced the reason and leaked it (LeakSanitizer in the ASan run).
 */
Test(mcp_map, finding_bad_args_then_bad_env_leaked_the_reason) {
  json_t *raw = parse("{\"command\":\"npx\",\"args\":\"[DONE]x\",\"env\":\"A=1 ,B\"}");
  bool skip = true;
  char *why = NULL;
  cr_assert_null(mcp_normalize(raw, &skip, &why));
  cr_expect_not(skip);
  cr_assert_not_null(why);
  cr_expect_str_eq(why, "args: not a JSON array of strings", "the first reason is kept");
  free(why);
  json_decref(raw);
}

Test(mcp_map, an_editors_stdio_server_is_normalised) {
  json_t *raw = parse("{\"name\":\"fs\",\"command\":\"/usr/bin/mcp-fs\",\"args\":[\"/home/me/p\"],"
                      "\"env\":[{\"name\":\"K\",\"value\":\"v\"}]}");
  bool skip = true;
  char *why = NULL;
  json_t *c = mcp_normalize(raw, &skip, &why);
  cr_assert_not_null(c, "%s", why ? why : "");
  cr_expect_null(why);
  cr_expect_str_eq(json_string_value(json_object_get(c, "command")), "/usr/bin/mcp-fs");
  cr_expect_str_eq(json_string_value(json_array_get(json_object_get(c, "args"), 0)), "/home/me/p");
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(c, "env"), "K")), "v");
  json_decref(c);
  json_decref(raw);
}

Test(mcp_map, a_result_becomes_text_and_names_stay_in_bounds) {
  json_t *r = parse("{\"content\":[{\"type\":\"text\",\"text\":\"hi\"},{\"type\":\"image\",\"data\":\"AAAA\","
                    "\"mimeType\":\"image/png\"}],\"isError\":true}");
  bool is_error = false;
  char *text = NULL;
  json_t *out = mcp_map_result(r, &is_error, &text);
  cr_assert_not_null(out);
  cr_expect(is_error);
  cr_expect_str_eq(text, "hi\n[image: image/png, 3 bytes, not shown]");
  json_decref(out);
  free(text);
  json_decref(r);
  char full[MCP_NAME_MAX + 1];
  mcp_full_name("my server", "a/very/long/tool/name/that/goes/on/and/on/and/on/beyond/sixty/four/bytes",
                full);
  cr_expect_leq(strlen(full), MCP_NAME_MAX);
  cr_expect_eq(strncmp(full, "mcp__my_server__a_very", 22), 0, "%s", full);
}
