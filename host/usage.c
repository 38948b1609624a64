/* agenthost — usage and cost arithmetic (usage.h). */
#include "usage.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agenthost/errors.h"
#include "readall.h"

/* ---- tokens ---------------------------------------------------------------------------------------------
 */

static const struct {
  const char *key;
  size_t off;
} token_keys[] = {
    {"inputTokens", offsetof(ah_tokens, input)},   {"cachedInputTokens", offsetof(ah_tokens, cached)},
    {"outputTokens", offsetof(ah_tokens, output)}, {"reasoningTokens", offsetof(ah_tokens, reasoning)},
    {"requests", offsetof(ah_tokens, requests)},
};

#define TOKENS_MAX ((int64_t)1 << 53) /* exact in every JSON reader, including JavaScript's */

int ah__tokens_from_json(const json_t *usage, ah_tokens *out, char *err, size_t cap) {
  memset(out, 0, sizeof *out);
  if (!json_is_object(usage)) {
    snprintf(err, cap, "usage is not an object");
    return -1;
  }
  for (size_t i = 0; i < sizeof token_keys / sizeof token_keys[0]; i++) {
    const json_t *v = json_object_get(usage, token_keys[i].key);
    if (!v || json_is_null(v))
      continue;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > TOKENS_MAX) {
      snprintf(err, cap, "usage.%s is not a whole number from 0 to 2^53", token_keys[i].key);
      return -1;
    }
    *(int64_t *)((char *)out + token_keys[i].off) = json_integer_value(v);
  }
  if (out->cached > out->input) {
    snprintf(err, cap, "usage.cachedInputTokens is larger than usage.inputTokens");
    return -1;
  }
  if (out->reasoning > out->output) {
    snprintf(err, cap, "usage.reasoningTokens is larger than usage.outputTokens");
    return -1;
  }
  return 0;
}

json_t *ah__tokens_json(const ah_tokens *t) {
  return json_pack("{s:I, s:I, s:I, s:I, s:I}", "inputTokens", (json_int_t)t->input, "cachedInputTokens",
                   (json_int_t)t->cached, "outputTokens", (json_int_t)t->output, "reasoningTokens",
                   (json_int_t)t->reasoning, "requests", (json_int_t)t->requests);
}

int ah__tokens_add(ah_tokens *a, const ah_tokens *b) {
  ah_tokens r;
  if (__builtin_add_overflow(a->input, b->input, &r.input) ||
      __builtin_add_overflow(a->cached, b->cached, &r.cached) ||
      __builtin_add_overflow(a->output, b->output, &r.output) ||
      __builtin_add_overflow(a->reasoning, b->reasoning, &r.reasoning) ||
      __builtin_add_overflow(a->requests, b->requests, &r.requests))
    return -1;
  *a = r;
  return 0;
}

bool ah__tokens_zero(const ah_tokens *t) {
  return !t->input && !t->cached && !t->output && !t->reasoning && !t->requests;
}

/* ---- decimals ----------------------------------------------------------------------------------------- */

int ah__decimal_parse(const char *s, int64_t *out) {
  if (!s || !*s)
    return -1;
  int64_t whole = 0, frac = 0;
  int nwhole = 0, nfrac = 0;
  const char *p = s;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (++nwhole > 6) /* 10^6 per million tokens: 10^18 in 10^-12 units still fits an int64 */
      return -1;
    whole = whole * 10 + (*p - '0');
  }
  if (*p == '.') {
    p++;
    for (; *p >= '0' && *p <= '9'; p++) {
      if (++nfrac > 12)
        return -1;
      frac = frac * 10 + (*p - '0');
    }
    if (nfrac == 0)
      return -1;
  }
  if (*p || nwhole == 0)
    return -1;
  for (int i = nfrac; i < 12; i++)
    frac *= 10;
  *out = whole * 1000000000000LL + frac;
  return 0;
}

void ah__amount_format(ah_amount a, char *buf, size_t cap) {
  static const unsigned long long q = 1000000000000000000ULL; /* 10^18 */
  ah_amount whole = a / q;
  unsigned long long frac = (unsigned long long)(a % q);
  char w[48];
  size_t n = 0;
  do {
    w[n++] = (char)('0' + (int)(whole % 10));
    whole /= 10;
  } while (whole && n < sizeof w);
  char out[80];
  size_t o = 0;
  while (n)
    out[o++] = w[--n];
  if (frac) {
    char f[19];
    snprintf(f, sizeof f, "%018llu", frac);
    size_t fl = 18;
    while (fl && f[fl - 1] == '0')
      fl--;
    out[o++] = '.';
    memcpy(out + o, f, fl);
    o += fl;
  }
  out[o] = '\0';
  snprintf(buf, cap, "%s", out);
}

/* ---- price tables -------------------------------------------------------------------------------------- */

typedef struct rate {
  char *provider; /* NULL: any */
  char *model;
  char from[11];
  int64_t input, cached, output; /* 10^-12 per million tokens */
  bool has_cached;
} rate;

struct ah_prices {
  char *name;
  char *currency;
  rate *rates;
  size_t n;
};

void ah__prices_free(ah_prices *p) {
  if (!p)
    return;
  for (size_t i = 0; i < p->n; i++) {
    free(p->rates[i].provider);
    free(p->rates[i].model);
  }
  free(p->rates);
  free(p->name);
  free(p->currency);
  free(p);
}

static bool is_date(const char *s) {
  if (!s || strlen(s) != 10 || s[4] != '-' || s[7] != '-')
    return false;
  for (int i = 0; i < 10; i++)
    if (i != 4 && i != 7 && (s[i] < '0' || s[i] > '9'))
      return false;
  int mo = (s[5] - '0') * 10 + (s[6] - '0'), d = (s[8] - '0') * 10 + (s[9] - '0');
  return mo >= 1 && mo <= 12 && d >= 1 && d <= 31;
}

static int rate_amount(const json_t *e, const char *key, size_t i, int64_t *out, bool required, bool *has,
                       char *err, size_t cap) {
  const json_t *v = json_object_get(e, key);
  if (!v) {
    if (required) {
      snprintf(err, cap, "rates[%zu].%s is missing", i, key);
      return -1;
    }
    *has = false;
    return 0;
  }
  if (!json_is_string(v) || ah__decimal_parse(json_string_value(v), out) != 0) {
    snprintf(err, cap,
             "rates[%zu].%s must be a decimal string (per million tokens, e.g. \"2.50\"; at most 6 integer "
             "and 12 fractional digits)",
             i, key);
    return -1;
  }
  *has = true;
  return 0;
}

ah_prices *ah__prices_parse(const char *text, size_t len, char *err, size_t cap) {
  json_error_t je;
  json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  if (!doc) {
    snprintf(err, cap, "not JSON (line %d: %s)", je.line, je.text);
    return NULL;
  }
  ah_prices *p = calloc(1, sizeof *p);
  const json_t *rates = json_object_get(doc, "rates");
  const json_t *version = json_object_get(doc, "version");
  const char *currency = json_string_value(json_object_get(doc, "currency"));
  const json_t *name = json_object_get(doc, "name");
  if (!p)
    goto oom;
  if (!json_is_object(doc) || !json_is_integer(version) || json_integer_value(version) != 1) {
    snprintf(err, cap, "\"version\" must be 1");
    goto fail;
  }
  if (!currency || strlen(currency) != 3) {
    snprintf(err, cap, "\"currency\" must be an ISO 4217 code such as \"USD\"");
    goto fail;
  }
  if (name && !json_is_string(name)) {
    snprintf(err, cap, "\"name\" must be a string");
    goto fail;
  }
  if (!json_is_array(rates)) {
    snprintf(err, cap, "\"rates\" must be an array");
    goto fail;
  }
  p->currency = strdup(currency);
  p->name = strdup(name ? json_string_value(name) : "unnamed");
  p->rates = calloc(json_array_size(rates) + 1, sizeof *p->rates);
  if (!p->currency || !p->name || !p->rates)
    goto oom;
  size_t i;
  const json_t *e;
  json_array_foreach(rates, i, e) {
    rate *r = &p->rates[p->n];
    const char *provider = json_string_value(json_object_get(e, "provider"));
    const char *model = json_string_value(json_object_get(e, "model"));
    const char *from = json_string_value(json_object_get(e, "from"));
    bool has = false;
    if (!json_is_object(e)) {
      snprintf(err, cap, "rates[%zu] is not an object", i);
      goto fail;
    }
    if (json_object_get(e, "provider") && !provider) {
      snprintf(err, cap, "rates[%zu].provider must be a string", i);
      goto fail;
    }
    if (!model || !*model) {
      snprintf(err, cap, "rates[%zu].model must be a non-empty string", i);
      goto fail;
    }
    if (!is_date(from)) {
      snprintf(err, cap, "rates[%zu].from must be a date YYYY-MM-DD", i);
      goto fail;
    }
    if (rate_amount(e, "input", i, &r->input, true, &has, err, cap) ||
        rate_amount(e, "output", i, &r->output, true, &has, err, cap) ||
        rate_amount(e, "cachedInput", i, &r->cached, false, &r->has_cached, err, cap))
      goto fail;
    r->provider = provider && *provider && strcmp(provider, "*") != 0 ? strdup(provider) : NULL;
    r->model = strdup(model);
    memcpy(r->from, from, 11);
    p->n++;
    if (!r->model || (provider && *provider && strcmp(provider, "*") != 0 && !r->provider))
      goto oom;
    for (size_t k = 0; k + 1 < p->n; k++) {
      const rate *o = &p->rates[k];
      if (strcmp(o->model, r->model) == 0 && strcmp(o->from, r->from) == 0 &&
          ((!o->provider && !r->provider) ||
           (o->provider && r->provider && !strcmp(o->provider, r->provider)))) {
        snprintf(err, cap, "rates[%zu] repeats rates[%zu] (the same provider, model and date)", i, k);
        goto fail;
      }
    }
  }
  json_decref(doc);
  return p;
oom:
  snprintf(err, cap, "out of memory");
fail:
  json_decref(doc);
  ah__prices_free(p);
  return NULL;
}

ah_prices *ah__prices_load(const char *path, char *err, size_t cap) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, cap, "cannot open the price table %s: %s", path, strerror(errno));
    return NULL;
  }
  char *buf = NULL;
  size_t len = 0;
  int rc = ah__read_all(f, (size_t)64 << 20, &buf, &len);
  fclose(f);
  if (rc) {
    if (rc == AH_E2BIG)
      snprintf(err, cap, "the price table %s is larger than 64 MiB", path);
    else if (rc == AH_EIO)
      snprintf(err, cap, "cannot read the price table %s", path);
    else
      snprintf(err, cap, "out of memory");
    return NULL;
  }
  char why[200];
  ah_prices *p = ah__prices_parse(buf, len, why, sizeof why);
  free(buf);
  if (!p)
    snprintf(err, cap, "the price table %s: %s", path, why);
  return p;
}

const char *ah__prices_currency(const ah_prices *p) {
  return p ? p->currency : NULL;
}

const char *ah__prices_name(const ah_prices *p) {
  return p ? p->name : NULL;
}

static const rate *find_rate(const ah_prices *p, const char *provider, const char *model, const char *date) {
  const rate *best = NULL;
  for (size_t i = 0; i < p->n; i++) {
    const rate *r = &p->rates[i];
    if (strcmp(r->model, model) != 0 || strcmp(r->from, date) > 0)
      continue;
    if (r->provider && (!provider || strcmp(r->provider, provider) != 0))
      continue;
    int c = best ? strcmp(r->from, best->from) : 1;
    if (c > 0 || (c == 0 && r->provider && !best->provider))
      best = r;
  }
  return best;
}

static void unpriced(ah_cost *c, const ah_tokens *t, const char *why) {
  ah__tokens_add(&c->unpriced, t);
  c->unpriced_items++;
  if (!c->why[0])
    snprintf(c->why, sizeof c->why, "%s", why);
}

bool ah__cost_add(ah_cost *c, const ah_prices *p, const char *provider, const char *model, const char *date,
                  const ah_tokens *t) {
  char day[11] = "";
  char why[160];
  if (date && strlen(date) >= 10) {
    memcpy(day, date, 10);
    day[10] = '\0';
  }
  if (!p) {
    unpriced(c, t, "no price table");
    return false;
  }
  if (!model || !*model) {
    unpriced(c, t, "usage not attributed to one model");
    return false;
  }
  if (!is_date(day)) {
    unpriced(c, t, "usage without a date");
    return false;
  }
  const rate *r = find_rate(p, provider, model, day);
  if (!r) {
    snprintf(why, sizeof why, "no rate for %.40s/%.60s on %s", provider ? provider : "?", model, day);
    unpriced(c, t, why);
    return false;
  }
  if (t->cached > 0 && !r->has_cached) {
    snprintf(why, sizeof why, "no cached-input rate for %.60s on %s", model, day);
    unpriced(c, t, why);
    return false;
  }
  /* tokens × (10^-12 per 10^6 tokens) = 10^-18 units */
  ah_amount a = (ah_amount)(uint64_t)(t->input - t->cached) * (uint64_t)r->input +
                (ah_amount)(uint64_t)t->cached * (uint64_t)r->cached +
                (ah_amount)(uint64_t)t->output * (uint64_t)r->output;
  c->amount += a;
  ah__tokens_add(&c->priced, t);
  return true;
}

json_t *ah__cost_json(const ah_cost *c, const ah_prices *p) {
  char amount[80];
  ah__amount_format(c->amount, amount, sizeof amount);
  json_t *o = json_pack("{s:s?, s:s, s:s?, s:o}", "currency", ah__prices_currency(p), "amount", amount,
                        "prices", ah__prices_name(p), "priced", ah__tokens_json(&c->priced));
  if (c->unpriced_items) {
    json_object_set_new(o, "unpriced", ah__tokens_json(&c->unpriced));
    json_object_set_new(o, "unpricedItems", json_integer((json_int_t)c->unpriced_items));
    json_object_set_new(o, "unpricedWhy", json_string(c->why));
  }
  return o;
}

/* ---- trees ----------------------------------------------------------------------------------------------
 */

static bool below(const char *const *ids, const char *const *parents, size_t n, size_t i, const char *root) {
  /* Walk up from i; at most n steps (a cycle ends the walk). */
  const char *cur = ids[i];
  for (size_t step = 0; step <= n && cur; step++) {
    if (strcmp(cur, root) == 0)
      return true;
    const char *up = NULL;
    for (size_t k = 0; k < n; k++)
      if (strcmp(ids[k], cur) == 0) {
        up = parents[k];
        break;
      }
    cur = up;
  }
  return false;
}

size_t ah__usage_tree(const char *const *ids, const char *const *parents, const ah_tokens *own, size_t n,
                      const char *root, ah_tokens *out) {
  memset(out, 0, sizeof *out);
  size_t counted = 0;
  for (size_t i = 0; i < n; i++) {
    bool seen = false;
    for (size_t k = 0; k < i && !seen; k++)
      seen = strcmp(ids[k], ids[i]) == 0;
    if (seen || !below(ids, parents, n, i, root))
      continue;
    ah__tokens_add(out, &own[i]);
    counted++;
  }
  return counted;
}
