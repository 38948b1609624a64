/* The built-in tools: read_file, write_file, list_dir, run_command (tools.h, DECISIONS.md "Tools").
 *
 * Confinement has two layers. ah__tool_confine() is lexical: the path must name the session cwd and then
 * only descend, so "..", absolute paths elsewhere and over-long paths are refused before anything touches
 * the file system. The open itself is done beneath a descriptor of the cwd with openat2(RESOLVE_BENEATH |
 * RESOLVE_NO_MAGICLINKS), so a symlink inside the tree that points out of it (absolute, or through "..")
 * is refused by the kernel, also when it is swapped in between the check and the open. A kernel without
 * openat2 (ENOSYS) gets a userspace walk with O_NOFOLLOW on every component that follows relative links
 * only while they stay inside the tree and refuses absolute ones, as RESOLVE_BENEATH does.
 *
 * A third layer guards the host's own files whatever the cwd (a cwd of $HOME contains the state directory):
 * what a file tool opens — the file, the directory listed, the directory a file is written in — is
 * refused when it is the state directory, the runtime directory or below them, or the browser's token
 * file wherever it lives (compared by device and inode, so a hard link is refused too). The check is on
 * the opened descriptor, so a symlink swapped in does not get around it.
 *
 * File work runs on the thread pool through the core mount, so the core's withdraw waits for it (or
 * cancels it before it starts). run_command goes through the process service on the core mount (the
 * environment allowlist, its own process group, the kill that escalates to SIGKILL) and is counted as an
 * in-flight call of the core, so a stopping host kills it and waits for its exit instead of orphaning it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "command.h"
#include "config.h"
#include "internal.h"
#include "tools.h"

/* The userspace walk used when the kernel has no openat2; not static so that the tests can exercise it on
 * a kernel that has one. Returns a descriptor or -1 with errno (EXDEV when the path leaves the tree). */
int ah__tool_open_walk(int dirfd, const char *rel, int flags, mode_t mode);

typedef enum tool_kind {
  TOOL_INVALID = 0,
  TOOL_READ_FILE,
  TOOL_WRITE_FILE,
  TOOL_LIST_DIR,
  TOOL_RUN_COMMAND,
  TOOL_UPDATE_PLAN,
} tool_kind;

typedef struct tool_param {
  const char *name;
  const char *type; /* "string" | "integer" */
  const char *description;
  bool required;
} tool_param;

typedef struct tool_def {
  const char *name;
  tool_kind kind;
  const char *policy;
  const char *description;
  tool_param params[2];
  size_t nparams;
  const char *schema; /* a JSON Schema (text) instead of params, for arguments params cannot say */
} tool_def;

static const tool_def tool_defs[] = {
    {"read_file",
     TOOL_READ_FILE,
     "allow",
     "Read a UTF-8 text file inside the working directory (at most 1 MiB; longer files are truncated).",
     {{"path", "string", "File path, relative to the working directory or absolute inside it.", true}},
     1,
     NULL},
    {"write_file",
     TOOL_WRITE_FILE,
     "ask",
     "Create or overwrite a file inside the working directory; its parent directory must exist.",
     {{"path", "string", "File path, relative to the working directory or absolute inside it.", true},
      {"content", "string", "The complete new content of the file.", true}},
     2,
     NULL},
    {"list_dir",
     TOOL_LIST_DIR,
     "allow",
     "List a directory inside the working directory: name, type (file, dir, symlink, other) and size.",
     {{"path", "string", "Directory path, relative to the working directory or absolute inside it.", true}},
     1,
     NULL},
    {"run_command",
     TOOL_RUN_COMMAND,
     "ask",
     "Run a shell command with /bin/sh -c in the working directory; returns its exit code, stdout and "
     "stderr (each capped at 256 KiB).",
     {{"command", "string", "The shell command line.", true},
      {"timeout_ms", "integer", "Time limit in milliseconds (default 60000, at most 600000).", false}},
     2,
     NULL},
    {"update_plan",
     TOOL_UPDATE_PLAN,
     "allow",
     "Show the user your plan for the task as a checklist: the complete list of steps, each with its "
     "status. Call it again with the whole list whenever a step starts or is done.",
     {{0}},
     0,
     "{\"type\": \"object\", \"required\": [\"entries\"], \"additionalProperties\": false, \"properties\": "
     "{\"entries\": {\"type\": \"array\", \"maxItems\": 100, \"items\": {\"type\": \"object\", "
     "\"required\": [\"content\", \"status\"], \"additionalProperties\": false, \"properties\": {"
     "\"content\": {\"type\": \"string\", \"description\": \"What the step does.\"}, "
     "\"status\": {\"type\": \"string\", \"enum\": [\"pending\", \"in_progress\", \"completed\"]}, "
     "\"priority\": {\"type\": \"string\", \"enum\": [\"high\", \"medium\", \"low\"]}}}}}}"},
};

#define NTOOLS (sizeof tool_defs / sizeof tool_defs[0])

/* What a built-in does, for clients and for the session's mode (tools.h ah__tool_kind). */
static const char *builtin_kind(tool_kind k) {
  switch (k) {
  case TOOL_READ_FILE:
  case TOOL_LIST_DIR:
    return "read";
  case TOOL_WRITE_FILE:
    return "edit";
  case TOOL_RUN_COMMAND:
    return "execute";
  case TOOL_UPDATE_PLAN:
    return "think";
  default:
    return "other";
  }
}

static const char *const kinds[] = {"read",    "edit",  "delete", "move", "search",
                                    "execute", "think", "fetch",  "other"};

bool ah__tool_kind_valid(const char *kind) {
  for (size_t i = 0; kind && i < sizeof kinds / sizeof kinds[0]; i++)
    if (strcmp(kind, kinds[i]) == 0)
      return true;
  return false;
}

static const tool_def *tool_find(const char *name) {
  for (size_t i = 0; name && i < NTOOLS; i++)
    if (strcmp(tool_defs[i].name, name) == 0)
      return &tool_defs[i];
  return NULL;
}

bool ah__tool_builtin(const char *name) {
  return tool_find(name) != NULL;
}

static ah__entry *plugin_tool(ah_host *h, const char *name) {
  ah__entry *e = h && name ? ah__registry_find(&h->reg, AH__ENTRY_TOOL, name) : NULL;
  return e && e->state == AH__ST_ACTIVE && e->mount && e->mount->state == AH__MOUNT_ACTIVE ? e : NULL;
}

json_t *ah__tools_list(ah_host *h) {
  json_t *list = ah__tools_describe();
  json_t *more = h ? ah__registry_tools(&h->reg) : NULL;
  size_t i;
  json_t *t;
  json_array_foreach(more, i, t) { /* a plugin's tool says nothing of what it does */
    json_object_set_new(t, "kind", json_string("other"));
  }
  json_array_extend(list, more);
  json_decref(more);
  return list;
}

ah__entry *ah__tool_source_of(ah_host *h, const char *name, bool staged_too) {
  const char *end = h && name ? strstr(name, "__") : NULL;
  char prefix[24];
  if (!end || (size_t)(end - name) + 2 >= sizeof prefix)
    return NULL;
  memcpy(prefix, name, (size_t)(end - name) + 2);
  prefix[end - name + 2] = '\0';
  ah__entry *e = ah__registry_find(&h->reg, AH__ENTRY_TOOL_SOURCE, prefix);
  if (!e || !e->mount)
    return NULL;
  if (staged_too && e->state == AH__ST_STAGED)
    return e;
  return e->state == AH__ST_ACTIVE && e->mount->state == AH__MOUNT_ACTIVE ? e : NULL;
}

bool ah__tool_exists(ah_host *h, const char *name) {
  return tool_find(name) != NULL || plugin_tool(h, name) != NULL ||
         ah__tool_source_of(h, name, false) != NULL;
}

const char *ah__tool_policy(ah_host *h, const char *name) {
  const tool_def *d = tool_find(name);
  if (d)
    return d->policy;
  return ah__tool_exists(h, name) ? "ask" : NULL;
}

/* ---- the tools of a session: the fixed ones and what every source lists ----------------------------------
 */

typedef struct gather {
  ah_host *host;
  json_t *tools;   /* the list being built */
  json_t *notices; /* [message] of sources left out */
  size_t waiting;  /* list calls not answered yet, plus one while they are being started */
  ah_tools_fn cb;
  void *arg;
} gather;

bool ah__tool_name_valid(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n > 64)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
          s[i] == '_' || s[i] == '-'))
      return false;
  return true;
}

static bool valid_listed_name(const char *s, const char *prefix) {
  return ah__tool_name_valid(s) && strncmp(s, prefix, strlen(prefix)) == 0 && strlen(s) > strlen(prefix);
}

static void gather_step(gather *g) {
  if (--g->waiting > 0)
    return;
  g->cb(g->tools, g->notices, g->arg);
  json_decref(g->tools);
  json_decref(g->notices);
  free(g);
}

typedef struct gather_one {
  gather *g;
  char *prefix;
} gather_one;

static void source_listed(const ah_outcome *o, void *arg) {
  gather_one *one = arg;
  gather *g = one->g;
  const json_t *listed =
      o->status == 0 && json_is_object(o->result) ? json_object_get(o->result, "tools") : o->result;
  if (o->status == 0 && json_is_object(o->result)) { /* {tools, notices}: the source's own word too */
    size_t k;
    json_t *n;
    json_array_foreach(json_object_get(o->result, "notices"), k, n) {
      if (json_is_string(n))
        json_array_append(g->notices, n);
    }
  }
  if (o->status != 0) {
    json_array_append_new(g->notices, json_sprintf("tools of %s* left out: %s", one->prefix, o->message));
  } else if (!json_is_array(listed)) {
    AH_LOG_W("tools", "tool source %s*: list answered with something other than an array", one->prefix);
  } else {
    size_t i;
    json_t *t;
    json_array_foreach(listed, i, t) {
      const char *name = json_string_value(json_object_get(t, "name"));
      const char *desc = json_string_value(json_object_get(t, "description"));
      json_t *schema = json_object_get(t, "schema");
      json_t *group = json_object_get(t, "group");
      const char *kind = json_string_value(json_object_get(t, "kind"));
      if (!valid_listed_name(name, one->prefix) || (schema && !json_is_object(schema)) ||
          (group && !json_is_string(group))) {
        AH_LOG_W("tools",
                 "tool source %s*: dropped a listed tool (name '%s'): a name [A-Za-z0-9_-]{1,64} "
                 "under the prefix, and an object schema, are required",
                 one->prefix, name ? name : "(none)");
        continue;
      }
      json_t *copy = json_pack("{s:s, s:s, s:O*, s:s}", "name", name, "description", desc ? desc : "",
                               "group", group, "kind", ah__tool_kind_valid(kind) ? kind : "other");
      json_object_set_new(copy, "schema",
                          schema ? json_deep_copy(schema) : json_pack("{s:s}", "type", "object"));
      json_array_append_new(g->tools, copy);
    }
  }
  free(one->prefix);
  free(one);
  gather_step(g);
}

int ah__tools_gather(ah_host *h, const char *session_id, const char *cwd, ah_cancel *cancel, ah_tools_fn cb,
                     void *arg) {
  if (!h || !cb)
    return AH_EINVAL;
  gather *g = calloc(1, sizeof *g);
  if (!g || !(g->tools = ah__tools_list(h)) || !(g->notices = json_array())) {
    if (g)
      json_decref(g->tools);
    free(g);
    return AH_ENOMEM;
  }
  g->host = h;
  g->cb = cb;
  g->arg = arg;
  g->waiting = 1;
  ah_caller core = {.struct_size = sizeof core, .authority = AH_AUTH_ADMIN, .surface = "core"};
  for (size_t i = 0; i < h->reg.nbuckets; i++)
    for (ah__entry *e = h->reg.buckets[i]; e; e = e->hash_next) {
      if (e->kind != AH__ENTRY_TOOL_SOURCE || e->state != AH__ST_ACTIVE || !e->mount ||
          e->mount->state != AH__MOUNT_ACTIVE)
        continue;
      gather_one *one = calloc(1, sizeof *one);
      if (!one || !(one->prefix = strdup(e->name))) {
        free(one);
        continue;
      }
      one->g = g;
      json_t *params = json_pack("{s:s?, s:s?}", "sessionId", session_id, "cwd", cwd);
      ah_call *c = NULL;
      g->waiting++;
      int rc = ah__call_new(h, e, &core, e->name, params, true, false, cancel, source_listed, one, &c);
      if (rc) {
        g->waiting--;
        free(one->prefix);
        free(one);
        continue;
      }
      if (c) /* NULL: already cancelled, and answered so */
        e->list(c, c->params, e->data);
    }
  gather_step(g); /* the one for the start: when every source answered at once, cb runs here */
  return 0;
}

/* ---- a plugin's tool: a call of its handler --------------------------------------------------------------
 */

typedef struct plugin_run {
  ah_tool_done_fn cb;
  ah_tool_progress_fn progress;
  void *arg;
} plugin_run;

static void plugin_replied(const ah_outcome *o, void *arg) {
  plugin_run *r = arg;
  if (o->status == 0) {
    r->cb(o->result, false, r->arg);
  } else {
    json_t *err = json_pack("{s:s}", "error", o->message ? o->message : ah_strerror(o->status));
    if (o->status == AH_ECANCELED)
      json_object_set_new(err, "cancelled", json_true());
    r->cb(err, true, r->arg);
    json_decref(err);
  }
  free(r);
}

static void plugin_progress(const json_t *progress, void *arg) {
  plugin_run *r = arg;
  if (r->progress)
    r->progress(progress, r->arg);
}

/* A plugin's tool (`params` {arguments, cwd, sessionId}) or a source's ({tool, …} too): a call of its
 * handler. */
static int run_plugin_tool(ah_host *h, ah__entry *e, const char *tool, const char *cwd,
                           const char *session_id, const json_t *args, ah_cancel *cancel,
                           ah_tool_progress_fn progress, ah_tool_done_fn cb, void *arg) {
  plugin_run *r = calloc(1, sizeof *r);
  if (!r)
    return AH_ENOMEM;
  r->cb = cb;
  r->progress = progress;
  r->arg = arg;
  ah_caller core = {.struct_size = sizeof core, .authority = AH_AUTH_ADMIN, .surface = "core"};
  json_t *params = json_pack("{s:O, s:s, s:s?}", "arguments", args, "cwd", cwd, "sessionId", session_id);
  if (e->kind == AH__ENTRY_TOOL_SOURCE)
    json_object_set_new(params, "tool", json_string(tool));
  ah_call *c = NULL;
  int rc = ah__call_new(h, e, &core, tool, params, true, false, cancel, plugin_replied, r, &c);
  if (rc) {
    free(r);
    return rc;
  }
  if (c) { /* NULL: the turn was already cancelled, and the call answered so */
    c->progress = plugin_progress;
    e->handler(c, c->params, e->data);
  }
  return 0;
}

json_t *ah__tools_describe(void) {
  json_t *list = json_array();
  for (size_t i = 0; list && i < NTOOLS; i++) {
    const tool_def *d = &tool_defs[i];
    json_t *params = json_object();
    for (size_t j = 0; params && j < d->nparams; j++) {
      const tool_param *p = &d->params[j];
      json_object_set_new(params, p->name,
                          json_pack("{s:s, s:s, s:b}", "type", p->type, "description", p->description,
                                    "required", p->required));
    }
    json_t *tool = json_pack("{s:s, s:s, s:o, s:s}", "name", d->name, "description", d->description, "params",
                             params ? params : json_object(), "kind", builtin_kind(d->kind));
    if (tool && d->schema)
      json_object_set_new(tool, "schema", json_loads(d->schema, 0, NULL));
    if (!tool || json_array_append_new(list, tool) != 0) {
      json_decref(list);
      return NULL;
    }
  }
  return list;
}

/* ---- lexical confinement --------------------------------------------------------------------------- */

/* The next component of *p (skipping slashes): its start and length, or false at the end. */
static bool next_component(const char **p, const char **start, size_t *len) {
  const char *s = *p;
  while (*s == '/')
    s++;
  if (!*s)
    return false;
  const char *e = s;
  while (*e && *e != '/')
    e++;
  *start = s;
  *len = (size_t)(e - s);
  *p = e;
  return true;
}

static bool is_dot(const char *s, size_t n) {
  return n == 1 && s[0] == '.';
}
static bool is_dotdot(const char *s, size_t n) {
  return n == 2 && s[0] == '.' && s[1] == '.';
}

/* Append "/name" to out (capacity PATH_MAX); false when it would not fit. */
static bool append_component(char *out, size_t *len, const char *s, size_t n) {
  if (*len + 1 + n + 1 > PATH_MAX)
    return false;
  out[(*len)++] = '/';
  memcpy(out + *len, s, n);
  *len += n;
  out[*len] = '\0';
  return true;
}

/* Drop the last component of out (never above the root). */
static void pop_component(char *out, size_t *len) {
  while (*len > 0 && out[*len - 1] != '/')
    (*len)--;
  if (*len > 0)
    (*len)--;
  out[*len] = '\0';
}

char *ah__tool_confine(const char *cwd, const char *path, const char **why) {
  const char *dummy = NULL;
  if (!why)
    why = &dummy;
  *why = NULL;
  if (!cwd || cwd[0] != '/') {
    *why = "the working directory is not an absolute path";
    return NULL;
  }
  if (!path || !*path) {
    *why = "empty path";
    return NULL;
  }
  if (strlen(path) >= PATH_MAX || strlen(cwd) >= PATH_MAX) {
    *why = "path too long";
    return NULL;
  }
  /* The cwd is trusted: normalise it lexically, ".." stopping at the root. */
  char out[PATH_MAX] = "";
  size_t len = 0;
  const char *p = cwd;
  const char *c = NULL;
  size_t n = 0;
  while (next_component(&p, &c, &n)) {
    if (is_dot(c, n))
      continue;
    if (is_dotdot(c, n))
      pop_component(out, &len);
    else if (!append_component(out, &len, c, n)) {
      *why = "path too long";
      return NULL;
    }
  }
  size_t base = len; /* the result never gets shorter than the cwd */
  p = path;
  if (path[0] == '/') {
    /* An absolute path must start with the cwd's components ("." and repeated slashes aside); what follows
     * is then treated like a relative path. */
    const char *q = out;
    const char *cc = NULL;
    size_t cn = 0;
    while (next_component(&q, &cc, &cn)) {
      bool got = false;
      while ((got = next_component(&p, &c, &n)) && is_dot(c, n)) {
      }
      if (!got || n != cn || memcmp(c, cc, n) != 0) {
        *why = "absolute path outside the working directory";
        return NULL;
      }
    }
  }
  while (next_component(&p, &c, &n)) {
    if (is_dot(c, n))
      continue;
    if (is_dotdot(c, n)) {
      if (len == base) {
        *why = "path escapes the working directory";
        return NULL;
      }
      pop_component(out, &len);
    } else if (!append_component(out, &len, c, n)) {
      *why = "path too long";
      return NULL;
    }
  }
  if (len == 0) { /* the cwd is "/" and the path names it */
    out[0] = '/';
    out[1] = '\0';
  }
  char *r = strdup(out);
  if (!r)
    *why = "out of memory";
  return r;
}

/* The part of a confined absolute path below `cwd` (normalised the same way): "." for the cwd itself. */
static const char *below_cwd(const char *confined, const char *cwd_norm) {
  size_t n = strlen(cwd_norm);
  if (strcmp(cwd_norm, "/") == 0)
    return confined[1] ? confined + 1 : ".";
  return confined[n] == '/' ? confined + n + 1 : ".";
}

/* ---- opening beneath the cwd ---------------------------------------------------------------------- */

#define MAX_LINKS 40

/* Open the directory `done` (a normalised path of real directories below dirfd; "" = dirfd itself)
 * without following any symlink. */
static int open_dir_nofollow(int dirfd, const char *done) {
  int fd = openat(dirfd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  const char *p = done;
  const char *c = NULL;
  size_t n = 0;
  char name[NAME_MAX + 1];
  while (fd >= 0 && next_component(&p, &c, &n)) {
    if (n > NAME_MAX) {
      close(fd);
      errno = ENAMETOOLONG;
      return -1;
    }
    memcpy(name, c, n);
    name[n] = '\0';
    int next = openat(fd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int saved = errno;
    close(fd);
    errno = saved;
    fd = next;
  }
  return fd;
}

int ah__tool_open_walk(int dirfd, const char *rel, int flags, mode_t mode) {
  /* `done`: the directories resolved so far (never a symlink); `todo`: what is left to resolve. */
  char done[PATH_MAX] = "";
  size_t done_len = 0;
  char todo[PATH_MAX];
  if (strlen(rel) >= sizeof todo) {
    errno = ENAMETOOLONG;
    return -1;
  }
  strcpy(todo, rel);
  int links = 0;
  for (;;) {
    const char *p = todo;
    const char *c = NULL;
    size_t n = 0;
    bool got = false;
    while ((got = next_component(&p, &c, &n)) && is_dot(c, n)) {
    }
    if (!got) {
      /* Nothing left: the object is the directory resolved so far. */
      int dfd = open_dir_nofollow(dirfd, done);
      if (dfd < 0)
        return -1;
      int fd = openat(dfd, ".", flags & ~O_CREAT, mode);
      int saved = errno;
      close(dfd);
      errno = saved;
      return fd;
    }
    if (n > NAME_MAX) {
      errno = ENAMETOOLONG;
      return -1;
    }
    char name[NAME_MAX + 1];
    memcpy(name, c, n);
    name[n] = '\0';
    memmove(todo, p, strlen(p) + 1); /* the rest, starting with '/' or empty */
    if (is_dotdot(name, n)) {
      if (done_len == 0) {
        errno = EXDEV; /* above the cwd */
        return -1;
      }
      pop_component(done, &done_len);
      continue;
    }
    const char *rest = todo;
    while (*rest == '/')
      rest++;
    bool last = *rest == '\0';
    bool want_dir = !last || (todo[0] == '/'); /* a trailing slash asks for a directory */
    int dfd = open_dir_nofollow(dirfd, done);
    if (dfd < 0)
      return -1;
    int fd = -1;
    if (last && !want_dir)
      fd = openat(dfd, name, flags | O_NOFOLLOW, mode);
    else
      fd = openat(dfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      close(dfd);
      if (last && !want_dir)
        return fd;
      close(fd);
      if (!append_component(done, &done_len, name, n)) {
        errno = ENAMETOOLONG;
        return -1;
      }
      continue;
    }
    /* Not openable as asked: a symlink (ELOOP from O_NOFOLLOW, ENOTDIR for O_DIRECTORY) is followed by
     * hand; anything else is the error. */
    int err = errno;
    char target[PATH_MAX];
    ssize_t tl = -1;
    if (err == ELOOP || err == ENOTDIR)
      tl = readlinkat(dfd, name, target, sizeof target - 1);
    close(dfd);
    if (tl < 0) {
      errno = err;
      return -1;
    }
    target[tl] = '\0';
    if (++links > MAX_LINKS) {
      errno = ELOOP;
      return -1;
    }
    if (target[0] == '/') {
      errno = EXDEV; /* RESOLVE_BENEATH refuses absolute links too */
      return -1;
    }
    if ((size_t)tl + 1 + strlen(todo) + 1 > sizeof todo) {
      errno = ENAMETOOLONG;
      return -1;
    }
    memmove(todo + tl, todo, strlen(todo) + 1); /* target + the rest */
    memcpy(todo, target, (size_t)tl);
  }
}

/* Open `rel` beneath dirfd: openat2 when the kernel has it, the walk otherwise. */
static int open_beneath(int dirfd, const char *rel, int flags, mode_t mode) {
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = (uint64_t)flags;
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  long fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof how);
  if (fd >= 0 || errno != ENOSYS)
    return (int)fd;
  return ah__tool_open_walk(dirfd, rel, flags, mode);
}

/* ---- one tool run ---------------------------------------------------------------------------------- */

typedef struct tool_run {
  ah_host *host;
  ah_mount *core;
  tool_kind kind;
  ah_tool_done_fn cb;
  void *arg;
  ah_cancel *cancel;
  /* outcome */
  json_t *result;
  char *error; /* set: is_error with {error} */
  /* file tools */
  char *cwd;      /* normalised */
  char *abs_path; /* confined */
  const char *rel;
  char *shown; /* the path as the agent gave it, for messages */
  char *content;
  size_t content_len;
  /* the host's own files (the guard): paths as configured, resolved on the pool thread */
  char *guard_dirs[2]; /* state_dir, runtime_dir */
  char *guard_file;    /* the browser's token file */
  char *guard_real[2];
  bool guard_has_file;
  dev_t guard_dev;
  ino_t guard_ino;
  /* delivery of an outcome known before any work started */
  uv_timer_t later;
  /* the session's editor: the pool only checks the path; the methods do the reading and writing */
  char *session_id;
  char *ed_read, *ed_write, *ed_run;
  bool exists; /* the path names a file on disk (checked with the path) */
  /* run_command's output as it comes: the last AH_TOOL_LIVE_TAIL bytes, reported at most every
   * AH_TOOL_LIVE_MS through `progress` as {progress: bytes so far, output: the tail} */
  ah_tool_progress_fn progress;
  char *tail;
  size_t tail_len;
  uint64_t out_bytes;
  ah_timer *tick;
  json_t *previous; /* write: the editor's text before the write (NULL: unknown) */
} tool_run;

static void run_free(tool_run *r) {
  json_decref(r->result);
  free(r->error);
  free(r->cwd);
  free(r->abs_path);
  free(r->shown);
  free(r->content);
  for (int i = 0; i < 2; i++) {
    free(r->guard_dirs[i]);
    free(r->guard_real[i]);
  }
  free(r->guard_file);
  free(r->session_id);
  free(r->ed_read);
  free(r->ed_write);
  free(r->ed_run);
  json_decref(r->previous);
  if (r->tick)
    ah__services_timer_stop(r->tick);
  free(r->tail);
  free(r);
}

static void set_error(tool_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(tool_run *r, const char *fmt, ...) {
  free(r->error);
  r->error = NULL;
  json_decref(r->result);
  r->result = NULL;
  va_list ap;
  va_start(ap, fmt);
  if (vasprintf(&r->error, fmt, ap) < 0)
    r->error = NULL;
  va_end(ap);
  if (!r->error)
    r->error = strdup("out of memory");
}

/* Hand the outcome to the caller. */
static void deliver(tool_run *r) {
  if (!r->error && !r->result)
    set_error(r, "out of memory");
  if (r->error) {
    json_t *e = json_pack("{s:s}", "error", r->error ? r->error : "out of memory");
    r->cb(e ? e : json_null(), true, r->arg);
    json_decref(e);
  } else {
    r->cb(r->result, false, r->arg);
  }
}

static void later_closed(uv_handle_t *h) {
  run_free(h->data);
}

static void later_fired(uv_timer_t *t) {
  tool_run *r = t->data;
  deliver(r);
  uv_close((uv_handle_t *)t, later_closed);
}

/* The outcome is already known (a refused path, a command that could not start): deliver it on a later
 * loop turn, never from inside ah__tool_run. */
static void deliver_later(tool_run *r) {
  uv_timer_init(ah__host_loop(r->host), &r->later);
  r->later.data = r;
  uv_timer_start(&r->later, later_fired, 0, 0);
}

static const char *errno_text(int err) {
  switch (err) {
  case EXDEV:
    return "path escapes the working directory (through a symbolic link)";
  case ELOOP:
    return "too many levels of symbolic links, or a link the tools do not follow";
  default: {
    const char *d = strerrordesc_np(err); /* static strings, safe on a pool thread */
    return d ? d : "unknown error";
  }
  }
}

/* ---- file tools (pool thread) ---------------------------------------------------------------------- */

/* Resolve the guarded paths (pool thread: realpath and stat touch the file system). */
static void guard_prepare(tool_run *r) {
  for (int i = 0; i < 2; i++)
    if (r->guard_dirs[i])
      r->guard_real[i] = realpath(r->guard_dirs[i], NULL);
  struct stat st;
  if (r->guard_file && stat(r->guard_file, &st) == 0) {
    r->guard_has_file = true;
    r->guard_dev = st.st_dev;
    r->guard_ino = st.st_ino;
  }
}

/* Whether `fd` (opened by a file tool) is one of the host's own files; sets the error when it is. */
static bool guarded(tool_run *r, int fd) {
  struct stat st;
  if (r->guard_has_file && fstat(fd, &st) == 0 && st.st_dev == r->guard_dev && st.st_ino == r->guard_ino) {
    set_error(r, "%s: refused: it is the host's access token", r->shown);
    return true;
  }
  char link[64], path[PATH_MAX + 1];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, PATH_MAX);
  if (n <= 0) {
    set_error(r, "%s: refused: cannot tell where it is (%s)", r->shown, errno_text(errno));
    return true;
  }
  path[n] = '\0';
  static const char *const what[2] = {"state", "runtime"};
  for (int i = 0; i < 2; i++) {
    const char *g = r->guard_real[i];
    size_t gl = g ? strlen(g) : 0;
    if (gl == 0)
      continue;
    if (gl == 1 || (strncmp(path, g, gl) == 0 && (path[gl] == '\0' || path[gl] == '/'))) {
      set_error(r, "%s: refused: it is in the host's %s directory", r->shown, what[i]);
      return true;
    }
  }
  return false;
}

static void do_read(tool_run *r, int dirfd) {
  int fd = open_beneath(dirfd, r->rel, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0);
  if (fd < 0) {
    set_error(r, "cannot open %s: %s", r->shown, errno_text(errno));
    return;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    set_error(r, "%s is not a regular file", r->shown);
    close(fd);
    return;
  }
  if (guarded(r, fd)) {
    close(fd);
    return;
  }
  size_t cap = AH_TOOL_MAX_READ + 1; /* one more byte tells whether there is more */
  char *buf = malloc(cap);
  if (!buf) {
    close(fd);
    set_error(r, "out of memory");
    return;
  }
  size_t len = 0;
  while (len < cap) {
    ssize_t k = read(fd, buf + len, cap - len);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0) {
      set_error(r, "cannot read %s: %s", r->shown, errno_text(errno));
      close(fd);
      free(buf);
      return;
    }
    if (k == 0)
      break;
    len += (size_t)k;
  }
  close(fd);
  bool truncated = len > AH_TOOL_MAX_READ;
  if (truncated)
    len = AH_TOOL_MAX_READ;
  const unsigned char *u = (const unsigned char *)buf;
  for (size_t i = 0; i < len;) {
    bool cut = false;
    int k = u[i] == 0 ? 0 : ah__utf8_seq(u + i, len - i, &cut);
    if (k > 0) {
      i += (size_t)k;
      continue;
    }
    if (truncated && cut) { /* the cap split a character: end before it */
      len = i;
      break;
    }
    set_error(r, "%s: binary file (not UTF-8 text)", r->shown);
    free(buf);
    return;
  }
  r->result =
      json_pack("{s:s%, s:I, s:b}", "content", buf, len, "bytes", (json_int_t)len, "truncated", truncated);
  free(buf);
}

/* The UTF-8 text a file held (at most AH_TOOL_MAX_READ bytes), or NULL: too long, not text, unreadable. */
static json_t *previous_text(int fd, const struct stat *st) {
  if (st->st_size > AH_TOOL_MAX_READ)
    return NULL;
  size_t n = (size_t)st->st_size;
  char *buf = malloc(n + 1);
  size_t got = 0;
  while (buf && got < n) {
    ssize_t k = pread(fd, buf + got, n - got, (off_t)got);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      break;
    got += (size_t)k;
  }
  json_t *text =
      buf && got == n && memchr(buf, 0, n) == NULL ? json_stringn(buf, n) : NULL; /* NULL: not UTF-8 */
  free(buf);
  return text;
}

/* The directory the file is in: beneath the cwd and not one of the host's own (false with the error). */
static bool parent_allowed(tool_run *r, int dirfd, const char *for_what) {
  char *parent = strdup(r->rel);
  if (!parent) {
    set_error(r, "out of memory");
    return false;
  }
  char *slash = strrchr(parent, '/');
  if (slash)
    *slash = '\0';
  int pfd = open_beneath(dirfd, slash ? parent : ".", O_PATH | O_DIRECTORY | O_CLOEXEC, 0);
  free(parent);
  if (pfd < 0) {
    set_error(r, "cannot open %s%s: %s", r->shown, for_what, errno_text(errno));
    return false;
  }
  bool refused = guarded(r, pfd);
  close(pfd);
  return !refused;
}

static void do_write(tool_run *r, int dirfd) {
  /* The directory the file goes in is checked before anything is created in it. */
  if (!parent_allowed(r, dirfd, " for writing"))
    return;
  /* No O_TRUNC: the file itself is checked (the token by inode) before it is emptied, and what it held is
   * read first (the text before the write, for a client that shows the change as a diff). */
  bool created = false;
  int fd = open_beneath(dirfd, r->rel, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0);
  if (fd < 0 && errno == ENOENT) {
    created = true;
    fd = open_beneath(dirfd, r->rel, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0644);
  } else if (fd < 0 && errno == EACCES) { /* writable, not readable: no text before */
    fd = open_beneath(dirfd, r->rel, O_WRONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0);
  }
  if (fd < 0) {
    set_error(r, "cannot open %s for writing: %s", r->shown, errno_text(errno));
    return;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    set_error(r, "%s is not a regular file", r->shown);
    close(fd);
    return;
  }
  if (guarded(r, fd)) {
    close(fd);
    return;
  }
  json_t *previous = created ? json_null() : previous_text(fd, &st);
  if (ftruncate(fd, 0) != 0) {
    json_decref(previous);
    set_error(r, "cannot write %s: %s", r->shown, errno_text(errno));
    close(fd);
    return;
  }
  size_t done = 0;
  while (done < r->content_len) {
    ssize_t k = write(fd, r->content + done, r->content_len - done);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0) {
      set_error(r, "cannot write %s: %s", r->shown, errno_text(errno));
      close(fd);
      json_decref(previous);
      return;
    }
    done += (size_t)k;
  }
  if (close(fd) != 0) {
    set_error(r, "cannot write %s: %s", r->shown, errno_text(errno));
    json_decref(previous);
    return;
  }
  r->result = json_pack("{s:s, s:I}", "path", r->abs_path, "bytes", (json_int_t)done);
  if (previous && r->result)
    json_object_set(r->result, AH_TOOL_PREVIOUS, previous);
  json_decref(previous);
}

typedef struct dir_entry {
  char *name;
  const char *type;
  json_int_t size;
} dir_entry;

static int entry_cmp(const void *a, const void *b) {
  return strcmp(((const dir_entry *)a)->name, ((const dir_entry *)b)->name);
}

static void do_list(tool_run *r, int cwdfd) {
  int fd = open_beneath(cwdfd, r->rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (fd >= 0 && guarded(r, fd)) {
    close(fd);
    return;
  }
  if (fd < 0) {
    set_error(r, "cannot open directory %s: %s", r->shown, errno_text(errno));
    return;
  }
  DIR *d = fdopendir(fd);
  if (!d) {
    set_error(r, "cannot list %s: %s", r->shown, errno_text(errno));
    close(fd);
    return;
  }
  dir_entry *ents = NULL;
  size_t n = 0, cap = 0;
  bool nomem = false;
  struct dirent *e = NULL;
  while (!nomem && (e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT)
        continue; /* removed while we listed */
      memset(&st, 0, sizeof st);
    }
    if (n == cap) {
      size_t ncap = cap ? cap * 2 : 64;
      dir_entry *grown = realloc(ents, ncap * sizeof *ents);
      if (!grown) {
        nomem = true;
        break;
      }
      ents = grown;
      cap = ncap;
    }
    dir_entry *de = &ents[n];
    de->name = strdup(e->d_name);
    if (!de->name) {
      nomem = true;
      break;
    }
    de->type = S_ISREG(st.st_mode)   ? "file"
               : S_ISDIR(st.st_mode) ? "dir"
               : S_ISLNK(st.st_mode) ? "symlink"
                                     : "other";
    de->size = (json_int_t)st.st_size;
    n++;
  }
  closedir(d);
  if (!nomem && n > 1)
    qsort(ents, n, sizeof *ents, entry_cmp);
  json_t *list = nomem ? NULL : json_array();
  for (size_t i = 0; list && i < n; i++) {
    json_t *name = ah__json_lossy_string(ents[i].name, strlen(ents[i].name)); /* names need not be UTF-8 */
    json_t *item =
        name ? json_pack("{s:o, s:s, s:I}", "name", name, "type", ents[i].type, "size", ents[i].size) : NULL;
    if (!item || json_array_append_new(list, item) != 0) {
      json_decref(list);
      list = NULL;
    }
  }
  for (size_t i = 0; i < n; i++)
    free(ents[i].name);
  free(ents);
  if (!list) {
    set_error(r, "out of memory");
    return;
  }
  r->result = json_pack("{s:o}", "entries", list);
}

/* For the editor: the same confinement as a read or write of the disk (the parent beneath the cwd, the
 * file itself if it exists, neither one of the host's own files), without reading or writing. */
static void do_check(tool_run *r, int dirfd) {
  if (!parent_allowed(r, dirfd, ""))
    return;
  int fd = open_beneath(dirfd, r->rel, O_PATH | O_CLOEXEC, 0);
  if (fd < 0 && errno != ENOENT) {
    set_error(r, "cannot open %s: %s", r->shown, errno_text(errno));
    return;
  }
  r->exists = fd >= 0;
  if (fd >= 0) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
      set_error(r, "%s is not a regular file", r->shown);
    else
      (void)guarded(r, fd);
    close(fd);
  }
}

/* The file tool goes through the session's editor (its method for this tool is set). */
static bool via_editor(const tool_run *r) {
  return (r->kind == TOOL_READ_FILE && r->ed_read) || (r->kind == TOOL_WRITE_FILE && r->ed_write);
}

static void file_work(void *arg) {
  tool_run *r = arg;
  if (ah__cancel_tripped(r->cancel)) {
    set_error(r, "cancelled");
    return;
  }
  int dirfd = open(r->cwd, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) {
    set_error(r, "cannot open the working directory: %s", errno_text(errno));
    return;
  }
  guard_prepare(r);
  bool edited = via_editor(r);
  switch (edited ? TOOL_INVALID : r->kind) {
  case TOOL_INVALID:
    do_check(r, dirfd);
    break;
  case TOOL_READ_FILE:
    do_read(r, dirfd);
    break;
  case TOOL_WRITE_FILE:
    do_write(r, dirfd);
    break;
  case TOOL_LIST_DIR:
    do_list(r, dirfd);
    break;
  default:
    set_error(r, "internal error: not a file tool");
    break;
  }
  close(dirfd);
}

/* ---- the editor's files ---------------------------------------------------------------------------- */

static void editor_call(tool_run *r, const char *method, json_t *params, ah_reply_fn cb);

/* The text a read answered: cut at AH_TOOL_MAX_READ (at a character) as a read of the disk is. */
static json_t *read_result(const char *text, size_t len) {
  bool truncated = len > AH_TOOL_MAX_READ;
  size_t n = truncated ? AH_TOOL_MAX_READ : len;
  while (truncated && n > 0 && ((unsigned char)text[n] & 0xC0) == 0x80)
    n--;
  return json_pack("{s:s%, s:I, s:b}", "content", text, n, "bytes", (json_int_t)len, "truncated", truncated);
}

static void editor_failed(tool_run *r, const ah_outcome *o, const char *what) {
  if (o->status == AH_ECANCELED)
    set_error(r, "cancelled");
  else
    set_error(r, "the editor could not %s %s: %s", what, r->shown,
              o->message ? o->message : ah_strerror(o->status));
}

static void editor_written(const ah_outcome *o, void *arg) {
  tool_run *r = arg;
  if (o->status) {
    editor_failed(r, o, "write");
  } else {
    r->result = json_pack("{s:s, s:I}", "path", r->abs_path, "bytes", (json_int_t)r->content_len);
    if (r->result && r->previous)
      json_object_set(r->result, AH_TOOL_PREVIOUS, r->previous);
  }
  deliver(r);
  run_free(r);
}

static void editor_write(tool_run *r) {
  json_t *params = json_pack("{s:s, s:s, s:s%}", "sessionId", r->session_id, "path", r->abs_path, "content",
                             r->content, r->content_len);
  editor_call(r, r->ed_write, params, editor_written);
}

static void editor_read_done(const ah_outcome *o, void *arg) {
  tool_run *r = arg;
  json_t *content = json_object_get(o->result, "content");
  if (r->kind == TOOL_WRITE_FILE) {
    /* The text before the write, for a client's diff: the editor's, else none for a new file. */
    if (o->status == 0 && json_is_string(content) && json_string_length(content) <= AH_TOOL_MAX_READ)
      r->previous = json_incref(content);
    else if (!r->exists)
      r->previous = json_null();
    editor_write(r);
    return;
  }
  if (o->status)
    editor_failed(r, o, "read");
  else if (!json_is_string(content))
    set_error(r, "the editor answered the read of %s without a text content", r->shown);
  else
    r->result = read_result(json_string_value(content), json_string_length(content));
  deliver(r);
  run_free(r);
}

static void editor_call(tool_run *r, const char *method, json_t *params, ah_reply_fn cb) {
  ah_caller core = {.struct_size = sizeof core, .authority = AH_AUTH_ADMIN, .surface = "core"};
  int rc = params ? ah__host_dispatch(r->host, &core, method, params, r->cancel, cb, r) : AH_ENOMEM;
  if (rc) {
    set_error(r, "the editor is not available (%s): %s", method, ah_strerror(rc));
    deliver_later(r);
  }
}

/* run_command in the editor's terminal: its answer as run_command's result (the terminal's output is
 * stdout; a terminal has no separate stderr). */
static void editor_ran(const ah_outcome *o, void *arg) {
  tool_run *r = arg;
  const json_t *res = o->result;
  json_t *code = json_object_get(res, "exitCode");
  json_t *sig = json_object_get(res, "signal");
  const char *output = json_string_value(json_object_get(res, "output"));
  if (o->status == AH_ECANCELED) {
    r->result = json_pack("{s:n, s:n, s:s, s:s, s:b, s:b, s:b}", "exitCode", "signal", "stdout", "", "stderr",
                          "", "truncated", 0, "timedOut", 0, "cancelled", 1);
  } else if (o->status) {
    set_error(r, "the editor could not run the command: %s",
              o->message ? o->message : ah_strerror(o->status));
  } else if (!output || (code && !json_is_integer(code) && !json_is_null(code)) ||
             (sig && !json_is_string(sig) && !json_is_null(sig))) {
    set_error(r, "the editor's terminal answered without an output");
  } else {
    r->result = json_pack("{s:O, s:O, s:s, s:s, s:b, s:b, s:b}", "exitCode", code ? code : json_null(),
                          "signal", sig ? sig : json_null(), "stdout", output, "stderr", "", "truncated",
                          json_is_true(json_object_get(res, "truncated")), "timedOut",
                          json_is_true(json_object_get(res, "timedOut")), "cancelled", 0);
    json_t *tid = json_object_get(res, "terminalId");
    if (r->result && json_is_string(tid))
      json_object_set(r->result, "terminalId", tid);
  }
  deliver(r);
  run_free(r);
}

static void file_after(void *arg, int status) {
  tool_run *r = arg;
  if (status == AH_ECANCELED)
    set_error(r, "cancelled: the host is stopping");
  bool edited = via_editor(r);
  if (edited && !r->error) {
    if (r->kind == TOOL_WRITE_FILE && !r->ed_read) {
      if (!r->exists)
        r->previous = json_null();
      editor_write(r);
    } else { /* a write asks for the text before it too: the editor may hold a buffer the disk has not */
      editor_call(r, r->ed_read, json_pack("{s:s, s:s}", "sessionId", r->session_id, "path", r->abs_path),
                  editor_read_done);
    }
    return;
  }
  deliver(r);
  run_free(r);
}

/* ---- run_command ----------------------------------------------------------------------------------- */

static json_t *signal_name(int sig) {
  if (sig == 0)
    return json_null();
  const char *abbrev = sigabbrev_np(sig);
  return abbrev ? json_sprintf("SIG%s", abbrev) : json_sprintf("SIG%d", sig);
}

static void command_done(const ah_command_result *res, void *arg) {
  tool_run *r = arg;
  if (r->tick) { /* the result has all of it: no live report after it */
    ah__services_timer_stop(r->tick);
    r->tick = NULL;
  }
  if (res->error && !res->cancelled) {
    set_error(r, "cannot run the command: %s", res->error);
  } else {
    r->result =
        json_pack("{s:o, s:o, s:o, s:o, s:b, s:b, s:b}", "exitCode",
                  res->error || res->signal ? json_null() : json_integer((json_int_t)res->exit_code),
                  "signal", signal_name(res->signal), "stdout", ah__json_lossy_string(res->out, res->out_len),
                  "stderr", ah__json_lossy_string(res->err, res->err_len), "truncated", res->truncated,
                  "timedOut", res->timed_out, "cancelled", res->cancelled);
  }
  deliver(r);
  run_free(r);
}

#define AH_TOOL_LIVE_TAIL (16 * 1024)
#define AH_TOOL_LIVE_MS 100

static void live_report(ah_timer *t, void *arg) {
  (void)t;
  tool_run *r = arg;
  r->tick = NULL; /* a one-shot timer is freed after its callback */
  json_t *p = json_pack("{s:I, s:o}", "progress", (json_int_t)r->out_bytes, "output",
                        ah__json_lossy_string(r->tail, r->tail_len));
  if (p)
    r->progress(p, r->arg);
  json_decref(p);
}

/* A chunk of the command's output (both streams, in the order read): kept as the tail, reported soon. */
static void live_output(void *arg, int stream, const char *data, size_t len) {
  (void)stream;
  tool_run *r = arg;
  if (!r->tail && !(r->tail = malloc(AH_TOOL_LIVE_TAIL)))
    return;
  r->out_bytes += len;
  if (len >= AH_TOOL_LIVE_TAIL) {
    memcpy(r->tail, data + len - AH_TOOL_LIVE_TAIL, AH_TOOL_LIVE_TAIL);
    r->tail_len = AH_TOOL_LIVE_TAIL;
  } else {
    if (r->tail_len + len > AH_TOOL_LIVE_TAIL) {
      size_t drop = r->tail_len + len - AH_TOOL_LIVE_TAIL;
      memmove(r->tail, r->tail + drop, r->tail_len - drop);
      r->tail_len -= drop;
    }
    memcpy(r->tail + r->tail_len, data, len);
    r->tail_len += len;
  }
  if (!r->tick && r->core)
    (void)ah__services_timer_start(r->core, AH_TOOL_LIVE_MS, 0, live_report, r, &r->tick);
}

static int start_command(tool_run *r, const char *command, uint64_t timeout_ms) {
  const char *argv[] = {"/bin/sh", "-c", command, NULL};
  ah_command_opts o = {
      .argv = argv,
      .env = NULL, /* the allowlist and nothing else (SECURITY.md T7, G10) */
      .cwd = r->cwd,
      .max_output = AH_TOOL_MAX_OUTPUT,
      .timeout_ms = timeout_ms,
      .kill_grace_ms = AH_TOOL_KILL_GRACE_MS,
      .cancel = r->cancel,
      .on_output = r->progress ? live_output : NULL,
      .output_arg = r,
  };
  return ah__command_run(r->host, &o, command_done, r);
}

/* ---- arguments and dispatch ------------------------------------------------------------------------ */

#define PLAN_MAX_ENTRIES 100
#define PLAN_MAX_CONTENT 1000

static bool one_of(const char *v, const char *const *set) {
  for (; v && *set; set++)
    if (strcmp(v, *set) == 0)
      return true;
  return false;
}

/* update_plan {entries: [{content, status, priority?}]} (its schema in tool_defs). */
static bool plan_valid(const json_t *args) {
  static const char *const statuses[] = {"pending", "in_progress", "completed", NULL};
  static const char *const priorities[] = {"high", "medium", "low", NULL};
  json_t *entries = json_object_get(args, "entries");
  if (json_object_size(args) != 1 || !json_is_array(entries) || json_array_size(entries) > PLAN_MAX_ENTRIES) {
    AH_LOG_W("tools", "refused update_plan: field entries: an array of at most %d steps, and nothing else",
             PLAN_MAX_ENTRIES);
    return false;
  }
  size_t i;
  json_t *e;
  json_array_foreach(entries, i, e) {
    json_t *content = json_object_get(e, "content");
    json_t *priority = json_object_get(e, "priority");
    size_t keys = 2 + (priority != NULL);
    if (!json_is_object(e) || json_object_size(e) != keys || !json_is_string(content) ||
        json_string_length(content) == 0 || json_string_length(content) > PLAN_MAX_CONTENT ||
        !one_of(json_string_value(json_object_get(e, "status")), statuses) ||
        (priority && !one_of(json_string_value(priority), priorities))) {
      AH_LOG_W("tools", "refused update_plan: field entries[%zu]: {content (1..%d bytes), status, priority?}",
               i, PLAN_MAX_CONTENT);
      return false;
    }
  }
  return true;
}

/* Every key of args must be a parameter of the tool, every required one present with its type. */
static bool args_valid(const tool_def *d, const json_t *args) {
  if (d->kind == TOOL_UPDATE_PLAN)
    return plan_valid(args);
  const char *key = NULL;
  json_t *v = NULL;
  json_object_foreach((json_t *)args, key, v) {
    const tool_param *p = NULL;
    for (size_t i = 0; i < d->nparams; i++)
      if (strcmp(d->params[i].name, key) == 0)
        p = &d->params[i];
    if (!p) {
      AH_LOG_W("tools", "refused %s: field %s: unknown parameter", d->name, key);
      return false;
    }
    bool ok = strcmp(p->type, "string") == 0 ? json_is_string(v) : json_is_integer(v);
    if (!ok) {
      AH_LOG_W("tools", "refused %s: field %s: must be a%s %s", d->name, key, p->type[0] == 'i' ? "n" : "",
               p->type);
      return false;
    }
  }
  for (size_t i = 0; i < d->nparams; i++)
    if (d->params[i].required && !json_object_get(args, d->params[i].name)) {
      AH_LOG_W("tools", "refused %s: field %s: missing", d->name, d->params[i].name);
      return false;
    }
  return true;
}

int ah__tool_run(ah_host *h, const char *cwd, const char *name, const json_t *args, ah_cancel *cancel,
                 ah_tool_done_fn cb, void *arg) {
  return ah__tool_run_in(h, NULL, cwd, name, args, cancel, NULL, cb, arg);
}

int ah__tool_run_in(ah_host *h, const char *session_id, const char *cwd, const char *name, const json_t *args,
                    ah_cancel *cancel, ah_tool_progress_fn progress, ah_tool_done_fn cb, void *arg) {
  return ah__tool_run_edited(h, session_id, cwd, name, args, NULL, cancel, progress, cb, arg);
}

int ah__tool_run_edited(ah_host *h, const char *session_id, const char *cwd, const char *name,
                        const json_t *args, const ah__tool_editor *editor, ah_cancel *cancel,
                        ah_tool_progress_fn progress, ah_tool_done_fn cb, void *arg) {
  if (!h || !cb || !cwd || cwd[0] != '/' || !json_is_object(args))
    return AH_EINVAL;
  const tool_def *d = tool_find(name);
  ah__entry *pe = d ? NULL : plugin_tool(h, name);
  if (!d && !pe)
    pe = ah__tool_source_of(h, name, false);
  if (pe)
    return run_plugin_tool(h, pe, name, cwd, session_id, args, cancel, progress, cb, arg);
  if (!d) {
    AH_LOG_W("tools", "refused tool '%s': unknown tool", name ? name : "(null)");
    return AH_EINVAL;
  }
  if (!args_valid(d, args))
    return AH_EINVAL;
  const char *command = NULL;
  uint64_t timeout_ms = AH_TOOL_DEFAULT_TIMEOUT_MS;
  if (d->kind == TOOL_RUN_COMMAND) {
    json_t *c = json_object_get(args, "command");
    command = json_string_value(c);
    if (!*command || strlen(command) != json_string_length(c)) {
      AH_LOG_W("tools", "refused run_command: field command: %s", *command ? "contains a NUL byte" : "empty");
      return AH_EINVAL;
    }
    json_t *t = json_object_get(args, "timeout_ms");
    if (t) {
      json_int_t v = json_integer_value(t);
      if (v < 1) {
        AH_LOG_W("tools", "refused run_command: field timeout_ms: must be at least 1");
        return AH_EINVAL;
      }
      timeout_ms = v > AH_TOOL_MAX_TIMEOUT_MS ? AH_TOOL_MAX_TIMEOUT_MS : (uint64_t)v;
    }
  }
  ah_mount *core = ah__host_core_mount(h);
  tool_run *r = calloc(1, sizeof *r);
  if (!r)
    return AH_ENOMEM;
  r->host = h;
  r->core = core;
  r->kind = d->kind;
  r->cb = cb;
  r->arg = arg;
  r->cancel = cancel;
  r->progress = progress;
  if (editor && session_id && (d->kind == TOOL_READ_FILE || d->kind == TOOL_WRITE_FILE)) {
    r->session_id = strdup(session_id);
    r->ed_read = ah__strdup(editor->read);
    r->ed_write = ah__strdup(editor->write);
    if (!r->session_id || (editor->read && !r->ed_read) || (editor->write && !r->ed_write)) {
      run_free(r);
      return AH_ENOMEM;
    }
  }
  const char *why = NULL;
  r->cwd = ah__tool_confine(cwd, ".", &why); /* the cwd, normalised */
  if (!r->cwd) {
    run_free(r);
    return why && strcmp(why, "out of memory") == 0 ? AH_ENOMEM : AH_EINVAL;
  }
  if (!core) {
    set_error(r, "the host is stopping");
    deliver_later(r);
    return 0;
  }
  if (d->kind == TOOL_UPDATE_PLAN) { /* the plan is the call itself: the sessions show it */
    r->result = json_pack("{s:I}", "steps", (json_int_t)json_array_size(json_object_get(args, "entries")));
    deliver_later(r);
    return 0;
  }
  if (d->kind == TOOL_RUN_COMMAND && editor && editor->run && session_id) {
    if (!(r->ed_run = strdup(editor->run))) {
      run_free(r);
      return AH_ENOMEM;
    }
    json_t *params = json_pack("{s:s, s:s?, s:s?, s:s, s:s, s:I}", "sessionId", session_id, "turnId",
                               editor->turn_id, "callId", editor->call_id, "command", command, "cwd", r->cwd,
                               "timeoutMs", (json_int_t)timeout_ms);
    editor_call(r, r->ed_run, params, editor_ran);
    return 0;
  }
  if (d->kind == TOOL_RUN_COMMAND) {
    int rc = start_command(r, command, timeout_ms);
    if (rc)
      run_free(r);
    return rc;
  }
  json_t *pv = json_object_get(args, "path");
  const char *path = json_string_value(pv);
  r->shown = strdup(path);
  if (!r->shown) {
    run_free(r);
    return AH_ENOMEM;
  }
  const ah_config *cfg = ah__host_config(h);
  if (cfg) {
    char token[PATH_MAX];
    ah__config_token_path(cfg, token, sizeof token);
    r->guard_dirs[0] = ah__strdup(cfg->state_dir);
    r->guard_dirs[1] = ah__strdup(cfg->runtime_dir);
    r->guard_file = strdup(token);
  }
  if (d->kind == TOOL_WRITE_FILE) {
    json_t *cv = json_object_get(args, "content");
    r->content_len = json_string_length(cv);
    r->content = malloc(r->content_len + 1);
    if (!r->content) {
      run_free(r);
      return AH_ENOMEM;
    }
    memcpy(r->content, json_string_value(cv), r->content_len + 1);
  }
  if (strlen(path) != json_string_length(pv)) {
    set_error(r, "path contains a NUL byte");
  } else if (ah__cancel_tripped(cancel)) {
    set_error(r, "cancelled");
  } else {
    r->abs_path = ah__tool_confine(r->cwd, path, &why);
    if (!r->abs_path)
      set_error(r, "%s: %s", path, why ? why : "refused");
    else
      r->rel = below_cwd(r->abs_path, r->cwd);
  }
  if (r->error) {
    deliver_later(r);
    return 0;
  }
  int rc = ah__services_queue_work(core, file_work, file_after, r);
  if (rc == AH_ENOMEM) {
    run_free(r);
    return rc;
  }
  if (rc) {
    set_error(r, "cannot run %s: %s", d->name, rc == AH_ESTATE ? "the host is stopping" : ah_strerror(rc));
    deliver_later(r);
  }
  return 0;
}
