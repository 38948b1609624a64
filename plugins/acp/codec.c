/* agenthost — ACP v1 codec: pure conversions between ACP messages and the core's content blocks and stored
 * events (PROTOCOLS.md ACP-CODEC, ACP-OUTPUT-PERMISSION). No state beyond the caller's acp_codec_state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"

#define TITLE_MAX 200
#define ACP_MAX_BLOCKS 1000 /* the core's limit of a prompt (docs/sessions.md) */

static const char *str_of(const json_t *o, const char *key) {
  return json_string_value(json_object_get(o, key));
}

json_t *acp_codec_prompt(const json_t *prompt, char *why, size_t why_len) {
  if (!json_is_array(prompt) || json_array_size(prompt) == 0) {
    snprintf(why, why_len, "params.prompt: a non-empty array of content blocks is required");
    return NULL;
  }
  if (json_array_size(prompt) > ACP_MAX_BLOCKS) {
    snprintf(why, why_len, "params.prompt: at most %d content blocks", ACP_MAX_BLOCKS);
    return NULL;
  }
  json_t *out = json_array();
  if (!out) {
    snprintf(why, why_len, "out of memory");
    return NULL;
  }
  size_t i = 0;
  json_t *b = NULL;
  json_array_foreach(prompt, i, b) {
    const char *type = json_is_object(b) ? str_of(b, "type") : NULL;
    json_t *block = NULL;
    if (!type) {
      snprintf(why, why_len, "params.prompt[%zu]: an object with a string type is required", i);
    } else if (strcmp(type, "text") == 0) {
      if (!json_is_string(json_object_get(b, "text")))
        snprintf(why, why_len, "params.prompt[%zu].text: a string is required", i);
      else
        block = json_pack("{s:s, s:O}", "type", "text", "text", json_object_get(b, "text"));
    } else if (strcmp(type, "resource_link") == 0) {
      if (!json_is_string(json_object_get(b, "uri")))
        snprintf(why, why_len, "params.prompt[%zu].uri: a string is required", i);
      else if (!json_is_string(json_object_get(b, "name")))
        snprintf(why, why_len, "params.prompt[%zu].name: a string is required", i);
      else
        block = json_pack("{s:s, s:O, s:O}", "type", "resource_link", "uri", json_object_get(b, "uri"),
                          "name", json_object_get(b, "name"));
    } else if (strcmp(type, "image") == 0 || strcmp(type, "audio") == 0) {
      snprintf(why, why_len,
               "params.prompt[%zu]: %s content is not supported (promptCapabilities.%s is false)", i, type,
               type);
    } else if (strcmp(type, "resource") == 0) {
      snprintf(why, why_len,
               "params.prompt[%zu]: embedded resources are not supported (promptCapabilities.embeddedContext "
               "is false); send a resource_link instead",
               i);
    } else {
      snprintf(why, why_len, "params.prompt[%zu].type: unknown content type", i);
    }
    if (!block || json_array_append_new(out, block) != 0) {
      if (block == NULL && why[0] == '\0')
        snprintf(why, why_len, "out of memory");
      json_decref(out);
      return NULL;
    }
  }
  return out;
}

const char *acp_codec_stop_reason(const char *reason) {
  if (!reason)
    return NULL;
  if (strcmp(reason, "end") == 0)
    return "end_turn";
  if (strcmp(reason, "max-tokens") == 0)
    return "max_tokens";
  if (strcmp(reason, "refusal") == 0)
    return "refusal";
  if (strcmp(reason, "cancelled") == 0)
    return "cancelled";
  return NULL;
}

const char *acp_codec_tool_kind(const char *tool, const char *recorded) {
  /* The core records what a tool does with its call (its listing's kind: an MCP server's annotations). */
  static const char *const kinds[] = {"read",   "edit",    "delete", "move",
                                      "search", "execute", "think",  "fetch"};
  for (size_t i = 0; recorded && i < sizeof kinds / sizeof kinds[0]; i++)
    if (strcmp(recorded, kinds[i]) == 0)
      return kinds[i];
  if (!tool)
    return "other";
  if (strcmp(tool, "read_file") == 0 || strcmp(tool, "list_dir") == 0)
    return "read";
  if (strcmp(tool, "write_file") == 0)
    return "edit";
  if (strcmp(tool, "run_command") == 0)
    return "execute";
  if (strcmp(tool, "update_plan") == 0)
    return "think";
  return "other";
}

/* `s` cut to at most `max` bytes at a character boundary (the core's strings are valid UTF-8, and a cut
 * inside a character would make jansson refuse the string). Malloc'ed. */
static char *cut_utf8(const char *s, size_t max) {
  size_t n = strlen(s);
  bool cut = n > max;
  if (cut) {
    n = max;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
      n--;
  }
  char *out = malloc(n + (cut ? 4 : 1));
  if (!out)
    return NULL;
  memcpy(out, s, n);
  if (cut)
    memcpy(out + n, "…", 4); /* 3 bytes and the NUL */
  else
    out[n] = '\0';
  return out;
}

char *acp_codec_tool_title(const char *tool, const json_t *args) {
  const char *name = tool ? tool : "tool";
  const char *detail = NULL;
  const char *verb = NULL;
  if (strcmp(name, "run_command") == 0) {
    verb = "Run";
    detail = str_of(args, "command");
  } else if (strcmp(name, "read_file") == 0) {
    verb = "Read";
    detail = str_of(args, "path");
  } else if (strcmp(name, "write_file") == 0) {
    verb = "Write";
    detail = str_of(args, "path");
  } else if (strcmp(name, "list_dir") == 0) {
    verb = "List";
    detail = str_of(args, "path");
  } else if (strcmp(name, "update_plan") == 0) {
    return strdup("Update the plan");
  }
  char *cut = detail ? cut_utf8(detail, TITLE_MAX) : NULL;
  char *title = NULL;
  int rc = cut ? asprintf(&title, "%s %s", verb, cut) : asprintf(&title, "%s", name);
  free(cut);
  return rc < 0 ? NULL : title;
}

void acp_codec_tool_call_id(char *buf, size_t n, const char *turn_id, const char *call_id) {
  snprintf(buf, n, "%s/%s", turn_id ? turn_id : "-", call_id ? call_id : "-");
}

void acp_codec_state_clear(acp_codec_state *st) {
  free(st->cwd);
  json_decref(st->calls);
  memset(st, 0, sizeof *st);
}

void acp_codec_state_move(acp_codec_state *dst, acp_codec_state *src) {
  acp_codec_state_clear(dst);
  *dst = *src;
  memset(src, 0, sizeof *src);
}

void acp_codec_state_cwd(acp_codec_state *st, const char *cwd) {
  free(st->cwd);
  st->cwd = cwd ? strdup(cwd) : NULL;
}

/* A tool's path made absolute against the session's cwd (lexically; the tools confine it themselves). */
static char *abs_path(const acp_codec_state *st, const char *path) {
  char *out = NULL;
  if (!path || !*path)
    return NULL;
  if (path[0] == '/')
    return strdup(path);
  if (!st->cwd)
    return NULL;
  size_t n = strlen(st->cwd);
  bool slash = n > 0 && st->cwd[n - 1] == '/';
  const char *rest = strcmp(path, ".") == 0 ? "" : strncmp(path, "./", 2) == 0 ? path + 2 : path;
  if (asprintf(&out, "%s%s%s", st->cwd, slash || !*rest ? "" : "/", rest) < 0)
    return NULL;
  return out;
}

void acp_codec_message_id(acp_codec_state *ctr, const char *turn_id, char *buf, size_t n) {
  const char *t = turn_id ? turn_id : "-";
  if (strncmp(ctr->turn, t, sizeof ctr->turn - 1) != 0) {
    snprintf(ctr->turn, sizeof ctr->turn, "%s", t);
    ctr->n = 0;
  }
  snprintf(buf, n, "%s/%d", ctr->turn, ctr->n);
}

json_t *acp_codec_text_chunk(const char *kind, const char *text, const char *message_id) {
  json_t *u =
      json_pack("{s:s, s:{s:s, s:s}}", "sessionUpdate", kind, "content", "type", "text", "text", text);
  if (u && message_id)
    json_object_set_new(u, "messageId", json_string(message_id));
  return u;
}

json_t *acp_codec_block_out(const json_t *block) {
  const char *type = str_of(block, "type");
  if (type && strcmp(type, "text") == 0 && json_is_string(json_object_get(block, "text")))
    return json_pack("{s:s, s:O}", "type", "text", "text", json_object_get(block, "text"));
  if (type && strcmp(type, "resource_link") == 0 && json_is_string(json_object_get(block, "uri"))) {
    json_t *name = json_object_get(block, "name");
    return json_pack("{s:s, s:O, s:O}", "type", "resource_link", "uri", json_object_get(block, "uri"), "name",
                     json_is_string(name) ? name : json_object_get(block, "uri"));
  }
  /* ACP-OUTPUT-PERMISSION: richer output is never dropped silently, nor sent as an unadvertised block. */
  const char *mime = str_of(block, "mimeType");
  char text[160];
  snprintf(text, sizeof text, "[%s%s%s, not shown]", type ? type : "content", mime ? ": " : "",
           mime ? mime : "");
  json_t *t = json_pack("{s:s, s:s}", "type", "text", "text", text);
  if (!t) /* a type or mime with invalid UTF-8 cut by snprintf */
    t = json_pack("{s:s, s:s}", "type", "text", "text", "[content, not shown]");
  return t;
}

/* The text shown for a tool's result. */
static char *tool_text(const char *tool, const json_t *result, bool is_error) {
  const char *err = str_of(result, "error");
  if (is_error && err)
    return strdup(err);
  if (!is_error && tool && json_is_object(result)) {
    if (strcmp(tool, "read_file") == 0 && str_of(result, "content"))
      return strdup(str_of(result, "content"));
    if (strcmp(tool, "run_command") == 0 && str_of(result, "stdout")) {
      const char *out = str_of(result, "stdout");
      const char *errs = str_of(result, "stderr");
      char *t = NULL;
      if (asprintf(&t, "%s%s%s", out, errs && *errs ? (*out ? "\n" : "") : "", errs ? errs : "") < 0)
        return NULL;
      return t;
    }
  }
  if (json_is_string(result))
    return strdup(json_string_value(result));
  return json_dumps(result ? result : json_null(), JSON_COMPACT | JSON_ENCODE_ANY);
}

/* "Hook guard: denied: REASON" and the like, for a hook/ran event. */
static char *hook_text(const json_t *data) {
  const char *hook = str_of(data, "hook") ? str_of(data, "hook") : "?";
  const char *outcome = str_of(data, "outcome") ? str_of(data, "outcome") : "?";
  const char *reason = str_of(data, "reason");
  const char *error = str_of(data, "error");
  const char *on_error = str_of(data, "onError");
  char *out = NULL;
  int n;
  if (strcmp(outcome, "deny") == 0)
    n = asprintf(&out, "Hook %s: denied%s%s", hook, reason ? ": " : "", reason ? reason : "");
  else if (strcmp(outcome, "error") == 0)
    n = asprintf(&out, "Hook %s failed: %s (on_error: %s)", hook, error ? error : "?",
                 on_error ? on_error : "?");
  else if (strcmp(outcome, "amend") == 0)
    n = asprintf(&out, "Hook %s: amended", hook);
  else
    n = asprintf(&out, "Hook %s: %s", hook, strcmp(outcome, "allow") == 0 ? "allowed" : outcome);
  return n < 0 ? NULL : out;
}

static void append(json_t *out, json_t *update) {
  if (update)
    json_array_append_new(out, update);
}

void acp_codec_event(const json_t *event, bool replay, bool with_commits, acp_codec_state *ctr, json_t *out) {
  const char *kind = str_of(event, "kind");
  const char *turn = str_of(event, "turnId");
  json_t *data = json_object_get(event, "data");
  if (!kind || !json_is_object(data))
    return;
  char id[192];
  if (strcmp(kind, "inbox/received") == 0) {
    if (!replay)
      return;
    size_t i = 0;
    json_t *b = NULL;
    json_t *content = json_object_get(data, "content");
    const char *mid = str_of(event, "messageId");
    json_array_foreach(content, i, b) {
      json_t *u =
          json_pack("{s:s, s:o}", "sessionUpdate", "user_message_chunk", "content", acp_codec_block_out(b));
      if (u && mid)
        json_object_set_new(u, "messageId", json_string(mid));
      append(out, u);
    }
  } else if (strcmp(kind, "message/committed") == 0) {
    acp_codec_message_id(ctr, turn, id, sizeof id);
    ctr->n++;
    if (!with_commits)
      return;
    const char *text = str_of(data, "text");
    json_t *content = json_object_get(data, "content");
    if (text) {
      append(out, acp_codec_text_chunk("agent_message_chunk", text, id));
    } else if (json_is_array(content)) {
      size_t i = 0;
      json_t *b = NULL;
      json_array_foreach(content, i, b) {
        json_t *u = json_pack("{s:s, s:o, s:s}", "sessionUpdate", "agent_message_chunk", "content",
                              acp_codec_block_out(b), "messageId", id);
        append(out, u);
      }
    }
  } else if (strcmp(kind, "tool/call") == 0) {
    const char *tool = str_of(data, "name");
    json_t *args = json_object_get(data, "args");
    acp_codec_tool_call_id(id, sizeof id, turn, str_of(data, "callId"));
    char *title = acp_codec_tool_title(tool, args);
    json_t *u =
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:O}", "sessionUpdate", "tool_call", "toolCallId", id, "title",
                  title ? title : "tool", "kind", acp_codec_tool_kind(tool, str_of(data, "kind")), "status",
                  "pending", "rawInput", args ? args : json_null());
    free(title);
    /* The file a built-in tool works on, for an editor that follows the agent. */
    bool on_path = tool && (strcmp(tool, "read_file") == 0 || strcmp(tool, "write_file") == 0 ||
                            strcmp(tool, "list_dir") == 0);
    char *path = on_path ? abs_path(ctr, str_of(args, "path")) : NULL;
    if (u && path)
      json_object_set_new(u, "locations", json_pack("[{s:s}]", "path", path));
    free(path);
    append(out, u);
    if (tool && strcmp(tool, "write_file") == 0) { /* its result's update shows the change as a diff */
      if (!ctr->calls)
        ctr->calls = json_object();
      json_object_set_new(ctr->calls, id,
                          json_pack("{s:s, s:O}", "name", tool, "args", args ? args : json_null()));
    }
  } else if (strcmp(kind, "tool/approval") == 0) {
    const char *outcome = str_of(data, "outcome");
    if (outcome && strcmp(outcome, "granted") == 0) {
      acp_codec_tool_call_id(id, sizeof id, turn, str_of(data, "callId"));
      append(out, json_pack("{s:s, s:s, s:s}", "sessionUpdate", "tool_call_update", "toolCallId", id,
                            "status", "in_progress"));
    }
    /* denied / cancelled: the tool/result that follows carries the failure. */
  } else if (strcmp(kind, "tool/result") == 0) {
    json_t *result = json_object_get(data, "result");
    bool is_error = json_is_true(json_object_get(data, "isError"));
    acp_codec_tool_call_id(id, sizeof id, turn, str_of(data, "callId"));
    char *text = tool_text(str_of(data, "name"), result, is_error);
    json_t *u =
        json_pack("{s:s, s:s, s:s, s:O}", "sessionUpdate", "tool_call_update", "toolCallId", id, "status",
                  is_error ? "failed" : "completed", "rawOutput", result ? result : json_null());
    if (u && text) {
      json_t *c =
          json_pack("[{s:s, s:{s:s, s:s}}]", "type", "content", "content", "type", "text", "text", text);
      if (c)
        json_object_set_new(u, "content", c);
    }
    free(text);
    json_t *call = json_object_get(ctr->calls, id);
    json_t *old = json_object_get(data, "oldText");
    const char *new_text = str_of(json_object_get(call, "args"), "content");
    const char *path = str_of(result, "path");
    if (u && call && !is_error && old && new_text && path) {
      /* A write as a diff: the text before (null for a new file) and after. */
      json_t *diff = json_pack("{s:s, s:s, s:O, s:s}", "type", "diff", "path", path, "oldText", old,
                               "newText", new_text);
      if (diff)
        json_object_set_new(u, "content", json_pack("[o]", diff));
      json_object_set_new(u, "locations", json_pack("[{s:s}]", "path", path));
    }
    /* A command that ran in the editor's terminal: the terminal stays shown, before its output. */
    const char *terminal = str_of(result, "terminalId");
    json_t *content = json_object_get(u, "content");
    if (u && terminal && json_is_array(content))
      json_array_insert_new(content, 0, json_pack("{s:s, s:s}", "type", "terminal", "terminalId", terminal));
    if (call)
      json_object_del(ctr->calls, id);
    append(out, u);
  } else if (strcmp(kind, "plan/updated") == 0) {
    /* The model's plan (update_plan) as the editor's checklist: the whole list each time. */
    json_t *entries = json_array();
    size_t i = 0;
    json_t *e = NULL;
    json_array_foreach(json_object_get(data, "entries"), i, e) {
      const char *content = str_of(e, "content");
      const char *status = str_of(e, "status");
      const char *priority = str_of(e, "priority");
      if (content && status)
        json_array_append_new(entries, json_pack("{s:s, s:s, s:s}", "content", content, "status", status,
                                                 "priority", priority ? priority : "medium"));
    }
    append(out, json_pack("{s:s, s:o}", "sessionUpdate", "plan", "entries", entries));
  } else if (strcmp(kind, "turn/ended") == 0) {
    /* The token meter: what the conversation holds now against the provider's context window (known only
     * when the provider says it, e.g. [provider.NAME] context_window of the openai provider). */
    json_t *usage = json_object_get(data, "usage");
    json_t *size = json_object_get(usage, "contextWindow");
    json_t *used = json_object_get(usage, "contextTokens");
    json_int_t n = json_is_integer(used) ? json_integer_value(used)
                                         : json_integer_value(json_object_get(usage, "inputTokens")) +
                                               json_integer_value(json_object_get(usage, "outputTokens"));
    if (json_is_integer(size) && json_integer_value(size) > 0 && n >= 0)
      append(out, json_pack("{s:s, s:I, s:O}", "sessionUpdate", "usage_update", "used", n, "size", size));
  } else if (strcmp(kind, "hook/ran") == 0 && turn) {
    /* A hook's run: an update of the tool call it ran for, else (prompt_submit) a card of its own. */
    char *text = hook_text(data);
    const char *outcome = str_of(data, "outcome");
    bool denied = outcome && (strcmp(outcome, "deny") == 0 ||
                              (strcmp(outcome, "error") == 0 && str_of(data, "onError") &&
                               strcmp(str_of(data, "onError"), "deny") == 0));
    json_t *content = json_pack("[{s:s, s:{s:s, s:s}}]", "type", "content", "content", "type", "text", "text",
                                text ? text : "");
    if (str_of(data, "callId")) {
      acp_codec_tool_call_id(id, sizeof id, turn, str_of(data, "callId"));
      append(out, json_pack("{s:s, s:s, s:o}", "sessionUpdate", "tool_call_update", "toolCallId", id,
                            "content", content));
    } else {
      char sub[120];
      snprintf(sub, sizeof sub, "hook/%.40s/%.60s", str_of(data, "event") ? str_of(data, "event") : "-",
               str_of(data, "hook") ? str_of(data, "hook") : "-");
      acp_codec_tool_call_id(id, sizeof id, turn, sub);
      char title[160];
      snprintf(title, sizeof title, "Hook %s (%s)", str_of(data, "hook") ? str_of(data, "hook") : "?",
               str_of(data, "event") ? str_of(data, "event") : "?");
      append(out, json_pack("{s:s, s:s, s:s, s:s, s:s, s:o, s:O}", "sessionUpdate", "tool_call", "toolCallId",
                            id, "title", title, "kind", "other", "status", denied ? "failed" : "completed",
                            "content", content, "rawOutput", data));
    }
    free(text);
  } else if (strcmp(kind, "question/asked") == 0) {
    /* A question with options is asked as a session/request_permission (agent.c); a free-text one cannot be
     * answered over ACP (agent.c answers it cancelled): the user still sees what was asked. */
    const char *q = json_array_size(json_object_get(data, "options")) > 0 ? NULL : str_of(data, "question");
    char *text = NULL;
    snprintf(id, sizeof id, "%s/question/%s", turn ? turn : "-",
             str_of(data, "requestId") ? str_of(data, "requestId") : "-");
    if (q && asprintf(&text, "Question (cannot be answered over ACP): %s", q) >= 0) {
      append(out, acp_codec_text_chunk("agent_message_chunk", text, id));
      free(text);
    }
  } else if (strcmp(kind, "subagent/started") == 0) {
    /* A subagent is shown as a `think` tool call of the parent's turn: its own events stay in its session. */
    char sub[160];
    snprintf(sub, sizeof sub, "subagent/%s", str_of(data, "sessionId") ? str_of(data, "sessionId") : "-");
    acp_codec_tool_call_id(id, sizeof id, turn, sub);
    const char *prompt = str_of(data, "prompt");
    char *cut = prompt ? cut_utf8(prompt, TITLE_MAX) : NULL;
    char *title = NULL;
    if (asprintf(&title, "Subagent: %s", cut ? cut : "") < 0)
      title = NULL;
    free(cut);
    append(out, json_pack("{s:s, s:s, s:s, s:s, s:s, s:{s:s}}", "sessionUpdate", "tool_call", "toolCallId",
                          id, "title", title ? title : "Subagent", "kind", "think", "status", "in_progress",
                          "rawInput", "prompt", prompt ? prompt : ""));
    free(title);
  } else if (strcmp(kind, "subagent/finished") == 0) {
    char sub[160];
    snprintf(sub, sizeof sub, "subagent/%s", str_of(data, "sessionId") ? str_of(data, "sessionId") : "-");
    acp_codec_tool_call_id(id, sizeof id, turn, sub);
    const char *reason = str_of(data, "reason");
    const char *text = str_of(data, "text");
    json_t *u =
        json_pack("{s:s, s:s, s:s, s:O}", "sessionUpdate", "tool_call_update", "toolCallId", id, "status",
                  reason && strcmp(reason, "end") == 0 ? "completed" : "failed", "rawOutput", data);
    if (u && text)
      json_object_set_new(
          u, "content",
          json_pack("[{s:s, s:{s:s, s:s}}]", "type", "content", "content", "type", "text", "text", text));
    append(out, u);
  }
  /* inbox/claimed, turn/started, question/answered, agent/error: no update of
   * their own (the prompt's answer carries the turn's end). */
}
