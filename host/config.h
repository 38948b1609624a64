/* agenthost — configuration (internal): INI through libinih, environment, command line.
 *
 * Precedence: command line > environment (AGENTHOST_<SECTION>_<KEY>, upper-cased, dots → underscores,
 * e.g. AGENTHOST_HOST_STATE_DIR, AGENTHOST_PLUGIN_BROWSER_LISTEN) > file > defaults. Within one layer
 * the last occurrence of a key wins (a duplicate key or section in the file is not an error).
 * Defaults follow XDG: state_dir = $XDG_STATE_HOME/agenthost (else $HOME/.local/state/agenthost);
 * runtime_dir = $XDG_RUNTIME_DIR/agenthost (else state_dir/run); an XDG or HOME variable that is empty
 * or relative is ignored, as the XDG spec says. plugin_dir = AH_BUILD_PLUGIN_DIR when the running
 * executable is in AH_BUILD_HOST_DIR (then a plugin's default path is plugin_dir/NAME/NAME.so, the build
 * tree's layout), else AH_INSTALL_PLUGIN_DIR (compile-time). log_level = info; default_provider = echo,
 * and [provider.echo] type = echo always exists. Plugins browser and remote exist by default with
 * enabled = true, modes = serve; any other plugin starts with enabled = false, modes = serve.
 *
 * Names and the environment. Plugin and provider names match [a-z][a-z0-9-]* (at most 40 characters);
 * keys of plugins and providers match [a-z][a-z0-9_]* (at most 64). Other names are refused, so a name
 * can never carry "/", "..", blanks or upper case into a path or a message. In a variable name a name is
 * upper-cased with '-' written as '_', the key upper-cased: [plugin.my-ui] token_file is
 * AGENTHOST_PLUGIN_MY_UI_TOKEN_FILE. Since both '-' and the separator become '_', a variable
 * AGENTHOST_PLUGIN_<REST> is split like this: if exactly one plugin known from the defaults or the file
 * has a name whose variable form is a prefix of REST followed by '_', that is the plugin and the rest is
 * the key; if several are, the variable is refused as ambiguous; if none is, the name is the part before
 * the first '_' (so the environment alone can only create plugins whose names have no '-').
 * AGENTHOST_PROVIDER_<REST> works the same way; AGENTHOST_HOST_<KEY> sets a [host] key;
 * AGENTHOST_CONFIG names the file. Other AGENTHOST_* variables, and unknown [host] keys, are warned
 * about and ignored. An empty AGENTHOST_CONFIG counts as unset; other empty values are values.
 * Config file: --config FILE, else AGENTHOST_CONFIG, else $XDG_CONFIG_HOME/agenthost/agenthost.ini
 * (else $HOME/.config/agenthost/agenthost.ini) when it exists; an explicitly named file must exist.
 *
 * The file: libinih syntax, where ';' or '#' starts a comment line and " ;" an inline comment; leading
 * blanks are ignored (no multi-line values); a line may be at most as long as libinih's line buffer
 * (197 bytes in Debian's build), the file at most 4 MiB; NUL bytes, control characters and invalid UTF-8
 * are refused with the line.
 *
 * Sections: [host] with state_dir, runtime_dir, plugin_dir, log_level, default_provider, synchronous
 * (the store's durability: off | normal | full, default normal), default_mode (ask | accept_edits |
 * read_only), prices (an absolute path of a price table, checked at load), record_dir, record_surfaces,
 * record_max_bytes, record_max_files (recordings of the surfaces' connections); [hook.NAME] with event,
 * command, args, env, match (lists: comma-separated, or a JSON array of strings), cwd, timeout_ms, on_error,
 * enabled (docs/hooks.md); event and command are required; [plugin.NAME] with enabled (bool), modes (comma
 * list of serve|sdk|acp), path (the module file, default plugin_dir/NAME.so) and the plugin's own keys;
 * [provider.NAME] with type = echo or the name of the plugin that provides the type (acp, openai, …) and its
 * keys. Unknown [host] keys and unknown sections are warned about (logged), not fatal. A bad value (a bool
 * that is not true/false/yes/no/on/off/1/0, an unknown log level, a relative path where an absolute one is
 * needed, an unknown mode, a bad section or plugin name) is an error naming file:line and the key; for the
 * environment the variable name, for the command line the flag. A provider other than echo, acp or openai
 * needs a type; default_provider must name a configured provider. Values of keys whose name contains token,
 * key, secret or password never appear in a message or a log line. Command-line flags: --state-dir,
 * --runtime-dir, --plugin-dir, --log-level set [host]; --listen and
 * --token-file set [plugin.browser] listen and token_file (kept as given).
 */
#ifndef AGENTHOST_HOST_CONFIG_H
#define AGENTHOST_HOST_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "log.h"

/* What the command line set (NULL / AH_LOG_INVALID = not given). Borrowed strings. */
typedef struct ah_cli_overrides {
  const char *config_file;
  const char *state_dir;
  const char *runtime_dir;
  const char *plugin_dir;
  const char *listen;     /* becomes [plugin.browser] listen */
  const char *token_file; /* becomes [plugin.browser] token_file */
  const char *log_level;
} ah_cli_overrides;

typedef struct ah_config {
  char *file;        /* the file that was read, or NULL */
  char *state_dir;   /* absolute */
  char *runtime_dir; /* absolute */
  char *plugin_dir;  /* absolute */
  ah_log_level log_level;
  char *default_provider;
  char *synchronous;  /* "off" | "normal" | "full" */
  char *default_mode; /* a new session's mode: "ask" (the default) | "accept_edits" | "read_only" */
  char *prices;       /* a price table file (docs/usage.md), or NULL: costs are not computed */
  /* Recordings (docs/usage.md "Recordings"): the directory (NULL: off), the surfaces recorded (a list of
   * plugin names; NULL: every one), the size of a part in bytes (0: 64 MiB) and the parts kept (0: 8). */
  char *record_dir;
  json_t *record_surfaces;
  uint64_t record_max_bytes;
  int record_max_files;
  /* [host] idle_unload_s: how long a live session with nothing going on stays in memory (ms); 0: the
   * default (15 minutes); UINT64_MAX: never (idle_unload_s = 0). */
  uint64_t idle_unload_ms;
  /* [host] lease_ttl_ms: the TTL of a live session's lease (docs/sessions.md "Leases"); 0: 30000. Read at
   * start only. */
  uint64_t lease_ttl_ms;
  /* [host] store_url: a PostgreSQL connection string (a libpq URI or key=value list, never with a password
   * in it): the store is then that database instead of state_dir/agenthost.db (docs/scaling.md). Its
   * password: [host] store_password_file (an absolute path; the file's first line) or store_password (meant
   * for the environment: AGENTHOST_HOST_STORE_PASSWORD); neither value is ever logged. NULL: not set. */
  char *store_url;
  char *store_password_file;
  char *store_password;
  /* {"NAME": {"enabled": bool, "modes": ["serve", ...], "path": "/abs/NAME.so", "<key>": "<string>", ...}}
   * Own keys of a plugin stay strings (the plugin parses them); enabled is a bool, modes an array, path
   * absolute. Every plugin named in the file or environment appears, enabled or not. */
  json_t *plugins;
  /* {"NAME": {"type": "echo", "<key>": "<string>", ...}} */
  json_t *providers;
  /* [hook.NAME] in file order: {"NAME": {"event": POINT, "command": "...", "args": [..], "env": ["K=v"],
   * "match": [pattern], "cwd"?: "/abs", "timeout_ms": int, "on_error": "deny"|"allow", "enabled": bool}}
   * (docs/hooks.md). May be NULL (a configuration built by hand). */
  json_t *hooks;
} ah_config;

/* Load the configuration. `envp` is the environment to read (NULL = environ). On failure returns
 * AH_ECONFIG (or AH_ENOMEM) and sets *err to a malloc'ed message naming file:line (or the variable or
 * flag) and the key; the caller frees it. On success `cfg` must be released with ah__config_free(). */
int ah__config_load(ah_config *cfg, const ah_cli_overrides *cli, char *const *envp, char **err);

void ah__config_free(ah_config *cfg);

/* The store this configuration names: SQLite at state_dir/agenthost.db, or PostgreSQL at store_url with
 * its password read (from store_password, else store_password_file). Fills `opts` (url and path point into
 * `cfg` and `path_buf`; the password into *password, malloc'ed: the caller wipes and frees it) and *backend.
 * AH_ECONFIG with *why (malloc'ed) when the password file cannot be read or this build has no PostgreSQL
 * backend. */
struct ah_store_opts;
struct ah_store_backend;
int ah__config_store(const ah_config *cfg, struct ah_store_opts *opts,
                     const struct ah_store_backend **backend, char *path_buf, size_t path_cap,
                     char **password, char **why);

/* A list value of a key (e.g. [provider.NAME] models): a JSON array of strings when it starts with '[',
 * else comma-separated items, blanks trimmed, empty ones dropped. A new array (empty for NULL), or NULL
 * for a bad JSON list. */
json_t *ah__config_list(const char *s);

/* A session's mode: ask | accept_edits | read_only (docs/sessions.md "Modes"). */
bool ah__config_mode_valid(const char *mode);

/* A name of a plugin, provider, MCP server or hook: [a-z][a-z0-9-]*, at most 40 bytes (a plugin's hook,
 * registered through the ABI, follows the same rule as one of the configuration). */
bool ah__config_name_valid(const char *s);

/* The browser's token file: [plugin.browser] token_file (as given), else STATE_DIR/token. */
void ah__config_token_path(const ah_config *cfg, char *path, size_t cap);

/* The plugins to mount in `mode` ("serve", "sdk", "acp"): every plugin with enabled = true whose modes
 * contain `mode`. A plugin's default modes are "serve" (DECISIONS.md). Then, in every mode, the plugin
 * named by the type of each configured provider other than echo (type acp → plugin acp). Returns a new
 * array of names in config order. */
json_t *ah__config_plugins_for_mode(const ah_config *cfg, const char *mode);

/* The module file of plugin `name` (its config `pc`): its `path`, else plugin_dir/NAME.so, else (a build
 * tree) plugin_dir/NAME/NAME.so. malloc'ed; NULL when out of memory. */
char *ah__config_module_path(const ah_config *cfg, const char *name, const json_t *pc);

#endif
