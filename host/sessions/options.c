/* A session's options (docs/sessions.md "Options"): the selectors a client shows — the model, the mode and
 * the reasoning effort — computed from the session's row and its provider's configuration, validated and
 * set here, for every surface (session.options, session.set-option, the remote gateway's session_update).
 *
 * Each option: {id, name, description, category, type: "select", currentValue, options: [{value, name,
 * description?}]} (the shape ACP's configOptions take). A change is stored with the row (model; settings
 * {mode, effort}) and announced as session.options {sessionId, options, changed}.
 */
#include "session.h"

#include <stdlib.h>
#include <string.h>

#include "../config.h"

static const struct {
  const char *id, *name, *description;
} modes[] = {
    {"ask", "Ask", "Edits and commands ask first (the tools' policies apply)"},
    {"accept_edits", "Accept edits", "File edits run without asking; commands still ask"},
    {"read_only", "Read only", "Only tools that read run; edits, commands and other tools are refused"},
};

static const json_t *provider_section(ah_sessions *m, const json_t *row) {
  const ah_config *cfg = ah__host_config(m->host);
  const char *name = str(row, "provider");
  return cfg && name ? json_object_get(cfg->providers, name) : NULL;
}

const char *ah__session_mode_of(ah_sessions *m, const json_t *row) {
  const char *mode = str(json_object_get(row, "settings"), "mode");
  if (ah__config_mode_valid(mode))
    return mode;
  const ah_config *cfg = ah__host_config(m->host);
  return cfg && ah__config_mode_valid(cfg->default_mode) ? cfg->default_mode : "ask";
}

/* The reasoning efforts the provider offers: [provider.NAME] reasoning_efforts (a list), NULL when none. */
static json_t *efforts_of(const json_t *pc) {
  json_t *list = ah__config_list(str(pc, "reasoning_efforts"));
  if (json_array_size(list) == 0) {
    json_decref(list);
    return NULL;
  }
  return list;
}

const char *ah__session_effort_of(ah_sessions *m, const json_t *row) {
  const char *e = str(json_object_get(row, "settings"), "effort");
  return e ? e : str(provider_section(m, row), "reasoning_effort");
}

static void add_unique(json_t *values, const char *v) {
  size_t i;
  json_t *x;
  if (!v || !*v)
    return;
  json_array_foreach(values, i, x) {
    if (strcmp(json_string_value(x), v) == 0)
      return;
  }
  json_array_append_new(values, json_string(v));
}

/* The models offered: the session's, the configured `model`, then `models`. */
static json_t *models_of(const json_t *row, const json_t *pc) {
  json_t *values = json_array();
  add_unique(values, str(row, "model"));
  add_unique(values, str(pc, "model"));
  json_t *listed = ah__config_list(str(pc, "models"));
  size_t i;
  json_t *x;
  json_array_foreach(listed, i, x) {
    add_unique(values, json_string_value(x));
  }
  json_decref(listed);
  return values;
}

static json_t *select_option(const char *id, const char *name, const char *description, const char *current,
                             json_t *choices) {
  return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:o}", "id", id, "name", name, "description", description,
                   "category", id, "type", "select", "currentValue", current, "options", choices);
}

json_t *ah__session_options_of(ah_sessions *m, const json_t *row) {
  const json_t *pc = provider_section(m, row);
  json_t *out = json_array();
  json_t *models = models_of(row, pc);
  if (json_array_size(models) > 0) {
    json_t *choices = json_array();
    size_t i;
    json_t *x;
    json_array_foreach(models, i, x) {
      json_array_append_new(choices, json_pack("{s:O, s:O}", "value", x, "name", x));
    }
    const char *cur = str(row, "model") ? str(row, "model") : json_string_value(json_array_get(models, 0));
    json_array_append_new(
        out, select_option("model", "Model", "The model of the session's next turn", cur, choices));
  }
  json_decref(models);
  json_t *mchoices = json_array();
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
    json_array_append_new(mchoices, json_pack("{s:s, s:s, s:s}", "value", modes[i].id, "name", modes[i].name,
                                              "description", modes[i].description));
  json_array_append_new(out, select_option("mode", "Mode", "What the agent's tools may do without asking",
                                           ah__session_mode_of(m, row), mchoices));
  json_t *efforts = efforts_of(pc);
  if (efforts) {
    const char *cur = ah__session_effort_of(m, row);
    json_t *choices = json_array();
    size_t i;
    json_t *x;
    bool known = false;
    json_array_foreach(efforts, i, x) {
      json_array_append_new(choices, json_pack("{s:O, s:O}", "value", x, "name", x));
      known |= cur && strcmp(cur, json_string_value(x)) == 0;
    }
    if (!known) { /* none chosen and none configured: the provider's own default, nothing sent */
      json_array_insert_new(choices, 0,
                            json_pack("{s:s, s:s, s:s}", "value", "default", "name", "default", "description",
                                      "The provider's default (none is sent)"));
      cur = "default";
    }
    json_array_append_new(out, select_option("thought_level", "Thinking",
                                             "How much the model reasons before it answers", cur, choices));
    json_decref(efforts);
  }
  return out;
}

json_t *ah__session_options(session *s) {
  return ah__session_options_of(s->m, s->row);
}

static bool offered(const json_t *options, const char *id, const char *value) {
  size_t i, j;
  json_t *o, *c;
  json_array_foreach(options, i, o) {
    if (strcmp(str(o, "id"), id) != 0)
      continue;
    json_array_foreach(json_object_get(o, "options"), j, c) {
      if (strcmp(str(c, "value"), value) == 0)
        return true;
    }
    return false;
  }
  return false;
}

int ah__session_set_option(session *s, const char *id, const json_t *value, bool check_only, char *why,
                           size_t cap) {
  json_t *options = ah__session_options(s);
  const char *v = json_string_value(value);
  bool known = false;
  size_t i;
  json_t *o;
  json_array_foreach(options, i, o) {
    known |= id && strcmp(str(o, "id"), id) == 0;
  }
  int rc = 0;
  if (!known) {
    snprintf(why, cap, "params.configId: the session has no option \"%.64s\"", id ? id : "");
    rc = AH_EINVAL;
  } else if (!v || !offered(options, id, v)) {
    snprintf(why, cap, "params.value: \"%.64s\" is not a value of the option %s", v ? v : "(not a string)",
             id);
    rc = AH_EINVAL;
  } else if (s->closing || s->disposed) {
    snprintf(why, cap, "the session is closed");
    rc = AH_ECLOSED;
  }
  json_decref(options);
  if (rc || check_only)
    return rc;
  json_t *set = json_object();
  if (strcmp(id, "model") == 0) {
    json_object_set_new(set, "model", json_string(v));
  } else {
    json_t *settings = json_deep_copy(json_object_get(s->row, "settings"));
    if (!json_is_object(settings)) {
      json_decref(settings);
      settings = json_object();
    }
    const char *key = strcmp(id, "mode") == 0 ? "mode" : "effort";
    if (strcmp(key, "effort") == 0 && strcmp(v, "default") == 0)
      json_object_del(settings, key);
    else
      json_object_set_new(settings, key, json_string(v));
    json_object_set_new(set, "settings", settings);
  }
  ah__write_fields(s, set);
  ah__sm_emit(
      s->m, "session.options",
      json_pack("{s:s, s:o, s:s}", "sessionId", s->id, "options", ah__session_options(s), "changed", id));
  return 0;
}
