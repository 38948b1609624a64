/* agenthost — the store's operations (internal to the backends): what each operation of an opset must hold
 * (store.h lists them), checked once here for every backend, and the fields session.update may set. */
#ifndef AGENTHOST_HOST_STORE_OPS_H
#define AGENTHOST_HOST_STORE_OPS_H

#include <jansson.h>
#include <stddef.h>

typedef enum ah_store_op {
  AH_OP_INVALID = 0,
  AH_OP_NOTIFY,
  AH_OP_FENCE,
  AH_OP_EVENT,
  AH_OP_SESSION_PUT,
  AH_OP_SESSION_UPDATE,
  AH_OP_SESSION_DELETE,
  AH_OP_INBOX_PUT,
  AH_OP_INBOX_STATE,
  AH_OP_REQUEST_PUT,
  AH_OP_REQUEST_STATE,
  AH_OP_LEASE,
  AH_OP_LEASE_RELEASE,
  AH_OP_LEASE_RENEW,
  AH_OP_LEASE_END,
  AH_OP_STORE_SHRINK,
} ah_store_op;

/* Which operation `op` is, once its fields are checked: its kind, or AH_OP_INVALID with `err` (at most `cap`
 * bytes) saying what is wrong. A backend's operations may rely on every check made here. */
ah_store_op ah__store_op_check(const json_t *op, char *err, size_t cap);

/* The fields session.update may set: their key, column (quoted where a word of SQL) and kind. */
typedef enum ah_store_col {
  AH_COL_TEXT = 1, /* string or null */
  AH_COL_BOOL,     /* true/false */
  AH_COL_INT,      /* integer */
  AH_COL_VALUE,    /* any scalar, kept as written (times) */
  AH_COL_JSON,     /* any JSON but null, stored as text */
} ah_store_col;

typedef struct ah_store_update_col {
  const char *key;
  const char *column;
  ah_store_col kind;
} ah_store_update_col;

/* The column of session.update's field `key`, or NULL (the check refused any other). */
const ah_store_update_col *ah__store_update_col(const char *key);

#endif
