/* The Chat Completions wire (chat.h). */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int oa_buf_add(oa_buf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t c = b->cap ? b->cap : 64;
    while (c < b->len + n + 1)
      c *= 2;
    char *p = realloc(b->p, c);
    if (!p)
      return -1;
    b->p = p;
    b->cap = c;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
  return 0;
}

void oa_buf_free(oa_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

void oa_round_reset(oa_round *r) {
  oa_buf_free(&r->text);
  oa_buf_free(&r->reasoning);
  for (int i = 0; i < r->ncalls; i++) {
    oa_buf_free(&r->calls[i].id);
    oa_buf_free(&r->calls[i].name);
    oa_buf_free(&r->calls[i].args);
  }
  json_decref(r->usage);
  memset(r, 0, sizeof *r);
}

static const char *jstr(const json_t *o, const char *k) {
  return json_string_value(json_object_get(o, k));
}

static int add_str(oa_buf *b, const char *s) {
  return s ? oa_buf_add(b, s, strlen(s)) : 0;
}

int oa_round_chunk(oa_round *r, const json_t *chunk, const char **text, const char **reasoning, char *err,
                   size_t cap) {
  *text = NULL;
  *reasoning = NULL;
  if (!json_is_object(chunk)) {
    snprintf(err, cap, "a stream event is not a JSON object");
    return -1;
  }
  const json_t *e = json_object_get(chunk, "error");
  if (e) {
    const char *m = json_is_object(e) ? jstr(e, "message") : json_string_value(e);
    snprintf(err, cap, "the provider reported an error in the stream: %.300s", m ? m : "(no message)");
    return -1;
  }
  const char *model = jstr(chunk, "model");
  if (model && *model)
    snprintf(r->model, sizeof r->model, "%s", model);
  const json_t *usage = json_object_get(chunk, "usage");
  if (json_is_object(usage)) {
    json_decref(r->usage);
    r->usage = json_deep_copy(usage);
  }
  const json_t *choices = json_object_get(chunk, "choices");
  const json_t *c = json_array_get(choices, 0); /* n = 1: one choice */
  if (!c)
    return 0;
  const json_t *delta = json_object_get(c, "delta");
  if (!json_is_object(delta))
    delta = json_object_get(c, "message"); /* a server that sends whole messages */
  const char *t = jstr(delta, "content");
  if (t && *t) {
    if (add_str(&r->text, t) != 0)
      goto oom;
    *text = t;
    r->output = true;
  }
  const char *rs = jstr(delta, "reasoning_content");
  if (!rs)
    rs = jstr(delta, "reasoning");
  if (rs && *rs) {
    if (add_str(&r->reasoning, rs) != 0)
      goto oom;
    *reasoning = rs;
    r->output = true;
  }
  const json_t *calls = json_object_get(delta, "tool_calls");
  size_t i = 0;
  const json_t *tc = NULL;
  json_array_foreach(calls, i, tc) {
    const json_t *ix = json_object_get(tc, "index");
    json_int_t index = json_is_integer(ix) ? json_integer_value(ix) : (json_int_t)i;
    if (index < 0 || index >= OA_MAX_CALLS) {
      snprintf(err, cap, "a tool call index is out of range (%lld)", (long long)index);
      return -1;
    }
    if (index >= r->ncalls)
      r->ncalls = (int)index + 1;
    oa_call *call = &r->calls[index];
    const json_t *fn = json_object_get(tc, "function");
    /* id and name arrive first (some servers repeat them): keep the first; arguments come in pieces. */
    if (call->id.len == 0 && add_str(&call->id, jstr(tc, "id")) != 0)
      goto oom;
    if (call->name.len == 0 && add_str(&call->name, jstr(fn, "name")) != 0)
      goto oom;
    const json_t *args = json_object_get(fn, "arguments");
    if (json_is_string(args)) {
      if (oa_buf_add(&call->args, json_string_value(args), json_string_length(args)) != 0)
        goto oom;
    } else if (json_is_object(args)) { /* a server that sends the arguments parsed */
      char *s = json_dumps(args, JSON_COMPACT);
      int rc = s ? add_str(&call->args, s) : -1;
      free(s);
      if (rc)
        goto oom;
    }
    r->output = true;
  }
  const char *fin = jstr(c, "finish_reason");
  if (fin && *fin)
    snprintf(r->finish, sizeof r->finish, "%s", fin);
  return 0;
oom:
  snprintf(err, cap, "out of memory");
  return -1;
}

char *oa_content_text(const json_t *content) {
  oa_buf b = {0};
  size_t i = 0;
  const json_t *blk = NULL;
  json_array_foreach(content, i, blk) {
    const char *type = jstr(blk, "type");
    const char *piece = NULL;
    char *own = NULL;
    if (type && strcmp(type, "text") == 0) {
      piece = jstr(blk, "text");
    } else if (type && strcmp(type, "resource_link") == 0) {
      if (asprintf(&own, "[%s](%s)", jstr(blk, "name") ? jstr(blk, "name") : "resource",
                   jstr(blk, "uri") ? jstr(blk, "uri") : "") < 0)
        own = NULL;
      piece = own;
    }
    if (piece) {
      if (b.len)
        oa_buf_add(&b, "\n\n", 2);
      add_str(&b, piece);
    }
    free(own);
  }
  if (!b.p)
    return strdup("");
  return b.p;
}

static json_t *args_text(const json_t *args) {
  if (json_is_string(args))
    return json_incref((json_t *)args);
  char *s = json_dumps(args ? args : json_null(), JSON_COMPACT | JSON_ENCODE_ANY);
  json_t *v = json_string(s ? s : "{}");
  free(s);
  return v;
}

static json_t *result_text(const json_t *result) {
  if (json_is_string(result))
    return json_incref((json_t *)result);
  char *s = json_dumps(result ? result : json_null(), JSON_COMPACT | JSON_ENCODE_ANY);
  json_t *v = json_string(s ? s : "null");
  free(s);
  return v;
}

json_t *oa_messages(const char *system_prompt, const json_t *history, const json_t *content) {
  json_t *msgs = json_array();
  if (system_prompt && *system_prompt)
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system_prompt));
  /* Tool calls whose result is in the history: only those are sent (a call without its result makes
   * the request invalid). */
  json_t *answered = json_object();
  size_t i = 0;
  const json_t *h = NULL;
  json_array_foreach(history, i, h) {
    if (jstr(h, "role") && strcmp(jstr(h, "role"), "tool_result") == 0 && jstr(h, "callId"))
      json_object_set_new(answered, jstr(h, "callId"), json_true());
  }
  json_t *sent = json_object();  /* calls sent so far */
  json_t *last_assistant = NULL; /* borrowed: the message tool calls attach to */
  json_array_foreach(history, i, h) {
    const char *role = jstr(h, "role");
    if (!role)
      continue;
    if (strcmp(role, "user") == 0) {
      char *text = oa_content_text(json_object_get(h, "content"));
      json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", text));
      free(text);
      last_assistant = NULL;
    } else if (strcmp(role, "assistant") == 0) {
      json_t *m =
          json_pack("{s:s, s:s}", "role", "assistant", "content", jstr(h, "text") ? jstr(h, "text") : "");
      json_array_append_new(msgs, m);
      last_assistant = m;
    } else if (strcmp(role, "tool_call") == 0) {
      const char *id = jstr(h, "callId");
      if (!id || !json_object_get(answered, id))
        continue;
      if (!last_assistant || !json_object_get(last_assistant, "tool_calls")) {
        if (!last_assistant) {
          last_assistant = json_pack("{s:s, s:n}", "role", "assistant", "content");
          json_array_append_new(msgs, last_assistant);
        }
        json_object_set_new(last_assistant, "tool_calls", json_array());
      }
      json_object_set_new(sent, id, json_true());
      json_array_append_new(json_object_get(last_assistant, "tool_calls"),
                            json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id, "type", "function", "function",
                                      "name", jstr(h, "name") ? jstr(h, "name") : "", "arguments",
                                      args_text(json_object_get(h, "args"))));
    } else if (strcmp(role, "tool_result") == 0) {
      if (!jstr(h, "callId") || !json_is_true(json_object_get(answered, jstr(h, "callId"))) ||
          !json_object_get(sent, jstr(h, "callId")))
        continue; /* a result whose call is not in the history (cut off): it would be invalid alone */
      json_array_append_new(msgs, json_pack("{s:s, s:s, s:o}", "role", "tool", "tool_call_id",
                                            jstr(h, "callId") ? jstr(h, "callId") : "", "content",
                                            result_text(json_object_get(h, "result"))));
      /* after a result, text that follows is a new assistant message */
      last_assistant = NULL;
    }
  }
  json_decref(answered);
  json_decref(sent);
  char *text = oa_content_text(content);
  json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", text));
  free(text);
  return msgs;
}

json_t *oa_assistant_message(const oa_round *r) {
  json_t *m = json_pack("{s:s}", "role", "assistant");
  if (r->text.len)
    json_object_set_new(m, "content", json_stringn(r->text.p, r->text.len));
  else
    json_object_set_new(m, "content", json_null());
  if (r->reasoning.len)
    json_object_set_new(m, "reasoning_content", json_stringn(r->reasoning.p, r->reasoning.len));
  if (r->ncalls) {
    json_t *calls = json_array();
    for (int i = 0; i < r->ncalls; i++) {
      const oa_call *c = &r->calls[i];
      json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", c->id.p ? c->id.p : "", "type",
                                             "function", "function", "name", c->name.p ? c->name.p : "",
                                             "arguments", c->args.p ? c->args.p : "{}"));
    }
    json_object_set_new(m, "tool_calls", calls);
  }
  return m;
}

json_t *oa_tools(const json_t *tools) {
  json_t *out = json_array();
  size_t i = 0;
  const json_t *t = NULL;
  json_array_foreach(tools, i, t) {
    json_t *props = json_object();
    json_t *required = json_array();
    const char *k = NULL;
    const json_t *p = NULL;
    json_object_foreach((json_t *)json_object_get(t, "params"), k, p) {
      json_object_set_new(props, k,
                          json_pack("{s:s, s:s}", "type", jstr(p, "type") ? jstr(p, "type") : "string",
                                    "description", jstr(p, "description") ? jstr(p, "description") : ""));
      if (json_is_true(json_object_get(p, "required")))
        json_array_append_new(required, json_string(k));
    }
    json_t *schema = json_object_get(t, "schema"); /* a tool that has a JSON Schema of its own */
    json_t *params = json_is_object(schema) ? json_incref(schema)
                                            : json_pack("{s:s, s:o, s:o}", "type", "object", "properties",
                                                        props, "required", required);
    if (json_is_object(schema)) {
      json_decref(props);
      json_decref(required);
    }
    json_array_append_new(out, json_pack("{s:s, s:{s:s, s:s, s:o}}", "type", "function", "function", "name",
                                         jstr(t, "name") ? jstr(t, "name") : "", "description",
                                         jstr(t, "description") ? jstr(t, "description") : "", "parameters",
                                         params));
  }
  return out;
}

int64_t oa_estimate_tokens(const json_t *v) {
  char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  int64_t n = s ? (int64_t)strlen(s) / 4 + 1 : 0;
  free(s);
  return n;
}

int oa_fit(json_t *messages, const json_t *tools, int64_t budget) {
  int dropped = 0;
  size_t first = 0;
  const char *r0 = jstr(json_array_get(messages, 0), "role");
  if (r0 && strcmp(r0, "system") == 0)
    first = 1;
  int64_t tools_cost = tools ? oa_estimate_tokens(tools) : 0;
  for (;;) {
    if (oa_estimate_tokens(messages) + tools_cost <= budget)
      break;
    /* the last user message: never dropped, nor anything after it */
    size_t last_user = json_array_size(messages);
    for (size_t i = json_array_size(messages); i-- > first;) {
      const char *r = jstr(json_array_get(messages, i), "role");
      if (r && strcmp(r, "user") == 0) {
        last_user = i;
        break;
      }
    }
    if (last_user <= first)
      break;
    /* one exchange: the message at `first` and everything up to the next user message */
    size_t end = first + 1;
    while (end < last_user) {
      const char *r = jstr(json_array_get(messages, end), "role");
      if (r && strcmp(r, "user") == 0)
        break;
      end++;
    }
    for (size_t k = first; k < end; k++) {
      json_array_remove(messages, first);
      dropped++;
    }
  }
  return dropped;
}
