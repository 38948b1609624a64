/* Unit tests for plugin-api/agenthost/errors.h: the AH_ERRNO_MAP table and its helpers. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <string.h>
#include <uv.h>

#include "agenthost/errors.h"
#include "host_support.h"
#include "support.h"

typedef struct err_row {
  const char *name;
  int value;
  const char *category;
  const char *message;
} err_row;

static const err_row rows[] = {
#define ROW(name, value, category, message) {#name, value, category, message},
    AH_ERRNO_MAP(ROW)
#undef ROW
};
#define NROWS (sizeof rows / sizeof rows[0])

/* DECISIONS.md, the wire categories `CAT`. */
static const char *const categories[] = {"bad-request", "unauthorized", "forbidden",
                                         "not-found",   "unavailable",  "cancelled",
                                         "agent-busy",  "timeout",      "internal"};

static bool known_category(const char *c) {
  for (size_t i = 0; i < sizeof categories / sizeof categories[0]; i++)
    if (strcmp(c, categories[i]) == 0)
      return true;
  return false;
}

/* Every test closes a loop, as STYLE.md asks, although nothing here runs on one. */
static void loop_round_trip(void) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  cr_assert_eq(ts_loop_close(&loop), 0);
  cr_expect_eq(th_leak_check(), 0, "memory leaked (see the LeakSanitizer report)");
}

Test(errors, codes_negative_and_distinct) {
  cr_assert_geq(NROWS, 21u, "the table lost rows: %zu", NROWS);
  for (size_t i = 0; i < NROWS; i++) {
    cr_expect_lt(rows[i].value, 0, "AH_%s = %d is not negative", rows[i].name, rows[i].value);
    for (size_t j = i + 1; j < NROWS; j++) {
      cr_expect_neq(rows[i].value, rows[j].value, "AH_%s and AH_%s share %d", rows[i].name, rows[j].name,
                    rows[i].value);
      cr_expect_str_neq(rows[i].name, rows[j].name, "name %s appears twice", rows[i].name);
    }
  }
  /* The enum carries the table's values. */
  cr_expect_eq(AH_EINVAL, -1);
  cr_expect_eq(AH_EINTERNAL, -21);
  loop_round_trip();
}

Test(errors, helpers_agree_with_table) {
  for (size_t i = 0; i < NROWS; i++) {
    const err_row *r = &rows[i];
    cr_expect_str_eq(ah_strerror(r->value), r->message, "ah_strerror(AH_%s)", r->name);
    cr_expect_str_eq(ah_err_name(r->value), r->name, "ah_err_name(%d)", r->value);
    cr_expect_str_eq(ah_err_category(r->value), r->category, "ah_err_category(AH_%s)", r->name);
    cr_expect(known_category(r->category), "AH_%s has category '%s' outside DECISIONS.md's list", r->name,
              r->category);
    cr_expect_gt(strlen(r->message), 0u, "AH_%s has an empty message", r->name);
    cr_expect_str_neq(r->message, "unknown error", "AH_%s uses the unknown-code message", r->name);
    cr_expect_str_neq(r->name, "EUNKNOWN");
    cr_expect_str_neq(r->name, "OK");
  }
  loop_round_trip();
}

Test(errors, categories_of_key_codes) {
  cr_expect_str_eq(ah_err_category(AH_EINVAL), "bad-request");
  cr_expect_str_eq(ah_err_category(AH_ENOENT), "not-found");
  cr_expect_str_eq(ah_err_category(AH_ENOMETHOD), "not-found");
  cr_expect_str_eq(ah_err_category(AH_EUNAVAILABLE), "unavailable");
  cr_expect_str_eq(ah_err_category(AH_ECANCELED), "cancelled");
  cr_expect_str_eq(ah_err_category(AH_EAGENTBUSY), "agent-busy");
  cr_expect_str_eq(ah_err_category(AH_EPERM), "forbidden");
  cr_expect_str_eq(ah_err_category(AH_EUNAUTH), "unauthorized");
  cr_expect_str_eq(ah_err_category(AH_ETIMEDOUT), "timeout");
  cr_expect_str_eq(ah_err_category(AH_EINTERNAL), "internal");
  loop_round_trip();
}

Test(errors, zero_and_unknown_codes) {
  cr_expect_str_eq(ah_strerror(0), "success");
  cr_expect_str_eq(ah_err_name(0), "OK");
  const int unknown[] = {1, 7, -22, -1000, -32601, 2147483647, -2147483647 - 1};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    cr_expect_str_eq(ah_strerror(unknown[i]), "unknown error", "ah_strerror(%d)", unknown[i]);
    cr_expect_str_eq(ah_err_name(unknown[i]), "EUNKNOWN", "ah_err_name(%d)", unknown[i]);
    cr_expect_str_eq(ah_err_category(unknown[i]), "internal", "ah_err_category(%d)", unknown[i]);
  }
  loop_round_trip();
}

Test(errors, rpc_code_mapping) {
  cr_expect_eq(ah_err_rpc_code(AH_ENOMETHOD), -32601);
  cr_expect_eq(ah_err_rpc_code(AH_EINVAL), -32602);
  cr_expect_eq(ah_err_rpc_code(AH_EINTERNAL), -32603);
  cr_expect_eq(ah_err_rpc_code(AH_EUNAVAILABLE), -32007);
  cr_expect_eq(ah_err_rpc_code(AH_ECANCELED), -32008);
  for (size_t i = 0; i < NROWS; i++) {
    int v = rows[i].value;
    int rpc = ah_err_rpc_code(v);
    if (v == AH_ENOMETHOD || v == AH_EINVAL || v == AH_EINTERNAL)
      continue;
    /* Everything else is an implementation-defined server error, -32000 - |code|, in -32099..-32000. */
    cr_expect_eq(rpc, -32000 + v, "AH_%s → %d", rows[i].name, rpc);
    cr_expect(rpc <= -32000 && rpc >= -32099, "AH_%s → %d outside the server-error range", rows[i].name, rpc);
  }
  /* The JSON-RPC codes are distinct too, so a client can map them back. */
  for (size_t i = 0; i < NROWS; i++)
    for (size_t j = i + 1; j < NROWS; j++)
      cr_expect_neq(ah_err_rpc_code(rows[i].value), ah_err_rpc_code(rows[j].value), "AH_%s and AH_%s collide",
                    rows[i].name, rows[j].name);
  loop_round_trip();
}
