/* agenthost — the host's logger (internal).
 *
 * One record per call, one line on stderr: "<RFC 3339 UTC ms> <LEVEL> <component>: <message>".
 * The formatted message is escaped before it is written (SECURITY.md T9): every byte < 0x20, 0x7f and
 * backslash become \n, \r, \t, \\ or \u00XX, and invalid UTF-8 bytes become \xXX, so one call always
 * produces exactly one line and no terminal escape reaches the operator. Values of secrets are never passed
 * to the logger.
 *
 * Thread-safe: a record is written with one write(2).
 */
#ifndef AGENTHOST_HOST_LOG_H
#define AGENTHOST_HOST_LOG_H

#include <stdarg.h>
#include <stddef.h>

typedef enum ah_log_level {
  AH_LOG_INVALID = 0,
  AH_LOG_ERROR,
  AH_LOG_WARN,
  AH_LOG_INFO,
  AH_LOG_DEBUG,
} ah_log_level;

/* Parse "error" | "warn" | "info" | "debug" (case-insensitive). Returns AH_LOG_INVALID otherwise. */
ah_log_level ah__log_level_parse(const char *s);
const char *ah__log_level_name(ah_log_level level);

/* Records above `level` are dropped. Default AH_LOG_INFO. */
void ah__log_set_level(ah_log_level level);
ah_log_level ah__log_get_level(void);

/* Send records to `fd` instead of stderr (tests); -1 restores stderr. */
void ah__log_set_fd(int fd);

void ah__log(ah_log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ah__logv(ah_log_level level, const char *component, const char *fmt, va_list ap);

/* Escape `in` (length `n`) into `out` (capacity `cap`, always NUL-terminated) by the rules above.
 * Returns the length written (truncated with "..." when `cap` is too small). */
size_t ah__log_escape(char *out, size_t cap, const char *in, size_t n);

#define AH_LOG_E(comp, ...) ah__log(AH_LOG_ERROR, comp, __VA_ARGS__)
#define AH_LOG_W(comp, ...) ah__log(AH_LOG_WARN, comp, __VA_ARGS__)
#define AH_LOG_I(comp, ...) ah__log(AH_LOG_INFO, comp, __VA_ARGS__)
#define AH_LOG_D(comp, ...) ah__log(AH_LOG_DEBUG, comp, __VA_ARGS__)

#endif
