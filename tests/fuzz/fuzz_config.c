/* The INI configuration loader (host/config.c, over libinih): any file text is loaded or refused with a
 * message naming the file and line, and a loaded configuration is complete (absolute directories, the
 * plugin and provider objects) and frees cleanly. */

#include <sys/mman.h>
#include <unistd.h>

#include "agenthost/errors.h"
#include "config.h"
#include "fuzz_support.h"
#include "log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    ah__log_set_level(AH_LOG_ERROR);
    fd = memfd_create("agenthost.ini", 0);
    FUZZ_CHECK(fd >= 0);
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  FUZZ_CHECK(ftruncate(fd, 0) == 0);
  FUZZ_CHECK(pwrite(fd, data, size, 0) == (ssize_t)size);
  char *const envp[] = {"HOME=/nonexistent/fuzz", "AGENTHOST_PLUGIN_BROWSER_LISTEN=127.0.0.1:0", NULL};
  ah_cli_overrides cli = {.config_file = path};
  ah_config cfg;
  char *err = NULL;
  int rc = ah__config_load(&cfg, &cli, envp, &err);
  if (rc == 0) {
    FUZZ_CHECK(err == NULL);
    FUZZ_CHECK(cfg.state_dir && cfg.state_dir[0] == '/' && cfg.runtime_dir && cfg.runtime_dir[0] == '/');
    FUZZ_CHECK(cfg.plugin_dir && cfg.plugin_dir[0] == '/');
    FUZZ_CHECK(json_is_object(cfg.plugins) && json_is_object(cfg.providers));
    ah__config_free(&cfg);
  } else {
    FUZZ_CHECK(err != NULL && (rc == AH_ECONFIG || rc == AH_ENOMEM));
    FUZZ_CHECK(rc == AH_ENOMEM || strstr(err, path) || strncmp(err, "AGENTHOST_", 10) == 0 ||
               strchr(err, ':'));
    free(err);
  }
  return 0;
}
