/* agenthost — the core's HTTP client service (http.c; internal): the functions behind the API table's
 * http_start / http_abort (ABI 1.4). Without the meson feature `http` (no libcurl) the table leaves them
 * NULL and none of this is built. */
#ifndef AGENTHOST_HOST_HTTP_H
#define AGENTHOST_HOST_HTTP_H

#include <agenthost/plugin.h>

typedef struct ah__http_ctx ah__http_ctx;
typedef struct ah_host ah_host;

int ah__http_start(ah_mount *m, const ah_http_request *req, ah_http **out);
void ah__http_abort(ah_http *h);
/* At withdraw: transfers the plugin left running are aborted without callbacks (and logged). */
void ah__http_withdraw(ah_mount *m);
/* At the host's stop, after every mount: the multi handle and its handles are closed (the loop must run
 * for their close callbacks). */
void ah__http_close(ah_host *host);

#endif
