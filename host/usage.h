/* agenthost — usage and cost arithmetic (internal, pure: no I/O but reading a price table, no clock).
 *
 * One implementation of the counting and pricing rules, used by the sessions engine (totals per session and
 * per tree, the cost a surface shows) and by `agenthost analyze` (the same numbers, offline):
 *
 * - Token classes are disjoint for pricing: `inputTokens` counts every prompt token and `cachedInputTokens`
 *   the part of them read from the provider's cache, so uncached input = input − cached; `outputTokens`
 *   counts every generated token and `reasoningTokens` the part spent reasoning, which is output already and
 *   is never charged a second time.
 * - A session tree's total is each distinct session's own usage counted once: a child's work is in the
 *   child, shown under its parent, never added to the parent's own.
 * - Prices are an explicit input (a price table file, docs/usage.md): per provider and model, rates per
 *   million tokens as decimal strings, each effective from a date. Amounts are exact fixed-point numbers
 *   (10^-18 of the currency unit, 128-bit): never floats. Usage without a matching rate, or whose model is
 *   not attributed (several models in one interval), stays unpriced and is reported as such.
 */
#ifndef AGENTHOST_HOST_USAGE_H
#define AGENTHOST_HOST_USAGE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ah_tokens {
  int64_t input;     /* every prompt token, cached ones included */
  int64_t cached;    /* of input: read from the cache */
  int64_t output;    /* every generated token, reasoning included */
  int64_t reasoning; /* of output: spent reasoning */
  int64_t requests;  /* model round trips */
} ah_tokens;

/* {inputTokens, outputTokens, cachedInputTokens?, reasoningTokens?, requests?}. Missing keys are 0.
 * Returns 0, or -1 with `err` for a value that is not a whole number ≥ 0 (or too large), or a part larger
 * than its whole (cached > input, reasoning > output). */
int ah__tokens_from_json(const json_t *usage, ah_tokens *out, char *err, size_t cap);
json_t *ah__tokens_json(const ah_tokens *t);
/* a += b; returns -1 (a unchanged) when a sum would overflow. */
int ah__tokens_add(ah_tokens *a, const ah_tokens *b);
bool ah__tokens_zero(const ah_tokens *t);

/* ---- exact amounts ---- */

typedef unsigned __int128 ah_amount; /* 10^-18 of the currency unit */

/* A rate or amount written as a decimal string ("2.50", "0.075", "12"): at most 6 integer and 12
 * fractional digits, no sign, no exponent. Sets *out in 10^-12 units. Returns 0 or -1. */
int ah__decimal_parse(const char *s, int64_t *out);
/* An amount as a decimal string without trailing zeros ("0.0123", "0", "15"). */
void ah__amount_format(ah_amount a, char *buf, size_t cap);

/* ---- price tables ---- */

typedef struct ah_prices ah_prices;

/* Parse a price table (JSON, docs/usage.md). Returns the table, or NULL with `err` naming what is wrong
 * (the entry and the key). */
ah_prices *ah__prices_parse(const char *text, size_t len, char *err, size_t cap);
ah_prices *ah__prices_load(const char *path, char *err, size_t cap);
void ah__prices_free(ah_prices *p);
const char *ah__prices_currency(const ah_prices *p);
/* The table's identity as reported beside every cost: its `name`, else "unnamed". */
const char *ah__prices_name(const ah_prices *p);

/* What usage cost, accumulated. */
typedef struct ah_cost {
  ah_amount amount; /* of the priced usage */
  ah_tokens priced; /* the usage that has a price in `amount` */
  ah_tokens unpriced;
  int64_t unpriced_items; /* increments left unpriced */
  char why[160];          /* the first reason something was left unpriced */
} ah_cost;

/* Price one increment of usage of `provider`/`model` that happened on `date` (YYYY-MM-DD, UTC; the first
 * 10 characters of an RFC 3339 time are taken) at the rate in effect that day — the entry with the latest
 * `from` not after it. A NULL or empty model (not attributed), no rate, or cached tokens with no cached
 * rate leave it unpriced. Returns true when it was priced. */
bool ah__cost_add(ah_cost *c, const ah_prices *p, const char *provider, const char *model, const char *date,
                  const ah_tokens *t);
/* The cost of a summary: {currency, amount, prices, priced:{tokens}, unpriced:{tokens}?, unpricedItems?,
 * unpricedWhy?}; amount as a decimal string. */
json_t *ah__cost_json(const ah_cost *c, const ah_prices *p);

/* ---- session trees ---- */

/* A tree's usage: the sum of the own usage of `root` and of every distinct session below it (by parent
 * link), each counted once, whatever the order or repetition of `ids`. `parents[i]` is ids[i]'s parent or
 * NULL. A parent cycle is not followed twice. Returns the number of sessions counted (0: root unknown). */
size_t ah__usage_tree(const char *const *ids, const char *const *parents, const ah_tokens *own, size_t n,
                      const char *root, ah_tokens *out);

#endif
