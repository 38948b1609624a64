/* Unit tests for host/tools.c: lexical confinement, the file tools on real directories (symlinks inside
 * and outside the tree, binary and oversize files), run_command (exit codes, streams, the output cap, the
 * timeout, the environment allowlist, cancellation of the whole process group, the cwd, a host that stops
 * under a running command) and the refusal of bad arguments. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "config.h"
#include "host_support.h"
#include "internal.h"
#include "support.h"
#include "tools.h"

/* The userspace walk of tools.c (used when the kernel has no openat2), exercised directly. */
int ah__tool_open_walk(int dirfd, const char *rel, int flags, mode_t mode);

typedef struct fixture {
  uv_loop_t loop;
  ah_host *h;
  char *cwd;     /* realpath of a fresh directory: the session cwd */
  char *outside; /* realpath of another one: must stay unreachable */
} fixture;

static char *real_tmpdir(void) {
  char *d = ts_mkdtemp();
  cr_assert_not_null(d);
  char *r = realpath(d, NULL);
  cr_assert_not_null(r);
  free(d);
  return r;
}

static void fx_up(fixture *f) {
  cr_assert_eq(uv_loop_init(&f->loop), 0);
  f->h = th_host_new(&f->loop, 0);
  cr_assert_not_null(f->h);
  f->cwd = real_tmpdir();
  f->outside = real_tmpdir();
}

static void fx_down(fixture *f) {
  cr_assert_eq(th_host_stop_free(&f->loop, f->h), 0);
  ts_rmtree(f->cwd);
  ts_rmtree(f->outside);
  free(f->cwd);
  free(f->outside);
  cr_expect_eq(th_leak_check(), 0, "memory leaked (see the LeakSanitizer report)");
}

static char *path_in(const char *dir, const char *name) {
  char *p = NULL;
  cr_assert_geq(asprintf(&p, "%s/%s", dir, name), 0);
  return p;
}

typedef struct tres {
  bool done;
  int calls;
  bool is_error;
  json_t *result;
  uint64_t at_ms;
} tres;

static void done_cb(const json_t *result, bool is_error, void *arg) {
  tres *t = arg;
  t->done = true;
  t->calls++;
  t->is_error = is_error;
  json_decref(t->result);
  t->result = result ? json_deep_copy(result) : NULL;
  t->at_ms = ts_now_ms();
}

/* Start a tool; the callback must not have run when ah__tool_run returns. */
static void start_tool(fixture *f, const char *name, const char *args_json, ah_cancel *cancel, tres *t) {
  memset(t, 0, sizeof *t);
  json_error_t err;
  json_t *args = json_loads(args_json, JSON_ALLOW_NUL, &err);
  cr_assert_not_null(args, "bad test JSON %s: %s", args_json, err.text);
  int rc = ah__tool_run(f->h, f->cwd, name, args, cancel, done_cb, t);
  json_decref(args);
  cr_assert_eq(rc, 0, "%s %s refused: %d", name, args_json, rc);
  cr_assert_not(t->done, "the callback ran inside ah__tool_run");
}

static void wait_tool(fixture *f, tres *t, uint64_t timeout_ms) {
  cr_assert(ts_run_until(&f->loop, &t->done, timeout_ms), "no result within %llu ms",
            (unsigned long long)timeout_ms);
  for (int i = 0; i < 5; i++)
    uv_run(&f->loop, UV_RUN_NOWAIT);
  cr_assert_eq(t->calls, 1, "the callback ran %d times", t->calls);
  cr_assert_not_null(t->result);
}

/* Run a tool to completion; returns the result (owned) and sets *is_error. */
static json_t *tool(fixture *f, const char *name, const char *args_json, bool *is_error) {
  tres t;
  start_tool(f, name, args_json, NULL, &t);
  wait_tool(f, &t, 10000);
  *is_error = t.is_error;
  if (t.is_error)
    cr_assert(json_is_string(json_object_get(t.result, "error")), "an error without a message");
  return t.result;
}

static const char *sget(const json_t *o, const char *key) {
  return json_string_value(json_object_get(o, key));
}

/* The error message of a result; never NULL, so that a failing check does not crash the test. */
static const char *errmsg(const json_t *r) {
  const char *s = sget(r, "error");
  return s ? s : "(no error)";
}

/* ---- confinement ----------------------------------------------------------------------------------- */

static void expect_refused(const char *cwd, const char *path) {
  const char *why = NULL;
  char *r = ah__tool_confine(cwd, path, &why);
  cr_expect_null(r, "%s in %s was accepted as %s", path, cwd, r ? r : "");
  cr_expect_not_null(why, "%s in %s: refused without a reason", path, cwd);
  free(r);
}

static void expect_confined(const char *cwd, const char *path, const char *want) {
  const char *why = NULL;
  char *r = ah__tool_confine(cwd, path, &why);
  cr_expect_not_null(r, "%s in %s refused: %s", path, cwd, why ? why : "");
  if (r)
    cr_expect_str_eq(r, want, "%s in %s", path, cwd);
  free(r);
}

Test(tools, confine_cases) {
  expect_refused("/srv/s", "../x");
  expect_refused("/srv/s", "/etc/passwd");
  expect_refused("/srv/s", "a/../../x");
  expect_refused("/srv/s", "");
  expect_refused("/srv/s", NULL);
  expect_refused("/srv/s", "..");
  expect_refused("/srv/s", "/srv/sx/y");     /* a sibling sharing the prefix */
  expect_refused("/srv/s", "/srv/s/../s/x"); /* climbs above the cwd on the way */
  expect_refused("/srv/s", "/srv");
  expect_refused("/srv/s", "/");
  expect_refused("relative", "x");
  expect_refused(NULL, "x");
  expect_refused("/", "../x");
  expect_confined("/srv/s", "/srv/s/inside/f", "/srv/s/inside/f");
  expect_confined("/srv/s", "a/./b//c", "/srv/s/a/b/c");
  expect_confined("/srv/s", ".", "/srv/s");
  expect_confined("/srv/s", "a/..", "/srv/s");
  expect_confined("/srv/s", "a/b/../c/", "/srv/s/a/c");
  expect_confined("/srv/s", "/srv/s", "/srv/s");
  expect_confined("/srv/s", "//srv/./s//x", "/srv/s/x");
  expect_confined("/srv/s/", "x", "/srv/s/x");
  expect_confined("/srv//s/./t/..", "x", "/srv/s/x");
  expect_confined("/", "etc/passwd", "/etc/passwd");
  expect_confined("/", "/", "/");

  /* Over PATH_MAX: the path itself, or the cwd and the path together. */
  char *longp = malloc(PATH_MAX + 10);
  cr_assert_not_null(longp);
  for (size_t i = 0; i < PATH_MAX + 8; i += 2)
    memcpy(longp + i, "a/", 2);
  longp[PATH_MAX + 8] = '\0';
  expect_refused("/srv/s", longp);
  char *longcwd = malloc(4001);
  cr_assert_not_null(longcwd);
  memset(longcwd, 'c', 4000);
  longcwd[0] = '/';
  longcwd[4000] = '\0';
  expect_refused(longcwd, "0123456789/0123456789/0123456789/0123456789/0123456789/0123456789/0123456789/"
                          "0123456789/0123456789/0123456789/0123456789");
  free(longp);
  free(longcwd);
  /* why may be NULL. */
  cr_expect_null(ah__tool_confine("/srv/s", "../x", NULL));
}

Test(tools, describe_known_and_policies) {
  json_t *d = ah__tools_describe();
  cr_assert(json_is_array(d));
  cr_assert_eq(json_array_size(d), 5u);
  const char *names[] = {"read_file", "write_file", "list_dir", "run_command"};
  for (size_t i = 0; i < 4; i++) {
    json_t *t = json_array_get(d, i);
    cr_expect_str_eq(sget(t, "name"), names[i]);
    cr_expect(json_is_string(json_object_get(t, "description")));
    cr_expect(json_is_object(json_object_get(t, "params")));
    cr_expect(ah__tool_exists(NULL, names[i]));
  }
  json_t *rc = json_object_get(json_object_get(json_array_get(d, 3), "params"), "command");
  cr_expect_str_eq(sget(rc, "type"), "string");
  cr_expect(json_is_true(json_object_get(rc, "required")));
  json_t *to = json_object_get(json_object_get(json_array_get(d, 3), "params"), "timeout_ms");
  cr_expect_str_eq(sget(to, "type"), "integer");
  cr_expect(json_is_false(json_object_get(to, "required")));
  json_t *wp = json_object_get(json_array_get(d, 1), "params");
  cr_expect_eq(json_object_size(wp), 2u);
  cr_expect_not_null(json_object_get(wp, "content"));
  /* update_plan's arguments are a JSON Schema of their own. */
  json_t *plan = json_array_get(d, 4);
  cr_expect_str_eq(sget(plan, "name"), "update_plan");
  cr_expect_str_eq(sget(json_object_get(plan, "schema"), "type"), "object");
  cr_expect_str_eq(ah__tool_policy(NULL, "update_plan"), "allow");
  json_decref(d);
  cr_expect_not(ah__tool_exists(NULL, "rm_rf"));
  cr_expect_not(ah__tool_exists(NULL, NULL));
  cr_expect_not(ah__tool_exists(NULL, ""));
  cr_expect_str_eq(ah__tool_policy(NULL, "read_file"), "allow");
  cr_expect_str_eq(ah__tool_policy(NULL, "list_dir"), "allow");
  cr_expect_str_eq(ah__tool_policy(NULL, "write_file"), "ask");
  cr_expect_str_eq(ah__tool_policy(NULL, "run_command"), "ask");
  cr_expect_null(ah__tool_policy(NULL, "rm_rf"));
  cr_expect_null(ah__tool_policy(NULL, NULL));
}

/* ---- file tools ------------------------------------------------------------------------------------ */

Test(tools, read_write_list_round_trip) {
  fixture f;
  fx_up(&f);
  bool err = false;
  /* The parent directory must exist. */
  json_t *r = tool(&f, "write_file", "{\"path\": \"sub/f.txt\", \"content\": \"h\\u00e9llo\\n\"}", &err);
  cr_expect(err, "wrote into a missing directory");
  json_decref(r);
  char *sub = path_in(f.cwd, "sub");
  cr_assert_eq(mkdir(sub, 0755), 0);

  r = tool(&f, "write_file", "{\"path\": \"sub/f.txt\", \"content\": \"h\\u00e9llo\\n\"}", &err);
  cr_assert_not(err, "write refused: %s", errmsg(r));
  char *fp = path_in(f.cwd, "sub/f.txt");
  cr_expect_str_eq(sget(r, "path"), fp);
  cr_expect_eq(json_integer_value(json_object_get(r, "bytes")), 7);
  cr_expect(json_is_null(json_object_get(r, AH_TOOL_PREVIOUS)), "a new file had no text before");
  json_decref(r);
  struct stat st;
  cr_assert_eq(stat(fp, &st), 0);
  mode_t um = umask(0);
  umask(um);
  cr_expect_eq(st.st_mode & 0777, 0644 & ~um, "mode %o", st.st_mode & 0777);
  size_t len = 0;
  char *text = ts_read_file(fp, &len);
  cr_assert_not_null(text);
  cr_expect_eq(len, 7u);
  cr_expect_str_eq(text, "h\xc3\xa9llo\n");
  free(text);

  /* Overwrite (truncates), through an absolute path inside the cwd; embedded NUL bytes are kept. */
  char *args = NULL;
  cr_assert_geq(asprintf(&args, "{\"path\": \"%s\", \"content\": \"a\\u0000b\"}", fp), 0);
  r = tool(&f, "write_file", args, &err);
  cr_assert_not(err, "%s", errmsg(r));
  cr_expect_eq(json_integer_value(json_object_get(r, "bytes")), 3);
  cr_expect_str_eq(sget(r, AH_TOOL_PREVIOUS), "h\xc3\xa9llo\n", "the text before the write");
  json_decref(r);
  free(args);
  cr_assert_eq(stat(fp, &st), 0);
  cr_expect_eq(st.st_size, 3);

  r = tool(&f, "write_file", "{\"path\": \"./sub//f.txt\", \"content\": \"line 1\\nline 2\\n\"}", &err);
  cr_assert_not(err);
  cr_expect_null(json_object_get(r, AH_TOOL_PREVIOUS), "text with a NUL byte is not shown as before");
  json_decref(r);
  r = tool(&f, "read_file", "{\"path\": \"sub/../sub/f.txt\"}", &err);
  cr_assert_not(err, "%s", errmsg(r));
  cr_expect_str_eq(sget(r, "content"), "line 1\nline 2\n");
  cr_expect_eq(json_integer_value(json_object_get(r, "bytes")), 14);
  cr_expect(json_is_false(json_object_get(r, "truncated")));
  json_decref(r);

  /* list_dir: sorted by name, with types and sizes; "." and ".." are not listed. */
  free(ts_write_file(f.cwd, "b.txt", "12345"));
  char *lnk = path_in(f.cwd, "c-link");
  cr_assert_eq(symlink("b.txt", lnk), 0);
  char *fifo = path_in(f.cwd, "d-fifo");
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  char *adir = path_in(f.cwd, "a-dir");
  cr_assert_eq(mkdir(adir, 0755), 0);
  r = tool(&f, "list_dir", "{\"path\": \".\"}", &err);
  cr_assert_not(err, "%s", errmsg(r));
  json_t *ents = json_object_get(r, "entries");
  cr_assert(json_is_array(ents));
  const char *want_names[] = {"a-dir", "b.txt", "c-link", "d-fifo", "sub"};
  const char *want_types[] = {"dir", "file", "symlink", "other", "dir"};
  cr_assert_eq(json_array_size(ents), 5u, "got %zu entries", json_array_size(ents));
  for (size_t i = 0; i < 5; i++) {
    json_t *e = json_array_get(ents, i);
    cr_expect_str_eq(sget(e, "name"), want_names[i]);
    cr_expect_str_eq(sget(e, "type"), want_types[i], "%s", want_names[i]);
    cr_expect(json_is_integer(json_object_get(e, "size")));
  }
  cr_expect_eq(json_integer_value(json_object_get(json_array_get(ents, 1), "size")), 5);
  json_decref(r);

  /* The cwd named by its absolute path, and a subdirectory. */
  cr_assert_geq(asprintf(&args, "{\"path\": \"%s\"}", f.cwd), 0);
  r = tool(&f, "list_dir", args, &err);
  cr_assert_not(err);
  cr_expect_eq(json_array_size(json_object_get(r, "entries")), 5u);
  json_decref(r);
  free(args);
  r = tool(&f, "list_dir", "{\"path\": \"sub\"}", &err);
  cr_assert_not(err);
  cr_assert_eq(json_array_size(json_object_get(r, "entries")), 1u);
  cr_expect_str_eq(sget(json_array_get(json_object_get(r, "entries"), 0), "name"), "f.txt");
  json_decref(r);

  /* Errors are results with is_error: a missing file, a directory read as a file, a file listed. */
  r = tool(&f, "read_file", "{\"path\": \"nope.txt\"}", &err);
  cr_expect(err);
  cr_expect_not_null(strstr(errmsg(r), "No such file"), "%s", errmsg(r));
  json_decref(r);
  r = tool(&f, "read_file", "{\"path\": \"sub\"}", &err);
  cr_expect(err);
  cr_expect_not_null(strstr(errmsg(r), "not a regular file"), "%s", errmsg(r));
  json_decref(r);
  r = tool(&f, "read_file", "{\"path\": \"d-fifo\"}", &err); /* must not block on the FIFO */
  cr_expect(err);
  json_decref(r);
  r = tool(&f, "list_dir", "{\"path\": \"b.txt\"}", &err);
  cr_expect(err);
  json_decref(r);
  r = tool(&f, "read_file", "{\"path\": \"../x\"}", &err);
  cr_expect(err);
  cr_expect_not_null(strstr(errmsg(r), "escapes"), "%s", errmsg(r));
  json_decref(r);
  r = tool(&f, "read_file", "{\"path\": \"/etc/passwd\"}", &err);
  cr_expect(err);
  cr_expect_null(json_object_get(r, "content"));
  json_decref(r);
  r = tool(&f, "read_file", "{\"path\": \"\"}", &err);
  cr_expect(err);
  json_decref(r);
  r = tool(&f, "read_file", "{\"path\": \"b.txt\\u0000x\"}", &err);
  cr_expect(err);
  cr_expect_not_null(strstr(errmsg(r), "NUL"), "%s", errmsg(r));
  json_decref(r);

  free(sub);
  free(fp);
  free(lnk);
  free(fifo);
  free(adir);
  fx_down(&f);
}

Test(tools, symlinks_outside_refused_inside_allowed) {
  fixture f;
  fx_up(&f);
  free(ts_write_file(f.outside, "secret.txt", "SECRET"));
  free(ts_write_file(f.cwd, "real.txt", "inside"));
  char *secret = path_in(f.outside, "secret.txt");
  char *abs_out = path_in(f.cwd, "abs-out");
  cr_assert_eq(symlink(secret, abs_out), 0);
  char *rel_target = NULL;
  cr_assert_geq(asprintf(&rel_target, "../%s/secret.txt", strrchr(f.outside, '/') + 1), 0);
  char *rel_out = path_in(f.cwd, "rel-out");
  cr_assert_eq(symlink(rel_target, rel_out), 0);
  char *in = path_in(f.cwd, "in-link");
  cr_assert_eq(symlink("real.txt", in), 0);
  char *sub = path_in(f.cwd, "sub");
  cr_assert_eq(mkdir(sub, 0755), 0);
  char *up = path_in(f.cwd, "sub/up-link"); /* "../real.txt": leaves sub, stays inside */
  cr_assert_eq(symlink("../real.txt", up), 0);

  bool err = false;
  const char *outs[] = {"{\"path\": \"abs-out\"}", "{\"path\": \"rel-out\"}"};
  for (size_t i = 0; i < 2; i++) {
    json_t *r = tool(&f, "read_file", outs[i], &err);
    cr_expect(err, "%s was read", outs[i]);
    char *dump = json_dumps(r, 0);
    cr_assert_not_null(dump);
    cr_expect_null(strstr(dump, "SECRET"));
    free(dump);
    cr_expect_not_null(strstr(errmsg(r), "escapes"), "%s", errmsg(r));
    json_decref(r);
  }
  json_t *r = tool(&f, "read_file", "{\"path\": \"in-link\"}", &err);
  cr_expect_not(err, "%s", errmsg(r));
  cr_expect_str_eq(sget(r, "content"), "inside");
  json_decref(r);
  r = tool(&f, "read_file", "{\"path\": \"sub/up-link\"}", &err);
  cr_expect_not(err, "%s", errmsg(r));
  cr_expect_str_eq(sget(r, "content"), "inside");
  json_decref(r);

  /* Writing through a link to a file outside must not touch it either. */
  r = tool(&f, "write_file", "{\"path\": \"rel-out\", \"content\": \"PWNED\"}", &err);
  cr_expect(err);
  json_decref(r);
  char *text = ts_read_file(secret, NULL);
  cr_assert_not_null(text);
  cr_expect_str_eq(text, "SECRET");
  free(text);

  free(secret);
  free(abs_out);
  free(rel_target);
  free(rel_out);
  free(in);
  free(sub);
  free(up);
  fx_down(&f);
}

Test(tools, write_through_symlinked_dir_outside_refused) {
  fixture f;
  fx_up(&f);
  char *link = path_in(f.cwd, "outdir");
  cr_assert_eq(symlink(f.outside, link), 0);
  bool err = false;
  json_t *r = tool(&f, "write_file", "{\"path\": \"outdir/new.txt\", \"content\": \"x\"}", &err);
  cr_expect(err, "wrote through a link to %s", f.outside);
  cr_expect_not_null(strstr(errmsg(r), "escapes"), "%s", errmsg(r));
  json_decref(r);
  char *created = path_in(f.outside, "new.txt");
  cr_expect_neq(access(created, F_OK), 0, "the file was created outside the cwd");
  /* A directory link that stays inside works. */
  char *real = path_in(f.cwd, "real");
  cr_assert_eq(mkdir(real, 0755), 0);
  char *inlink = path_in(f.cwd, "indir");
  cr_assert_eq(symlink("real", inlink), 0);
  r = tool(&f, "write_file", "{\"path\": \"indir/new.txt\", \"content\": \"ok\"}", &err);
  cr_expect_not(err, "%s", errmsg(r));
  json_decref(r);
  char *made = path_in(f.cwd, "real/new.txt");
  cr_expect_eq(access(made, F_OK), 0);
  free(link);
  free(created);
  free(real);
  free(inlink);
  free(made);
  fx_down(&f);
}

Test(tools, list_dir_symlink_outside_refused) {
  fixture f;
  fx_up(&f);
  free(ts_write_file(f.outside, "secret.txt", "SECRET"));
  char *link = path_in(f.cwd, "outdir");
  cr_assert_eq(symlink(f.outside, link), 0);
  bool err = false;
  const char *cases[] = {"{\"path\": \"outdir\"}", "{\"path\": \"outdir/\"}", "{\"path\": \"outdir/.\"}"};
  for (size_t i = 0; i < 3; i++) {
    json_t *r = tool(&f, "list_dir", cases[i], &err);
    cr_expect(err, "%s was listed", cases[i]);
    cr_expect_null(json_object_get(r, "entries"));
    json_decref(r);
  }
  /* The link itself shows up in a listing of the cwd, as a symlink. */
  json_t *r = tool(&f, "list_dir", "{\"path\": \".\"}", &err);
  cr_assert_not(err);
  cr_expect_str_eq(sget(json_array_get(json_object_get(r, "entries"), 0), "type"), "symlink");
  json_decref(r);
  free(link);
  fx_down(&f);
}

Test(tools, binary_file_refused) {
  fixture f;
  fx_up(&f);
  char *p = path_in(f.cwd, "bin");
  FILE *fp = fopen(p, "wb");
  cr_assert_not_null(fp);
  fwrite("ELF\0\1\2\xff", 1, 7, fp);
  fclose(fp);
  char *q = path_in(f.cwd, "latin1");
  fp = fopen(q, "wb");
  cr_assert_not_null(fp);
  fputs("caf\xe9\n", fp); /* ISO-8859-1, not UTF-8 */
  fclose(fp);
  bool err = false;
  json_t *r = tool(&f, "read_file", "{\"path\": \"bin\"}", &err);
  cr_expect(err);
  cr_expect_not_null(strstr(errmsg(r), "binary"), "%s", errmsg(r));
  json_decref(r);
  r = tool(&f, "read_file", "{\"path\": \"latin1\"}", &err);
  cr_expect(err);
  cr_expect_not_null(strstr(errmsg(r), "binary"), "%s", errmsg(r));
  json_decref(r);
  free(p);
  free(q);
  fx_down(&f);
}

Test(tools, oversize_read_truncated) {
  fixture f;
  fx_up(&f);
  size_t n = AH_TOOL_MAX_READ + 100;
  char *data = malloc(n);
  cr_assert_not_null(data);
  memset(data, 'a', n);
  char *p = path_in(f.cwd, "big");
  FILE *fp = fopen(p, "wb");
  cr_assert_not_null(fp);
  cr_assert_eq(fwrite(data, 1, n, fp), n);
  fclose(fp);
  bool err = false;
  json_t *r = tool(&f, "read_file", "{\"path\": \"big\"}", &err);
  cr_assert_not(err, "%s", errmsg(r));
  cr_expect(json_is_true(json_object_get(r, "truncated")));
  cr_expect_eq(json_integer_value(json_object_get(r, "bytes")), AH_TOOL_MAX_READ);
  cr_expect_eq(json_string_length(json_object_get(r, "content")), (size_t)AH_TOOL_MAX_READ);
  json_decref(r);

  /* A two-byte character split by the cap: the text ends before it, and is not called binary. */
  memcpy(data + AH_TOOL_MAX_READ - 1, "\xc3\xa9", 2);
  fp = fopen(p, "wb");
  cr_assert_not_null(fp);
  cr_assert_eq(fwrite(data, 1, n, fp), n);
  fclose(fp);
  r = tool(&f, "read_file", "{\"path\": \"big\"}", &err);
  cr_assert_not(err, "%s", errmsg(r));
  cr_expect(json_is_true(json_object_get(r, "truncated")));
  cr_expect_eq(json_integer_value(json_object_get(r, "bytes")), AH_TOOL_MAX_READ - 1);
  json_decref(r);

  /* Exactly the cap: not truncated. */
  memset(data, 'b', n);
  fp = fopen(p, "wb");
  cr_assert_not_null(fp);
  cr_assert_eq(fwrite(data, 1, AH_TOOL_MAX_READ, fp), (size_t)AH_TOOL_MAX_READ);
  fclose(fp);
  r = tool(&f, "read_file", "{\"path\": \"big\"}", &err);
  cr_assert_not(err);
  cr_expect(json_is_false(json_object_get(r, "truncated")));
  cr_expect_eq(json_integer_value(json_object_get(r, "bytes")), AH_TOOL_MAX_READ);
  json_decref(r);
  free(data);
  free(p);
  fx_down(&f);
}

Test(tools, open_walk_fallback) {
  /* The walk used without openat2 must give the same answers as RESOLVE_BENEATH. */
  fixture f;
  fx_up(&f);
  free(ts_write_file(f.cwd, "real.txt", "inside"));
  free(ts_write_file(f.outside, "secret.txt", "SECRET"));
  char *sub = path_in(f.cwd, "sub");
  cr_assert_eq(mkdir(sub, 0755), 0);
  struct {
    const char *name;
    const char *target;
  } links[] = {
      {"in-link", "real.txt"},     {"sub/up-link", "../real.txt"}, {"dir-link", "sub"},
      {"abs-link", "/etc/passwd"}, {"loop-a", "loop-b"},           {"loop-b", "loop-a"},
      {"esc", "sub/../.."},
  };
  for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
    char *p = path_in(f.cwd, links[i].name);
    cr_assert_eq(symlink(links[i].target, p), 0);
    free(p);
  }
  char *rel_target = NULL;
  cr_assert_geq(asprintf(&rel_target, "../%s", strrchr(f.outside, '/') + 1), 0);
  char *outdir = path_in(f.cwd, "outdir");
  cr_assert_eq(symlink(rel_target, outdir), 0);
  int root = open(f.cwd, O_PATH | O_DIRECTORY | O_CLOEXEC);
  cr_assert_geq(root, 0);

  const char *ok[] = {"real.txt", "in-link", "sub/up-link", "dir-link/up-link", "sub/../real.txt"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    int fd = ah__tool_open_walk(root, ok[i], O_RDONLY | O_CLOEXEC, 0);
    cr_expect_geq(fd, 0, "%s: %s", ok[i], strerror(errno));
    if (fd >= 0) {
      char buf[16] = "";
      cr_expect_eq(read(fd, buf, sizeof buf - 1), 6);
      cr_expect_str_eq(buf, "inside");
      close(fd);
    }
  }
  int fd = ah__tool_open_walk(root, "dir-link", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  cr_expect_geq(fd, 0, "a directory link inside: %s", strerror(errno));
  if (fd >= 0)
    close(fd);

  struct {
    const char *path;
    int err;
  } bad[] = {
      {"..", EXDEV},      {"sub/../../x", EXDEV}, {"abs-link", EXDEV}, {"outdir/secret.txt", EXDEV},
      {"esc", EXDEV},     {"loop-a", ELOOP},      {"nope", ENOENT},    {"real.txt/x", ENOTDIR},
      {"outdir/", EXDEV}, {"esc/x", EXDEV},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    errno = 0;
    fd = ah__tool_open_walk(root, bad[i].path, O_RDONLY | O_CLOEXEC, 0);
    cr_expect_lt(fd, 0, "%s was opened", bad[i].path);
    cr_expect_eq(errno, bad[i].err, "%s: %s", bad[i].path, strerror(errno));
    if (fd >= 0)
      close(fd);
  }
  /* Creation through the walk: inside works, through a link to the outside does not. */
  fd = ah__tool_open_walk(root, "dir-link/new.txt", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  cr_expect_geq(fd, 0, "%s", strerror(errno));
  if (fd >= 0)
    close(fd);
  char *made = path_in(f.cwd, "sub/new.txt");
  cr_expect_eq(access(made, F_OK), 0);
  fd = ah__tool_open_walk(root, "outdir/new.txt", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  cr_expect_lt(fd, 0);
  cr_expect_eq(errno, EXDEV);
  char *outside_new = path_in(f.outside, "new.txt");
  cr_expect_neq(access(outside_new, F_OK), 0);
  /* A dangling link to a name outside is not created through either. */
  char *dangling = path_in(f.cwd, "dangling");
  cr_assert_eq(symlink("../agenthost-nonexistent-target", dangling), 0);
  fd = ah__tool_open_walk(root, "dangling", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  cr_expect_lt(fd, 0);
  cr_expect_eq(errno, EXDEV, "%s", strerror(errno));
  close(root);
  free(sub);
  free(rel_target);
  free(outdir);
  free(made);
  free(outside_new);
  free(dangling);
  fx_down(&f);
}

/* ---- run_command ----------------------------------------------------------------------------------- */

Test(tools, run_command_exit_code_and_streams) {
  fixture f;
  fx_up(&f);
  bool err = false;
  json_t *r = tool(&f, "run_command", "{\"command\": \"echo out; echo err >&2; exit 3\"}", &err);
  cr_assert_not(err, "%s", errmsg(r));
  cr_expect_eq(json_integer_value(json_object_get(r, "exitCode")), 3);
  cr_expect(json_is_null(json_object_get(r, "signal")));
  cr_expect_str_eq(sget(r, "stdout"), "out\n");
  cr_expect_str_eq(sget(r, "stderr"), "err\n");
  cr_expect(json_is_false(json_object_get(r, "truncated")));
  cr_expect(json_is_false(json_object_get(r, "timedOut")));
  cr_expect(json_is_false(json_object_get(r, "cancelled")));
  json_decref(r);

  r = tool(&f, "run_command", "{\"command\": \"true\", \"timeout_ms\": 5000}", &err);
  cr_assert_not(err);
  cr_expect_eq(json_integer_value(json_object_get(r, "exitCode")), 0);
  cr_expect_str_eq(sget(r, "stdout"), "");
  json_decref(r);

  /* A timeout above the maximum is clamped, not refused. */
  r = tool(&f, "run_command", "{\"command\": \"exit 0\", \"timeout_ms\": 999999999999}", &err);
  cr_assert_not(err);
  cr_expect_eq(json_integer_value(json_object_get(r, "exitCode")), 0);
  json_decref(r);

  /* Killed by a signal: no exit code, the signal's name. */
  r = tool(&f, "run_command", "{\"command\": \"kill -9 $$\"}", &err);
  cr_assert_not(err);
  cr_expect(json_is_null(json_object_get(r, "exitCode")));
  cr_expect_str_eq(sget(r, "signal"), "SIGKILL");
  json_decref(r);

  /* Output that is not UTF-8 becomes valid JSON text, invalid bytes replaced by U+FFFD. */
  r = tool(&f, "run_command", "{\"command\": \"printf 'a\\\\377b\\\\342\\\\202c'\"}", &err);
  cr_assert_not(err);
  cr_expect_str_eq(sget(r, "stdout"),
                   "a\xef\xbf\xbd"
                   "b\xef\xbf\xbd"
                   "c",
                   "got %s", sget(r, "stdout"));
  char *dump = json_dumps(r, 0);
  cr_assert_not_null(dump);
  json_t *back = json_loads(dump, 0, NULL);
  cr_expect_not_null(back, "the result is not valid JSON");
  json_decref(back);
  free(dump);
  json_decref(r);
  fx_down(&f);
}

Test(tools, run_command_output_cap) {
  fixture f;
  fx_up(&f);
  bool err = false;
  uint64_t t0 = ts_now_ms();
  json_t *r =
      tool(&f, "run_command", "{\"command\": \"yes | head -c 10485760; yes e | head -c 300000 >&2\"}", &err);
  cr_assert_not(err, "%s", errmsg(r));
  cr_expect(json_is_true(json_object_get(r, "truncated")));
  cr_expect_eq(json_string_length(json_object_get(r, "stdout")), (size_t)AH_TOOL_MAX_OUTPUT);
  cr_expect_eq(json_string_length(json_object_get(r, "stderr")), (size_t)AH_TOOL_MAX_OUTPUT);
  cr_expect_eq(strncmp(sget(r, "stdout"), "y\ny\n", 4), 0);
  cr_expect_eq(json_integer_value(json_object_get(r, "exitCode")), 0, "the writer was not read to the end");
  cr_expect_lt(ts_now_ms() - t0, 10000u);
  json_decref(r);
  fx_down(&f);
}

Test(tools, run_command_timeout) {
  fixture f;
  fx_up(&f);
  tres t;
  uint64_t t0 = ts_now_ms();
  start_tool(&f, "run_command", "{\"command\": \"sleep 5\", \"timeout_ms\": 200}", NULL, &t);
  wait_tool(&f, &t, 10000);
  cr_assert_not(t.is_error, "%s", errmsg(t.result));
  cr_expect(json_is_true(json_object_get(t.result, "timedOut")));
  cr_expect(json_is_false(json_object_get(t.result, "cancelled")));
  cr_expect(json_is_null(json_object_get(t.result, "exitCode")));
  cr_expect_str_eq(sget(t.result, "signal"), "SIGTERM");
  cr_expect_geq(t.at_ms - t0, 190u, "reported before the timeout");
  cr_expect_lt(t.at_ms - t0, 3000u, "took %llu ms", (unsigned long long)(t.at_ms - t0));
  json_decref(t.result);
  fx_down(&f);
}

Test(tools, run_command_env_has_no_canaries) {
  cr_assert_eq(setenv("OPENAI_API_KEY", "sk-CANARY", 1), 0);
  cr_assert_eq(setenv("DATABASE_URL", "postgres://u:CANARY@h/d", 1), 0);
  cr_assert_eq(setenv("SSH_AUTH_SOCK", "/tmp/CANARY.sock", 1), 0);
  cr_assert_eq(setenv("BASH_FUNC_x%%", "() { :; }", 1), 0);
  cr_assert_eq(setenv("LD_PRELOAD", "/tmp/CANARY.so", 1), 0);
  cr_assert_eq(setenv("NODE_OPTIONS", "--require=/tmp/CANARY.js", 1), 0);
  cr_assert_eq(setenv("PATH", "/usr/bin:/bin", 1), 0);
  fixture f;
  fx_up(&f);
  bool err = false;
  json_t *r = tool(&f, "run_command", "{\"command\": \"env\"}", &err);
  cr_assert_not(err, "%s", errmsg(r));
  const char *out = sget(r, "stdout");
  cr_assert_not_null(out);
  const char *banned[] = {"CANARY", "OPENAI_API_KEY", "BASH_FUNC_",   "LD_PRELOAD",
                          "LD_",    "NODE_OPTIONS",   "DATABASE_URL", "SSH_AUTH_SOCK"};
  for (size_t i = 0; i < sizeof banned / sizeof banned[0]; i++)
    cr_expect_null(strstr(out, banned[i]), "%s reached the command:\n%s", banned[i], out);
  cr_expect_not_null(strstr(out, "PATH=/usr/bin:/bin\n"), "PATH is missing:\n%s", out);
  json_decref(r);
  fx_down(&f);
}

Test(tools, run_command_cwd_is_the_session_cwd) {
  fixture f;
  fx_up(&f);
  bool err = false;
  json_t *r = tool(&f, "run_command", "{\"command\": \"pwd -P; ls\"}", &err);
  cr_assert_not(err, "%s", errmsg(r));
  char *want = NULL;
  cr_assert_geq(asprintf(&want, "%s\n", f.cwd), 0);
  cr_expect_str_eq(sget(r, "stdout"), want);
  free(want);
  json_decref(r);
  /* A cwd that does not exist is an error result, not a crash. */
  tres t;
  memset(&t, 0, sizeof t);
  json_t *args = json_pack("{s:s}", "command", "true");
  char *gone = path_in(f.cwd, "gone");
  cr_assert_eq(ah__tool_run(f.h, gone, "run_command", args, NULL, done_cb, &t), 0);
  cr_assert_not(t.done);
  wait_tool(&f, &t, 10000);
  cr_expect(t.is_error);
  json_decref(t.result);
  json_decref(args);
  free(gone);
  fx_down(&f);
}

/* The group of a command that wrote $$ to `file` in the cwd; waits until it has `members` processes. */
static pid_t wait_group(fixture *f, const char *file, int members) {
  char *p = path_in(f->cwd, file);
  cr_assert(ts_wait_path(p, 5000), "the command never started");
  pid_t pgid = 0;
  uint64_t deadline = ts_now_ms() + 5000;
  while (ts_now_ms() < deadline) {
    char *text = ts_read_file(p, NULL);
    if (text && strchr(text, '\n'))
      pgid = (pid_t)atoi(text);
    free(text);
    if (pgid > 0 && ts_group_members(pgid) >= members)
      break;
    usleep(10000);
  }
  free(p);
  cr_assert_gt(pgid, 0);
  cr_assert_geq(ts_group_members(pgid), members, "group %d", (int)pgid);
  return pgid;
}

Test(tools, cancellation_kills_the_whole_group) {
  cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  fixture f;
  fx_up(&f);
  ah_cancel *token = ah__cancel_new(NULL);
  cr_assert_not_null(token);
  tres t;
  start_tool(&f, "run_command", "{\"command\": \"echo $$ > pgid; sleep 1000 & sleep 1000\"}", token, &t);
  pid_t pgid = wait_group(&f, "pgid", 3);
  uv_run(&f.loop, UV_RUN_NOWAIT);
  cr_assert_not(t.done);
  uint64_t t0 = ts_now_ms();
  ah__cancel_trip(token);
  wait_tool(&f, &t, 10000);
  cr_assert_not(t.is_error, "%s", errmsg(t.result));
  cr_expect(json_is_true(json_object_get(t.result, "cancelled")));
  cr_expect(json_is_false(json_object_get(t.result, "timedOut")));
  cr_expect(json_is_null(json_object_get(t.result, "exitCode")));
  cr_expect_str_eq(sget(t.result, "signal"), "SIGTERM");
  cr_expect_lt(t.at_ms - t0, 3000u);
  /* After the result, nothing of the group is left (the background sleep included): its members held the
   * output pipe, so they were exiting already; reap what was reparented to us. */
  cr_expect(ts_run_until_pred(&f.loop, ts_group_gone, &pgid, 2000), "group %d still exists", (int)pgid);
  cr_expect_eq(ts_group_members(pgid), 0);
  json_decref(t.result);
  ah__cancel_free(token);
  fx_down(&f);
}

Test(tools, cancelled_before_start) {
  fixture f;
  fx_up(&f);
  ah_cancel *token = ah__cancel_new(NULL);
  cr_assert_not_null(token);
  ah__cancel_trip(token);
  tres t;
  start_tool(&f, "run_command", "{\"command\": \"touch ran\"}", token, &t);
  wait_tool(&f, &t, 5000);
  cr_assert_not(t.is_error);
  cr_expect(json_is_true(json_object_get(t.result, "cancelled")));
  json_decref(t.result);
  char *ran = path_in(f.cwd, "ran");
  cr_expect_neq(access(ran, F_OK), 0, "the command ran after its token tripped");
  free(ran);
  start_tool(&f, "write_file", "{\"path\": \"w.txt\", \"content\": \"x\"}", token, &t);
  wait_tool(&f, &t, 5000);
  cr_expect(t.is_error);
  cr_expect_not_null(strstr(errmsg(t.result), "cancelled"));
  json_decref(t.result);
  char *w = path_in(f.cwd, "w.txt");
  cr_expect_neq(access(w, F_OK), 0);
  free(w);
  ah__cancel_free(token);
  fx_down(&f);
}

Test(tools, host_stop_kills_a_running_command) {
  cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  fixture f;
  fx_up(&f);
  tres t;
  start_tool(&f, "run_command", "{\"command\": \"echo $$ > pgid; trap '' TERM; sleep 1000 & sleep 1000\"}",
             NULL, &t);
  pid_t pgid = wait_group(&f, "pgid", 3);
  uint64_t t0 = ts_now_ms();
  char *cwd = f.cwd, *outside = f.outside;
  cr_assert_eq(th_host_stop_free(&f.loop, f.h), 0);
  cr_expect_lt(ts_now_ms() - t0, 5000u);
  cr_assert_eq(t.calls, 1, "the callback ran %d times", t.calls);
  cr_assert_not(t.is_error);
  cr_expect(json_is_true(json_object_get(t.result, "cancelled")));
  cr_expect_str_eq(sget(t.result, "signal"), "SIGKILL");
  json_decref(t.result);
  uint64_t deadline = ts_now_ms() + 5000;
  while (!ts_group_gone(&pgid) && ts_now_ms() < deadline)
    usleep(10000);
  cr_expect(ts_group_gone(&pgid), "group %d survived the host", (int)pgid);
  ts_rmtree(cwd);
  ts_rmtree(outside);
  free(cwd);
  free(outside);
  cr_expect_eq(th_leak_check(), 0);
}

/* ---- refusals -------------------------------------------------------------------------------------- */

Test(tools, bad_arguments_einval) {
  fixture f;
  fx_up(&f);
  tres t;
  memset(&t, 0, sizeof t);
  struct {
    const char *name;
    const char *args;
  } bad[] = {
      {"rm_rf", "{\"path\": \"x\"}"},
      {"read_file", "{}"},
      {"read_file", "[\"x\"]"},
      {"read_file", "{\"path\": 3}"},
      {"read_file", "{\"path\": null}"},
      {"read_file", "{\"path\": \"x\", \"extra\": 1}"},
      {"write_file", "{\"path\": \"x\"}"},
      {"write_file", "{\"content\": \"x\"}"},
      {"write_file", "{\"path\": \"x\", \"content\": 1}"},
      {"list_dir", "{\"dir\": \".\"}"},
      {"run_command", "{}"},
      {"run_command", "{\"command\": 1}"},
      {"run_command", "{\"command\": \"\"}"},
      {"run_command", "{\"command\": \"echo a\\u0000b\"}"},
      {"run_command", "{\"command\": \"true\", \"timeout_ms\": 0}"},
      {"run_command", "{\"command\": \"true\", \"timeout_ms\": -5}"},
      {"run_command", "{\"command\": \"true\", \"timeout_ms\": \"100\"}"},
      {"run_command", "{\"command\": \"true\", \"timeout_ms\": 1.5}"},
      {"run_command", "{\"command\": \"true\", \"cwd\": \"/\"}"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    json_t *args = json_loads(bad[i].args, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    cr_assert_not_null(args, "%s", bad[i].args);
    cr_expect_eq(ah__tool_run(f.h, f.cwd, bad[i].name, args, NULL, done_cb, &t), AH_EINVAL, "%s %s accepted",
                 bad[i].name, bad[i].args);
    json_decref(args);
  }
  json_t *ok = json_pack("{s:s}", "path", ".");
  cr_expect_eq(ah__tool_run(f.h, f.cwd, "list_dir", NULL, NULL, done_cb, &t), AH_EINVAL);
  cr_expect_eq(ah__tool_run(f.h, f.cwd, NULL, ok, NULL, done_cb, &t), AH_EINVAL);
  cr_expect_eq(ah__tool_run(f.h, "relative", "list_dir", ok, NULL, done_cb, &t), AH_EINVAL);
  cr_expect_eq(ah__tool_run(f.h, NULL, "list_dir", ok, NULL, done_cb, &t), AH_EINVAL);
  cr_expect_eq(ah__tool_run(f.h, f.cwd, "list_dir", ok, NULL, NULL, &t), AH_EINVAL);
  cr_expect_eq(ah__tool_run(NULL, f.cwd, "list_dir", ok, NULL, done_cb, &t), AH_EINVAL);
  json_decref(ok);
  for (int i = 0; i < 20; i++)
    uv_run(&f.loop, UV_RUN_NOWAIT);
  cr_expect_eq(t.calls, 0, "the callback ran %d times for refused arguments", t.calls);
  fx_down(&f);
}

/* ---- the host's own files (reliability finding 6; SECURITY.md: the file tools refuse the state and
 * runtime directories and the token file, whatever the cwd) ------------------------------------------ */

typedef struct guard_fx {
  fixture f;
  ah_config cfg;
  char *state;
  char *token;
} guard_fx;

/* A host whose state directory (with its runtime dir and token) lies inside the session cwd, as with a
 * cwd of $HOME; `token_file` (may be NULL) is the browser's token_file setting. */
static void guard_up(guard_fx *g, const char *token_file) {
  memset(g, 0, sizeof *g);
  cr_assert_eq(uv_loop_init(&g->f.loop), 0);
  g->f.cwd = real_tmpdir();
  g->f.outside = real_tmpdir();
  g->state = path_in(g->f.cwd, ".state");
  cr_assert_eq(mkdir(g->state, 0700), 0);
  g->cfg.state_dir = strdup(g->state);
  g->cfg.runtime_dir = path_in(g->state, "run");
  cr_assert_eq(mkdir(g->cfg.runtime_dir, 0700), 0);
  g->cfg.plugin_dir = strdup(g->f.outside);
  g->cfg.log_level = AH_LOG_WARN;
  g->cfg.default_provider = strdup("echo");
  g->cfg.synchronous = strdup("normal");
  g->cfg.plugins = token_file ? json_pack("{s:{s:s}}", "browser", "token_file", token_file) : json_object();
  g->cfg.providers = json_object();
  g->token = token_file ? strdup(token_file) : path_in(g->state, "token");
  free(ts_write_file(g->state, "token", "SECRET-TOKEN-IN-STATE"));
  if (token_file) {
    FILE *t = fopen(token_file, "w");
    cr_assert_not_null(t);
    fputs("SECRET-TOKEN-ELSEWHERE", t);
    fclose(t);
  }
  ah_host_opts opts = {.loop = &g->f.loop, .config = &g->cfg, .mode = "serve", .drain_ms = 0};
  cr_assert_eq(ah__host_new(&opts, &g->f.h), 0);
}

static void guard_down(guard_fx *g) {
  free(g->cfg.state_dir);
  g->cfg.state_dir = NULL;
  fx_down(&g->f);
  free(g->cfg.runtime_dir);
  free(g->cfg.plugin_dir);
  free(g->cfg.default_provider);
  free(g->cfg.synchronous);
  json_decref(g->cfg.plugins);
  json_decref(g->cfg.providers);
  free(g->state);
  free(g->token);
}

/* The tool is refused, names why, and shows no secret. */
static void expect_guarded(guard_fx *g, const char *name, const char *args) {
  bool is_error = false;
  json_t *r = tool(&g->f, name, args, &is_error);
  char *text = json_dumps(r, JSON_COMPACT);
  cr_expect(is_error, "%s %s was allowed: %s", name, args, text);
  cr_expect(strstr(errmsg(r), "refused"), "%s %s: %s", name, args, errmsg(r));
  cr_expect_null(strstr(text, "SECRET"), "%s %s leaked the token: %s", name, args, text);
  free(text);
  json_decref(r);
}

Test(tools, host_files_refused_whatever_the_cwd) {
  guard_fx g;
  guard_up(&g, NULL);
  char *ok = ts_write_file(g.f.cwd, "notes.txt", "plain");
  expect_guarded(&g, "read_file", "{\"path\":\".state/token\"}");
  expect_guarded(&g, "read_file", "{\"path\":\"./.state/agenthost.db\"}");
  expect_guarded(&g, "list_dir", "{\"path\":\".state\"}");
  expect_guarded(&g, "list_dir", "{\"path\":\".state/run\"}");
  expect_guarded(&g, "write_file", "{\"path\":\".state/token\",\"content\":\"x\"}");
  expect_guarded(&g, "write_file", "{\"path\":\".state/run/new.txt\",\"content\":\"x\"}");
  char *sym = path_in(g.f.cwd, "innocent");
  cr_assert_eq(symlink(".state/token", sym), 0);
  expect_guarded(&g, "read_file", "{\"path\":\"innocent\"}");
  char *hard = path_in(g.f.cwd, "hard");
  cr_assert_eq(link(g.token, hard), 0);
  expect_guarded(&g, "read_file", "{\"path\":\"hard\"}");
  expect_guarded(&g, "write_file", "{\"path\":\"hard\",\"content\":\"x\"}");
  /* Nothing was written or created. */
  char *tok = ts_read_file(g.token, NULL);
  cr_expect_str_eq(tok, "SECRET-TOKEN-IN-STATE");
  free(tok);
  char *made = path_in(g.cfg.runtime_dir, "new.txt");
  cr_expect_neq(access(made, F_OK), 0, "write_file created a file in the runtime directory");
  /* Everything else in the cwd stays usable. */
  bool is_error = true;
  json_t *r = tool(&g.f, "read_file", "{\"path\":\"notes.txt\"}", &is_error);
  cr_expect_not(is_error, "%s", errmsg(r));
  json_decref(r);
  r = tool(&g.f, "list_dir", "{\"path\":\".\"}", &is_error);
  cr_expect_not(is_error, "%s", errmsg(r));
  json_decref(r);
  r = tool(&g.f, "write_file", "{\"path\":\"out.txt\",\"content\":\"y\"}", &is_error);
  cr_expect_not(is_error, "%s", errmsg(r));
  json_decref(r);
  free(made);
  free(ok);
  free(sym);
  free(hard);
  guard_down(&g);
}

Test(tools, the_token_file_is_refused_wherever_it_lives) {
  char *elsewhere = real_tmpdir();
  char *tf = path_in(elsewhere, "tok");
  guard_fx g;
  guard_up(&g, tf);
  char *hard = path_in(g.f.cwd, "t");
  cr_assert_eq(link(tf, hard), 0);
  expect_guarded(&g, "read_file", "{\"path\":\"t\"}");
  free(hard);
  guard_down(&g);
  ts_rmtree(elsewhere);
  free(elsewhere);
  free(tf);
}

Test(tools, update_plan_checks_its_steps) {
  fixture f;
  fx_up(&f);
  bool err = false;
  json_t *r = tool(&f, "update_plan",
                   "{\"entries\": [{\"content\": \"Read the code\", \"status\": \"completed\"},"
                   " {\"content\": \"Fix it\", \"status\": \"in_progress\", \"priority\": \"high\"}]}",
                   &err);
  cr_assert_not(err, "%s", errmsg(r));
  cr_expect_eq(json_integer_value(json_object_get(r, "steps")), 2);
  json_decref(r);
  const char *bad[] = {
      "{}",
      "{\"entries\": {}}",
      "{\"entries\": [], \"more\": 1}",
      "{\"entries\": [{\"content\": \"x\"}]}",
      "{\"entries\": [{\"content\": \"\", \"status\": \"pending\"}]}",
      "{\"entries\": [{\"content\": \"x\", \"status\": \"done\"}]}",
      "{\"entries\": [{\"content\": \"x\", \"status\": \"pending\", \"priority\": \"urgent\"}]}",
      "{\"entries\": [{\"content\": \"x\", \"status\": \"pending\", \"extra\": 1}]}",
      "{\"entries\": [\"x\"]}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    json_t *args = json_loads(bad[i], 0, NULL);
    cr_assert_not_null(args);
    tres t;
    memset(&t, 0, sizeof t);
    cr_expect_eq(ah__tool_run(f.h, f.cwd, "update_plan", args, NULL, done_cb, &t), AH_EINVAL, "%s", bad[i]);
    json_decref(args);
  }
  fx_down(&f);
}
