/* Usage as durable facts (docs/usage.md): every model round trip a provider reports is a model/usage event,
 * and the session's own totals (the row's `usage`) change in the same opset, so the row never disagrees
 * with the events committed. A turn whose provider reported no round trips (an older plugin, echo) counts
 * its turn/ended usage instead: the same tokens are never counted twice.
 *
 * Row usage: {inputTokens, cachedInputTokens, outputTokens, reasoningTokens, requests, turns,
 *             byModel: [{provider, model|null, day, inputTokens, …, requests}]}
 * byModel keeps what pricing needs (who, which model, which day); a null model is usage not attributed to
 * one model. Costs are computed when read, from the configured price table: never stored.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../usage.h"
#include "session.h"

#define LOG "sessions"

static void tokens_of(const json_t *o, ah_tokens *t) {
  char err[120];
  if (ah__tokens_from_json(o, t, err, sizeof err) != 0)
    memset(t, 0, sizeof *t);
}

static void tokens_into(json_t *o, const ah_tokens *t) {
  json_t *j = ah__tokens_json(t);
  json_object_update(o, j);
  json_decref(j);
}

json_t *ah__usage_account(session *s, const char *model, const json_t *usage, bool turn) {
  ah_tokens add = {0}, total, bucket;
  char err[120];
  if (usage && ah__tokens_from_json(usage, &add, err, sizeof err) != 0) {
    AH_LOG_W(LOG, "session %s: a provider reported usage that is not counted: %s", s->id, err);
    memset(&add, 0, sizeof add);
  }
  if (!turn && ah__tokens_zero(&add))
    return NULL;
  json_t *u = json_deep_copy(json_object_get(s->row, "usage"));
  if (!json_is_object(u)) {
    json_decref(u);
    u = json_object();
  }
  tokens_of(u, &total);
  if (ah__tokens_add(&total, &add) != 0) {
    AH_LOG_W(LOG, "session %s: usage totals would overflow: not counted", s->id);
    json_decref(u);
    return NULL;
  }
  tokens_into(u, &total);
  if (turn)
    json_object_set_new(u, "turns", json_integer(json_integer_value(json_object_get(u, "turns")) + 1));
  if (!ah__tokens_zero(&add)) {
    char day[32];
    ah__time_rfc3339(day);
    day[10] = '\0';
    const char *provider = str(s->row, "provider");
    json_t *by = json_object_get(u, "byModel");
    if (!json_is_array(by)) {
      by = json_array();
      json_object_set_new(u, "byModel", by);
    }
    json_t *b = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(by, i, e) {
      const char *m = str(e, "model");
      if (strcmp(str(e, "day") ? str(e, "day") : "", day) == 0 &&
          strcmp(str(e, "provider") ? str(e, "provider") : "", provider ? provider : "") == 0 &&
          ((!m && !model) || (m && model && strcmp(m, model) == 0))) {
        b = e;
        break;
      }
    }
    if (!b) {
      b = json_pack("{s:s?, s:s?, s:s}", "provider", provider, "model", model, "day", day);
      if (!model)
        json_object_set_new(b, "model", json_null());
      json_array_append_new(by, b);
    }
    tokens_of(b, &bucket);
    ah__tokens_add(&bucket, &add);
    tokens_into(b, &bucket);
  }
  json_object_set(s->row, "usage", u);
  return json_pack("{s:s, s:s, s:{s:o}}", "op", "session.update", "id", s->id, "set", "usage", u);
}

/* The configured price table, read again when [host] prices names another file (SIGHUP). */
static const ah_prices *prices_of(ah_sessions *m) {
  const ah_config *cfg = ah__host_config(m->host);
  const char *path = cfg ? cfg->prices : NULL;
  if (!path) {
    ah__prices_free(m->prices);
    m->prices = NULL;
    free(m->prices_path);
    m->prices_path = NULL;
    return NULL;
  }
  if (m->prices_path && strcmp(m->prices_path, path) == 0)
    return m->prices;
  ah__prices_free(m->prices);
  free(m->prices_path);
  char why[320];
  m->prices = ah__prices_load(path, why, sizeof why);
  m->prices_path = strdup(path);
  if (!m->prices)
    AH_LOG_W(LOG, "costs are not computed: %s", why);
  return m->prices;
}

static void cost_of(const json_t *u, const ah_prices *p, ah_cost *c) {
  size_t i;
  json_t *b;
  json_array_foreach(json_object_get(u, "byModel"), i, b) {
    ah_tokens t;
    tokens_of(b, &t);
    ah__cost_add(c, p, str(b, "provider"), str(b, "model"), str(b, "day"), &t);
  }
}

/* What the session object shows: its own `usage` (the row's, with zeros when it has none), `treeUsage`
 * (itself and every session below it, each counted once, from `tree`: the store's AH_STORE_Q_TREE of it)
 * and, with a price table, `cost` and `treeCost`. */
void ah__usage_public(ah_sessions *m, json_t *pub, const json_t *row, const json_t *tree) {
  const json_t *own = json_object_get(row, "usage");
  const char *id = str(row, "id");
  json_t *u = json_is_object(own) ? json_deep_copy(own) : json_object();
  ah_tokens t;
  tokens_of(u, &t);
  tokens_into(u, &t);
  if (!json_object_get(u, "turns"))
    json_object_set_new(u, "turns", json_integer(0));
  if (!json_object_get(u, "byModel"))
    json_object_set_new(u, "byModel", json_array());
  json_object_set_new(pub, "usage", u);
  const ah_prices *p = prices_of(m);
  if (p) {
    ah_cost c = {0};
    cost_of(u, p, &c);
    json_object_set_new(pub, "cost", ah__cost_json(&c, p));
  }
  size_t n = json_array_size(tree);
  if (!id || n == 0)
    return;
  const char **ids = calloc(n, sizeof *ids), **parents = calloc(n, sizeof *parents);
  ah_tokens *owns = calloc(n, sizeof *owns);
  if (!ids || !parents || !owns) {
    free(ids);
    free(parents);
    free(owns);
    return;
  }
  int64_t turns = 0;
  ah_cost tc = {0};
  size_t i;
  json_t *r;
  json_array_foreach(tree, i, r) {
    ids[i] = str(r, "id");
    parents[i] = str(r, "parent");
    /* the session's own from `row`: a live session's may be ahead of the store */
    const json_t *ru = ids[i] && strcmp(ids[i], id) == 0 ? u : json_object_get(r, "usage");
    tokens_of(ru, &owns[i]);
    turns += json_integer_value(json_object_get(ru, "turns"));
    if (p)
      cost_of(ru, p, &tc);
  }
  ah_tokens sum;
  size_t counted = ah__usage_tree(ids, parents, owns, n, id, &sum);
  json_t *tu = ah__tokens_json(&sum);
  json_object_set_new(tu, "turns", json_integer(turns));
  json_object_set_new(tu, "sessions", json_integer((json_int_t)counted));
  json_object_set_new(pub, "treeUsage", tu);
  if (p)
    json_object_set_new(pub, "treeCost", ah__cost_json(&tc, p));
  free(ids);
  free(parents);
  free(owns);
}
