/* What a mount has in flight: calls, pool work and closing handles, counted by the files that start them
 * (calls, services, process, tools) and read by the withdraw machine (mount.c), which learns of every
 * release through the mount's on_release. The counting files never call into the withdraw machine. */
#include "internal.h"

static size_t *counter(ah_mount *m, int kind) {
  switch (kind) {
  case AH__HOLD_CALL:
    return &m->ncalls;
  case AH__HOLD_WORK:
    return &m->nworks;
  default:
    return &m->closing;
  }
}

void ah__mount_hold(ah_mount *m, int kind) {
  (*counter(m, kind))++;
}

void ah__mount_release(ah_mount *m, int kind) {
  size_t *n = counter(m, kind);
  if (*n > 0)
    (*n)--;
  if (m->on_release)
    m->on_release(m, kind);
}
