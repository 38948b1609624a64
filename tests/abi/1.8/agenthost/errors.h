/* agenthost — error codes shared by the host and its plugins.
 *
 * Every fallible function of the host and of the plugin API returns 0 on success or one of the negative
 * codes below. The table is the only place a code is defined: its name, its value, the wire category a
 * surface reports for it (DECISIONS.md, "Categories") and a human message.
 *
 * The helpers are static inline so that a plugin needs no link-time dependency on the host.
 */
#ifndef AGENTHOST_ERRORS_H
#define AGENTHOST_ERRORS_H

/* XX(NAME, value, wire category, message) */
#define AH_ERRNO_MAP(XX)                                                 \
  XX(EINVAL, -1, "bad-request", "invalid argument")                      \
  XX(ENOMEM, -2, "internal", "out of memory")                            \
  XX(ESTATE, -3, "internal", "not allowed in this lifecycle state")      \
  XX(EEXIST, -4, "bad-request", "already exists")                        \
  XX(ENOENT, -5, "not-found", "not found")                               \
  XX(ENOMETHOD, -6, "not-found", "no such method")                       \
  XX(EUNAVAILABLE, -7, "unavailable", "withdrawn or unavailable")        \
  XX(ECANCELED, -8, "cancelled", "cancelled")                            \
  XX(EBUSY, -9, "unavailable", "busy")                                   \
  XX(EAGENTBUSY, -10, "agent-busy", "agent is owned by another process") \
  XX(EPERM, -11, "forbidden", "not permitted for this caller")           \
  XX(EUNAUTH, -12, "unauthorized", "not authenticated")                  \
  XX(ETIMEDOUT, -13, "timeout", "timed out")                             \
  XX(EABI, -14, "internal", "incompatible plugin ABI")                   \
  XX(EIO, -15, "internal", "input/output error")                         \
  XX(EPROTO, -16, "bad-request", "protocol error")                       \
  XX(E2BIG, -17, "bad-request", "too large")                             \
  XX(ECLOSED, -18, "unavailable", "closed")                              \
  XX(ELOAD, -19, "internal", "cannot load module")                       \
  XX(ECONFIG, -20, "bad-request", "invalid configuration")               \
  XX(EINTERNAL, -21, "internal", "internal error")

typedef enum ah_errno {
#define AH__ERR_ENUM(name, value, category, message) AH_##name = (value),
  AH_ERRNO_MAP(AH__ERR_ENUM)
#undef AH__ERR_ENUM
} ah_errno;

/* The message for `code` ("unknown error" for a code not in the table, "success" for 0). Static storage. */
static inline const char *ah_strerror(int code) {
  switch (code) {
  case 0:
    return "success";
#define AH__ERR_MSG(name, value, category, message) \
  case (value):                                     \
    return message;
    AH_ERRNO_MAP(AH__ERR_MSG)
#undef AH__ERR_MSG
  default:
    return "unknown error";
  }
}

/* The symbolic name of `code` without the AH_ prefix ("EINVAL"); "OK" for 0, "EUNKNOWN" otherwise. */
static inline const char *ah_err_name(int code) {
  switch (code) {
  case 0:
    return "OK";
#define AH__ERR_NAME(name, value, category, message) \
  case (value):                                      \
    return #name;
    AH_ERRNO_MAP(AH__ERR_NAME)
#undef AH__ERR_NAME
  default:
    return "EUNKNOWN";
  }
}

/* The wire category a surface reports for `code` ("internal" for an unknown code). */
static inline const char *ah_err_category(int code) {
  switch (code) {
#define AH__ERR_CAT(name, value, category, message) \
  case (value):                                     \
    return category;
    AH_ERRNO_MAP(AH__ERR_CAT)
#undef AH__ERR_CAT
  default:
    return "internal";
  }
}

/* The JSON-RPC error code a stdio or admin surface sends for `code`: -32601 for AH_ENOMETHOD, -32602 for
 * AH_EINVAL, -32603 for AH_EINTERNAL, else -32000 + code (implementation-defined server errors, e.g.
 * AH_EUNAVAILABLE → -32007). The error's data carries {"category", "name"} so clients need no table. */
static inline int ah_err_rpc_code(int code) {
  switch (code) {
  case AH_ENOMETHOD:
    return -32601;
  case AH_EINVAL:
    return -32602;
  case AH_EINTERNAL:
    return -32603;
  default:
    return -32000 + code;
  }
}

#endif
