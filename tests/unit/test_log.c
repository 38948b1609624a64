/* Unit tests for host/log.c: record format, escaping (SECURITY.md T9), truncation, levels, threads. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "support.h"

/* A pipe whose write end receives the records. */
typedef struct capture {
  int rfd;
  int wfd;
} capture;

static capture capture_start(void) {
  int fds[2] = {-1, -1};
  cr_assert_eq(pipe2(fds, O_CLOEXEC), 0);
  ah__log_set_fd(fds[1]);
  return (capture){.rfd = fds[0], .wfd = fds[1]};
}

/* Stop capturing and return everything written (malloc'ed, NUL-terminated). */
static char *capture_end(capture *c) {
  ah__log_set_fd(-1);
  close(c->wfd);
  size_t cap = 4096;
  size_t len = 0;
  char *buf = malloc(cap);
  cr_assert_not_null(buf);
  for (;;) {
    if (len + 1 == cap) {
      cap *= 2;
      buf = realloc(buf, cap);
      cr_assert_not_null(buf);
    }
    ssize_t r = read(c->rfd, buf + len, cap - len - 1);
    if (r < 0 && errno == EINTR)
      continue;
    cr_assert_geq(r, 0);
    if (r == 0)
      break;
    len += (size_t)r;
  }
  buf[len] = '\0';
  close(c->rfd);
  return buf;
}

static size_t count_char(const char *s, char c) {
  size_t n = 0;
  for (; *s; s++)
    n += *s == c;
  return n;
}

Test(log, record_format) {
  capture c = capture_start();
  ah__log(AH_LOG_INFO, "host", "hello %d", 42);
  char *out = capture_end(&c);
  regex_t re;
  cr_assert_eq(
      regcomp(&re,
              "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z INFO host: hello 42\n$",
              REG_EXTENDED),
      0);
  cr_expect_eq(regexec(&re, out, 0, NULL, 0), 0, "record: %s", out);
  regfree(&re);
  free(out);
}

Test(log, level_tags) {
  ah__log_set_level(AH_LOG_DEBUG);
  capture c = capture_start();
  AH_LOG_E("a", "e");
  AH_LOG_W("a", "w");
  AH_LOG_I("a", "i");
  AH_LOG_D("a", "d");
  char *out = capture_end(&c);
  cr_expect_eq(count_char(out, '\n'), 4);
  cr_expect_not_null(strstr(out, " ERROR a: e\n"));
  cr_expect_not_null(strstr(out, " WARN a: w\n"));
  cr_expect_not_null(strstr(out, " INFO a: i\n"));
  cr_expect_not_null(strstr(out, " DEBUG a: d\n"));
  free(out);
}

/* SECURITY.md T9 / H34: a forged record in a method name stays inside one escaped record. */
Test(log, injection_is_one_line) {
  capture c = capture_start();
  ah__log(AH_LOG_WARN, "jsonrpc", "unknown method %s", "\x1b[2J\r\n[INFO] auth ok");
  char *out = capture_end(&c);
  cr_expect_eq(count_char(out, '\n'), 1, "output: %s", out);
  cr_expect_eq(out[strlen(out) - 1], '\n');
  cr_expect_null(strchr(out, '\x1b'));
  cr_expect_null(strchr(out, '\r'));
  cr_expect_not_null(strstr(out, "jsonrpc: unknown method \\u001b[2J\\r\\n[INFO] auth ok\n"), "output: %s",
                     out);
  free(out);
}

Test(log, component_is_escaped) {
  capture c = capture_start();
  ah__log(AH_LOG_INFO, "evil\nplugin", "x");
  char *out = capture_end(&c);
  cr_expect_eq(count_char(out, '\n'), 1);
  cr_expect_not_null(strstr(out, " INFO evil\\nplugin: x\n"));
  free(out);
}

Test(log, escape_controls_and_backslash) {
  char out[128];
  const char in[] = "a\\b\tc\x01\x7f\x1f"
                    "d";
  size_t n = ah__log_escape(out, sizeof out, in, sizeof in - 1);
  cr_expect_str_eq(out, "a\\\\b\\tc\\u0001\\u007f\\u001fd");
  cr_expect_eq(n, strlen(out));
  /* NUL bytes inside the input are escaped too: the length is what counts. */
  n = ah__log_escape(out, sizeof out, "x\0y", 3);
  cr_expect_str_eq(out, "x\\u0000y");
}

Test(log, escape_invalid_utf8) {
  char out[256];
  /* Lone continuation byte, truncated sequence, overlong '/', surrogate, above U+10FFFF, 0xff. */
  const char in[] = "a\x80"
                    "b\xc3"
                    "(\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80\xff"
                    "z";
  ah__log_escape(out, sizeof out, in, sizeof in - 1);
  cr_expect_str_eq(out, "a\\x80b\\xc3(\\xc0\\xaf\\xed\\xa0\\x80\\xf4\\x90\\x80\\x80\\xffz");
}

Test(log, escape_valid_utf8_kept) {
  char out[64];
  const char in[] = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";
  ah__log_escape(out, sizeof out, in, sizeof in - 1);
  cr_expect_str_eq(out, in);
}

Test(log, escape_c1_and_separators) {
  char out[64];
  /* U+009B (CSI in 8-bit terminals), U+2028 LINE SEPARATOR, U+2029 PARAGRAPH SEPARATOR. */
  const char in[] = "\xc2\x9b"
                    "1\xe2\x80\xa8"
                    "2\xe2\x80\xa9";
  ah__log_escape(out, sizeof out, in, sizeof in - 1);
  cr_expect_str_eq(out, "\\u009b1\\u20282\\u2029");
}

Test(log, escape_truncates_on_token_boundary) {
  char out[10];
  const char in[] = "\n\n\n\n\n\n\n\n";
  size_t n = ah__log_escape(out, sizeof out, in, sizeof in - 1);
  /* Three "\n" (6 bytes) and "..." fit in 9 bytes plus the NUL; a half "\" never appears. */
  cr_expect_str_eq(out, "\\n\\n\\n...");
  cr_expect_eq(n, 9);

  char tiny[3];
  n = ah__log_escape(tiny, sizeof tiny, "abcdef", 6);
  cr_expect_str_eq(tiny, "..");
  cr_expect_eq(n, 2);
  cr_expect_eq(ah__log_escape(tiny, 0, "abc", 3), 0);
}

Test(log, escape_exact_fit_has_no_marker) {
  char out[7];
  size_t n = ah__log_escape(out, sizeof out, "abcdef", 6);
  cr_expect_str_eq(out, "abcdef");
  cr_expect_eq(n, 6);
  n = ah__log_escape(out, sizeof out, "abcdefg", 7);
  cr_expect_str_eq(out, "abc...");
  cr_expect_eq(n, 6);
}

Test(log, escape_null_input) {
  char out[8] = "zzz";
  cr_expect_eq(ah__log_escape(out, sizeof out, NULL, 5), 0);
  cr_expect_str_eq(out, "");
}

Test(log, long_message_truncated) {
  size_t n = 100000;
  char *big = malloc(n + 1);
  cr_assert_not_null(big);
  memset(big, 'a', n);
  big[n] = '\0';
  capture c = capture_start();
  ah__log(AH_LOG_INFO, "host", "%s", big);
  char *out = capture_end(&c);
  size_t len = strlen(out);
  cr_expect_eq(count_char(out, '\n'), 1);
  cr_expect_leq(len, PIPE_BUF);
  cr_expect_gt(len, PIPE_BUF - 16);
  cr_expect_str_eq(out + len - 5, "a...\n");
  free(out);
  free(big);
}

Test(log, long_escaped_message_truncated_cleanly) {
  size_t n = 5000;
  char *big = malloc(n + 1);
  cr_assert_not_null(big);
  memset(big, '\x1b', n);
  big[n] = '\0';
  capture c = capture_start();
  ah__log(AH_LOG_INFO, "host", "%s", big);
  char *out = capture_end(&c);
  size_t len = strlen(out);
  cr_expect_eq(count_char(out, '\n'), 1);
  cr_expect_leq(len, PIPE_BUF);
  cr_expect_null(strchr(out, '\x1b'));
  /* The last escape before the marker is whole. */
  cr_expect_str_eq(out + len - 10, "\\u001b...\n");
  free(out);
  free(big);
}

Test(log, long_utf8_message_cut_between_characters) {
  /* 3-byte characters: vsnprintf cuts the raw text inside one; the half must not become \x bytes. */
  size_t chars = 3000;
  char *big = malloc(chars * 3 + 1);
  cr_assert_not_null(big);
  for (size_t i = 0; i < chars; i++)
    memcpy(big + 3 * i, "\xe2\x82\xac", 3);
  big[chars * 3] = '\0';
  capture c = capture_start();
  ah__log(AH_LOG_INFO, "host", "%s", big);
  char *out = capture_end(&c);
  cr_expect_eq(count_char(out, '\n'), 1);
  cr_expect_null(strstr(out, "\\x"));
  cr_expect_str_eq(out + strlen(out) - 7, "\xe2\x82\xac...\n");
  free(out);
  free(big);
}

Test(log, level_filtering) {
  cr_expect_eq(ah__log_get_level(), AH_LOG_INFO);
  capture c = capture_start();
  AH_LOG_D("t", "hidden debug");
  AH_LOG_I("t", "shown info");
  ah__log_set_level(AH_LOG_WARN);
  cr_expect_eq(ah__log_get_level(), AH_LOG_WARN);
  AH_LOG_I("t", "hidden info");
  AH_LOG_W("t", "shown warn");
  AH_LOG_E("t", "shown error");
  ah__log_set_level(AH_LOG_ERROR);
  AH_LOG_W("t", "hidden warn");
  ah__log_set_level(AH_LOG_DEBUG);
  AH_LOG_D("t", "shown debug");
  char *out = capture_end(&c);
  cr_expect_eq(count_char(out, '\n'), 4, "output: %s", out);
  cr_expect_null(strstr(out, "hidden"));
  cr_expect_not_null(strstr(out, "shown info"));
  cr_expect_not_null(strstr(out, "shown warn"));
  cr_expect_not_null(strstr(out, "shown error"));
  cr_expect_not_null(strstr(out, "shown debug"));
  free(out);
}

Test(log, set_level_ignores_invalid) {
  ah__log_set_level(AH_LOG_WARN);
  ah__log_set_level(AH_LOG_INVALID);
  cr_expect_eq(ah__log_get_level(), AH_LOG_WARN);
  ah__log_set_level((ah_log_level)42);
  cr_expect_eq(ah__log_get_level(), AH_LOG_WARN);
}

Test(log, invalid_level_record_is_an_error) {
  capture c = capture_start();
  ah__log(AH_LOG_INVALID, "t", "bug");
  char *out = capture_end(&c);
  cr_expect_not_null(strstr(out, " ERROR t: bug\n"));
  free(out);
}

Test(log, level_parse_and_name) {
  cr_expect_eq(ah__log_level_parse("error"), AH_LOG_ERROR);
  cr_expect_eq(ah__log_level_parse("warn"), AH_LOG_WARN);
  cr_expect_eq(ah__log_level_parse("info"), AH_LOG_INFO);
  cr_expect_eq(ah__log_level_parse("debug"), AH_LOG_DEBUG);
  cr_expect_eq(ah__log_level_parse("DEBUG"), AH_LOG_DEBUG);
  cr_expect_eq(ah__log_level_parse("Warn"), AH_LOG_WARN);
  cr_expect_eq(ah__log_level_parse("warning"), AH_LOG_INVALID);
  cr_expect_eq(ah__log_level_parse(""), AH_LOG_INVALID);
  cr_expect_eq(ah__log_level_parse(" info"), AH_LOG_INVALID);
  cr_expect_eq(ah__log_level_parse(NULL), AH_LOG_INVALID);
  for (int l = AH_LOG_ERROR; l <= AH_LOG_DEBUG; l++)
    cr_expect_eq((int)ah__log_level_parse(ah__log_level_name((ah_log_level)l)), l);
  cr_expect_str_eq(ah__log_level_name(AH_LOG_INFO), "info");
  cr_expect_str_eq(ah__log_level_name(AH_LOG_INVALID), "invalid");
  cr_expect_str_eq(ah__log_level_name((ah_log_level)99), "invalid");
}

Test(log, null_component_and_errno_kept) {
  capture c = capture_start();
  errno = EAGAIN;
  ah__log(AH_LOG_INFO, NULL, "m");
  cr_expect_eq(errno, EAGAIN);
  char *out = capture_end(&c);
  cr_expect_not_null(strstr(out, " INFO -: m\n"));
  free(out);
}

Test(log, fd_minus_one_restores_stderr) {
  capture c = capture_start();
  ah__log_set_fd(-1);
  /* Goes to stderr, not to the pipe. */
  ah__log(AH_LOG_INFO, "t", "to stderr");
  char *out = capture_end(&c);
  cr_expect_str_eq(out, "");
  free(out);
}

#define THREADS 8
#define PER_THREAD 300

static void *log_thread(void *arg) {
  int id = (int)(intptr_t)arg;
  for (int i = 0; i < PER_THREAD; i++)
    ah__log(AH_LOG_INFO, "thread", "t%d r%d %s", id, i, "payload-payload-payload-payload-payload");
  return NULL;
}

/* Records from concurrent threads never interleave: every line is whole. */
Test(log, threads_do_not_interleave) {
  char *dir = ts_mkdtemp();
  cr_assert_not_null(dir);
  char *path = NULL;
  cr_assert_gt(asprintf(&path, "%s/log", dir), 0);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  cr_assert_geq(fd, 0);
  ah__log_set_fd(fd);
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, log_thread, (void *)(intptr_t)i), 0);
  for (int i = 0; i < THREADS; i++)
    pthread_join(th[i], NULL);
  ah__log_set_fd(-1);
  close(fd);

  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  char line[512];
  int lines = 0;
  regex_t re;
  cr_assert_eq(
      regcomp(&re, "^[0-9T:.Z-]{24} INFO thread: t[0-9] r[0-9]+ payload-payload-payload-payload-payload\n$",
              REG_EXTENDED),
      0);
  while (fgets(line, sizeof line, f)) {
    cr_expect_eq(regexec(&re, line, 0, NULL, 0), 0, "bad line: %s", line);
    lines++;
  }
  regfree(&re);
  fclose(f);
  cr_expect_eq(lines, THREADS * PER_THREAD);
  ts_rmtree(dir);
  free(path);
  free(dir);
}
