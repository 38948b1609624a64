/* ACP-CODEC: the ACP codec (plugins/acp/codec.c): an editor's prompt blocks into the host's content, and the
 * host's stored events into session/update notifications — for any JSON value, with a running tool-call state
 * across the events of one input (one event per line). Every output is an array of objects. */
#include "../../plugins/acp/agent.h"
#include "fuzz_support.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  json_error_t e;
  /* Whole input as an editor's prompt (an array of content blocks). */
  json_t *prompt = json_loadb((const char *)data, size, JSON_DECODE_ANY, &e);
  if (prompt) {
    char why[256];
    json_t *content = acp_codec_prompt(prompt, why, sizeof why);
    if (content)
      FUZZ_CHECK(json_is_array(content));
    else
      FUZZ_CHECK(memchr(why, '\0', sizeof why) && why[0]);
    json_decref(content);
    size_t i = 0;
    json_t *b = NULL;
    if (json_is_array(prompt))
      json_array_foreach(prompt, i, b) json_decref(acp_codec_block_out(b));
    json_decref(prompt);
  }
  /* Line by line as stored events, replayed and live. */
  acp_codec_state st;
  memset(&st, 0, sizeof st);
  acp_codec_state_cwd(&st, "/home/me/project");
  json_t *out = json_array();
  const char *p = (const char *)data, *end = p + size;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
    json_t *ev = json_loadb(p, len, 0, &e);
    if (ev) {
      acp_codec_event(ev, len % 2, len % 3 == 0, &st, out);
      json_t *args = json_object_get(json_object_get(ev, "data"), "args");
      const char *tool = json_string_value(json_object_get(json_object_get(ev, "data"), "name"));
      char *title = acp_codec_tool_title(tool ? tool : "run_command", args);
      FUZZ_CHECK(title == NULL || strlen(title) < 1 << 16);
      free(title);
      (void)acp_codec_tool_kind(tool ? tool : "", json_string_value(json_object_get(ev, "kind")));
      json_decref(ev);
    }
    p += len + 1;
  }
  size_t i = 0;
  json_t *u = NULL;
  json_array_foreach(out, i, u) FUZZ_CHECK(json_is_object(u));
  json_decref(out);
  acp_codec_state_clear(&st);
  return 0;
}
