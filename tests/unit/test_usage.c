/* Usage and cost arithmetic (host/usage.c): disjoint classes, trees counted once, dated rates, unpriced
 * usage, exact fixed-point totals. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "usage.h"

static const char table[] =
    "{\"version\":1, \"name\":\"test-2026\", \"currency\":\"USD\", \"rates\":["
    "{\"provider\":\"local\",\"model\":\"m1\",\"from\":\"2026-01-01\","
    "\"input\":\"2.50\",\"cachedInput\":\"1.25\",\"output\":\"10\"},"
    "{\"provider\":\"local\",\"model\":\"m1\",\"from\":\"2026-04-01\","
    "\"input\":\"3\",\"cachedInput\":\"0.3\",\"output\":\"12.000000000001\"},"
    "{\"model\":\"m2\",\"from\":\"2026-01-01\",\"input\":\"0.1\",\"output\":\"0.4\"}]}";

static ah_prices *prices(void) {
  char err[200] = "";
  ah_prices *p = ah__prices_parse(table, strlen(table), err, sizeof err);
  cr_assert_not_null(p, "%s", err);
  return p;
}

static const char *amount(const ah_cost *c) {
  static char buf[80];
  ah__amount_format(c->amount, buf, sizeof buf);
  return buf;
}

Test(usage, classes_are_disjoint_cached_and_reasoning_not_charged_twice) {
  ah_prices *p = prices();
  ah_cost c = {0};
  /* 1M input of which 400k cached, 1M output of which 600k reasoning:
   * 600k × 2.50 + 400k × 1.25 + 1M × 10 (reasoning is in the output, once) = 1.5 + 0.5 + 10 = 12 */
  ah_tokens t = {.input = 1000000, .cached = 400000, .output = 1000000, .reasoning = 600000, .requests = 2};
  cr_assert(ah__cost_add(&c, p, "local", "m1", "2026-02-10T10:00:00.000Z", &t));
  cr_assert_str_eq(amount(&c), "12");
  cr_assert_eq(c.priced.reasoning, 600000);
  cr_assert_eq(c.unpriced_items, 0);
  ah__prices_free(p);
}

Test(usage, a_rate_change_applies_from_its_date) {
  ah_prices *p = prices();
  ah_cost before = {0}, on = {0};
  ah_tokens t = {.input = 1000000, .output = 1000000};
  cr_assert(ah__cost_add(&before, p, "local", "m1", "2026-03-31T23:59:59.999Z", &t));
  cr_assert(ah__cost_add(&on, p, "local", "m1", "2026-04-01T00:00:00.000Z", &t));
  cr_assert_str_eq(amount(&before), "12.5");
  cr_assert_str_eq(amount(&on), "15.000000000001");
  /* before the first entry: no rate */
  ah_cost early = {0};
  cr_assert_not(ah__cost_add(&early, p, "local", "m1", "2025-12-31T12:00:00Z", &t));
  cr_assert_eq(early.unpriced_items, 1);
  cr_assert_eq(early.unpriced.input, 1000000);
  ah__prices_free(p);
}

Test(usage, missing_rate_or_model_stays_unpriced) {
  ah_prices *p = prices();
  ah_cost c = {0};
  ah_tokens t = {.input = 10, .output = 5, .requests = 1};
  cr_assert_not(ah__cost_add(&c, p, "local", "unknown-model", "2026-02-01", &t));
  cr_assert(strstr(c.why, "no rate for local/unknown-model on 2026-02-01"), "%s", c.why);
  cr_assert_not(ah__cost_add(&c, p, "local", NULL, "2026-02-01", &t)); /* mixed models: not attributed */
  cr_assert_not(ah__cost_add(&c, p, "other", "m1", "2026-02-01", &t)); /* m1's rates are local's only */
  ah_tokens cached = {.input = 10, .cached = 4, .output = 5};
  cr_assert_not(ah__cost_add(&c, p, "x", "m2", "2026-02-01", &cached)); /* m2 has no cached rate */
  cr_assert_not(ah__cost_add(&c, NULL, "local", "m1", "2026-02-01", &t));
  cr_assert_eq(c.unpriced_items, 5);
  cr_assert_eq(c.unpriced.input, 50);
  cr_assert_str_eq(amount(&c), "0");
  /* m2 is anyone's (no provider) */
  cr_assert(ah__cost_add(&c, p, "x", "m2", "2026-02-01", &t));
  cr_assert_str_eq(amount(&c), "0.000003"); /* 10 × 0.1/1M + 5 × 0.4/1M */
  json_t *j = ah__cost_json(&c, p);
  cr_assert_str_eq(json_string_value(json_object_get(j, "amount")), "0.000003");
  cr_assert_str_eq(json_string_value(json_object_get(j, "prices")), "test-2026");
  cr_assert_eq(json_integer_value(json_object_get(j, "unpricedItems")), 5);
  json_decref(j);
  ah__prices_free(p);
}

Test(usage, totals_are_exact_to_the_last_digit_for_large_counts) {
  ah_prices *p = prices();
  ah_cost c = {0};
  /* 10^6 increments of 2^40 output tokens at 12.000000000001 per million: exactly
   * 2^40 × 10^6 × 12.000000000001 / 10^6 = 1099511627776 × 12.000000000001 */
  ah_tokens t = {.output = (int64_t)1 << 40};
  for (int i = 0; i < 1000000; i++)
    ah__cost_add(&c, p, "local", "m1", "2026-05-01", &t);
  /* 1099511627776 × 12 = 13194139533312; 1099511627776 × 0.000000000001 = 1.099511627776 */
  cr_assert_str_eq(amount(&c), "13194139533313.099511627776");
  cr_assert_eq(c.priced.output, ((int64_t)1 << 40) * 1000000);
  ah__prices_free(p);
}

Test(usage, a_tree_counts_each_child_once_under_its_parent) {
  const char *ids[] = {"root", "a", "b", "a1", "other", "a"};
  const char *parents[] = {NULL, "root", "root", "a", NULL, "root"}; /* "a" repeated (seen twice) */
  ah_tokens own[] = {{.input = 1},    {.input = 10},    {.input = 100},
                     {.input = 1000}, {.input = 10000}, {.input = 10}};
  ah_tokens sum;
  cr_assert_eq(ah__usage_tree(ids, parents, own, 6, "root", &sum), 4);
  cr_assert_eq(sum.input, 1111);
  cr_assert_eq(ah__usage_tree(ids, parents, own, 6, "a", &sum), 2);
  cr_assert_eq(sum.input, 1010);
  cr_assert_eq(ah__usage_tree(ids, parents, own, 6, "nobody", &sum), 0);
  /* a cycle is not followed forever */
  const char *cids[] = {"x", "y"};
  const char *cparents[] = {"y", "x"};
  ah_tokens cown[] = {{.input = 1}, {.input = 2}};
  cr_assert_eq(ah__usage_tree(cids, cparents, cown, 2, "x", &sum), 2);
  cr_assert_eq(sum.input, 3);
}

Test(usage, tokens_from_json_refuse_what_is_not_a_count) {
  ah_tokens t;
  char err[120];
  json_t *good = json_pack("{s:i, s:i, s:i}", "inputTokens", 5, "cachedInputTokens", 2, "outputTokens", 3);
  cr_assert_eq(ah__tokens_from_json(good, &t, err, sizeof err), 0);
  json_decref(good);
  cr_assert_eq(t.input, 5);
  cr_assert_eq(t.cached, 2);
  const char *bad[] = {"{\"inputTokens\":-1}",
                       "{\"inputTokens\":1.5}",
                       "{\"inputTokens\":\"5\"}",
                       "{\"inputTokens\":1,\"cachedInputTokens\":2}",
                       "{\"outputTokens\":1,\"reasoningTokens\":2}",
                       "{\"inputTokens\":9007199254740993}",
                       "[]"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    json_t *j = json_loads(bad[i], JSON_DECODE_ANY, NULL);
    cr_assert_neq(ah__tokens_from_json(j, &t, err, sizeof err), 0, "%s", bad[i]);
    json_decref(j);
  }
}

Test(usage, price_tables_are_checked) {
  const char *bad[][2] = {
      {"{", "not JSON"},
      {"{\"version\":2,\"currency\":\"USD\",\"rates\":[]}", "\"version\" must be 1"},
      {"{\"version\":1,\"currency\":\"dollars\",\"rates\":[]}", "ISO 4217"},
      {"{\"version\":1,\"currency\":\"USD\"}", "\"rates\" must be an array"},
      {"{\"version\":1,\"currency\":\"USD\",\"rates\":[{\"model\":\"m\",\"from\":\"2026-13-01\",\"input\":"
       "\"1\","
       "\"output\":\"1\"}]}",
       "rates[0].from"},
      {"{\"version\":1,\"currency\":\"USD\",\"rates\":[{\"model\":\"m\",\"from\":\"2026-01-01\",\"input\":1."
       "5,"
       "\"output\":\"1\"}]}",
       "rates[0].input must be a decimal string"},
      {"{\"version\":1,\"currency\":\"USD\",\"rates\":[{\"model\":\"m\",\"from\":\"2026-01-01\",\"input\":"
       "\"1e3\","
       "\"output\":\"1\"}]}",
       "rates[0].input"},
      {"{\"version\":1,\"currency\":\"USD\",\"rates\":[{\"model\":\"m\",\"from\":\"2026-01-01\",\"input\":"
       "\"1\"}]}",
       "rates[0].output is missing"},
      {"{\"version\":1,\"currency\":\"USD\",\"rates\":[{\"model\":\"m\",\"from\":\"2026-01-01\",\"input\":"
       "\"1\","
       "\"output\":\"1\"},{\"model\":\"m\",\"from\":\"2026-01-01\",\"input\":\"2\",\"output\":\"1\"}]}",
       "rates[1] repeats rates[0]"},
      {"{\"version\":1,\"currency\":\"USD\",\"currency\":\"EUR\",\"rates\":[]}", "not JSON"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char err[200] = "";
    ah_prices *p = ah__prices_parse(bad[i][0], strlen(bad[i][0]), err, sizeof err);
    cr_assert_null(p, "%s", bad[i][0]);
    cr_assert(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
  }
  int64_t v;
  cr_assert_eq(ah__decimal_parse("0.000000000001", &v), 0);
  cr_assert_eq(v, 1);
  cr_assert_eq(ah__decimal_parse("999999.999999999999", &v), 0);
  cr_assert_neq(ah__decimal_parse("1000000", &v), 0);
  cr_assert_neq(ah__decimal_parse("0.0000000000001", &v), 0);
  cr_assert_neq(ah__decimal_parse("-1", &v), 0);
  cr_assert_neq(ah__decimal_parse(".5", &v), 0);
  cr_assert_neq(ah__decimal_parse("5.", &v), 0);
}
