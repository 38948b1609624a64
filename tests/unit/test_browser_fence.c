/* The browser plugin's trust fence (plugins/browser/fence.c): the request pipeline of SECURITY.md §2.3 as a
 * pure decision, with injected headers and peer addresses (DECISIONS.md "Privilege by peer address is tested
 * by injecting peer addresses into the decision function"). Threat ids (T1…, H01…) and API-* tags are
 * SECURITY.md's and PROTOCOLS.md's. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "fence.h"

#define PORT 7878

typedef struct fx {
  uint8_t token[BF_TOKEN_BYTES];
  char token_text[BF_TOKEN_CHARS + 1];
  char bearer[80];
  char ws_proto[128];
  struct sockaddr_storage peer;
  int ports[1];
  bf_policy pol;
  bf_request req;
  bf_decision d;
} fx;

static bf_method_class classify(const char *method, void *arg) {
  (void)arg;
  if (strcmp(method, "plugin.load") == 0 || strcmp(method, "session.delete") == 0)
    return BF_METHOD_PRIVILEGED;
  if (strncmp(method, "host.", 5) == 0 || strncmp(method, "session.", 8) == 0 ||
      strncmp(method, "request.", 8) == 0)
    return BF_METHOD_PUBLIC;
  return BF_METHOD_UNKNOWN;
}

static void set_peer(fx *f, const char *addr) {
  memset(&f->peer, 0, sizeof f->peer);
  if (strchr(addr, ':')) {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&f->peer;
    in6->sin6_family = AF_INET6;
    cr_assert_eq(inet_pton(AF_INET6, addr, &in6->sin6_addr), 1);
  } else {
    struct sockaddr_in *in = (struct sockaddr_in *)&f->peer;
    in->sin_family = AF_INET;
    cr_assert_eq(inet_pton(AF_INET, addr, &in->sin_addr), 1);
  }
}

/* A valid authenticated POST /api/host.describe from 127.0.0.1, as the UI sends it. */
static void init(fx *f) {
  memset(f, 0, sizeof *f);
  for (int i = 0; i < BF_TOKEN_BYTES; i++)
    f->token[i] = (uint8_t)(i * 7 + 3);
  bf_token_encode(f->token, f->token_text);
  snprintf(f->bearer, sizeof f->bearer, "Bearer %s", f->token_text);
  snprintf(f->ws_proto, sizeof f->ws_proto, "agenthost.v1, agenthost.bearer.%s", f->token_text);
  f->ports[0] = PORT;
  f->pol.token = f->token;
  f->pol.ports = f->ports;
  f->pol.nports = 1;
  f->pol.max_body = 1u << 20;
  f->pol.max_body_prompt = 160u << 20;
  f->pol.classify = classify;
  set_peer(f, "127.0.0.1");
  f->req.method = "POST";
  f->req.path = "/api/host.describe";
  f->req.path_len = strlen(f->req.path);
  f->req.host = "127.0.0.1:7878";
  f->req.host_count = 1;
  f->req.origin = "http://127.0.0.1:7878";
  f->req.sec_fetch_site = "same-origin";
  f->req.authorization = f->bearer;
  f->req.content_type = "application/json";
  f->req.content_length = "42";
  f->req.peer = (struct sockaddr *)&f->peer;
}

static void path(fx *f, const char *p) {
  f->req.path = p;
  f->req.path_len = strlen(p);
}

static int decide(fx *f) {
  bf_decide(&f->pol, &f->req, &f->d);
  return f->d.status;
}

/* A GET without a body, of `p` (NULL: the path stays). */
static void as_get(fx *f, const char *p) {
  f->req.method = "GET";
  if (p)
    path(f, p);
  f->req.content_type = NULL;
  f->req.content_length = NULL;
}

/* A WebSocket upgrade of /api/ws/mux with the subprotocol pair. */
static void as_upgrade(fx *f, const char *p) {
  as_get(f, p);
  f->req.upgrade = true;
  f->req.authorization = NULL;
  f->req.ws_protocol = f->ws_proto;
}

Test(browser_fence, admits_the_ui_request) {
  fx f;
  init(&f);
  cr_assert_eq(decide(&f), 0, "status %d (%s)", f.d.status, f.d.reason);
  cr_expect_eq(f.d.route, BF_ROUTE_API);
  cr_expect_str_eq(f.d.method, "host.describe");
  cr_expect(f.d.loopback);
  cr_expect(f.d.authenticated);
  cr_expect_eq(f.d.content_length, 42);
}

/* ---- T1 DNS rebinding: the Host allowlist, first, whatever else is right (H01–H09) -------------------- */

Test(browser_fence, t1_h01_rebinding_host_is_403_even_with_token_and_same_origin) {
  fx f;
  init(&f);
  f.req.host = "rebind.attacker.example:7878";
  f.req.origin = "http://rebind.attacker.example:7878";
  cr_expect_eq(decide(&f), 403);
  cr_expect_str_eq(f.d.reason, "host not allowed");
}

Test(browser_fence, t1_host_variants) {
  static const char *const refused[] = {
      "127.0.0.1.nip.io:7878",
      "localhost.attacker.example",
      "evil.example",
      "127.0.0.1:78x8",
      "[::1",
      "attacker.example:7878",
      "LOCALHOST.evil",
      "",
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    fx f;
    init(&f);
    f.req.host = refused[i];
    int st = decide(&f);
    cr_expect(st == 403 || st == 400, "Host \"%s\" → %d", refused[i], st);
  }
  static const char *const allowed[] = {"127.0.0.1:7878", "localhost:7878",     "LOCALHOST:7878",
                                        "[::1]:7878",     "app.localhost:7878", "127.0.0.2:7878",
                                        "localhost"};
  for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++) {
    fx f;
    init(&f);
    f.req.host = allowed[i];
    f.req.origin = NULL;
    cr_expect_eq(decide(&f), 0, "Host \"%s\" → %d (%s)", allowed[i], f.d.status, f.d.reason);
  }
}

Test(browser_fence, t1_host_applies_to_static_and_upgrades_and_needs_one_host) {
  fx f;
  init(&f);
  as_get(&f, "/index.html");
  f.req.host = "rebind.attacker.example";
  cr_expect_eq(decide(&f), 403, "static route");
  init(&f);
  as_upgrade(&f, "/api/ws/mux");
  f.req.host = "rebind.attacker.example";
  cr_expect_eq(decide(&f), 403, "upgrade");
  init(&f);
  f.req.host_count = 2;
  cr_expect_eq(decide(&f), 400, "two Host headers");
  init(&f);
  f.req.host = NULL;
  f.req.host_count = 0;
  cr_expect_eq(decide(&f), 400, "no Host");
}

Test(browser_fence, t1_configured_hosts_and_wildcard_listener) {
  fx f;
  init(&f);
  const char *hosts[] = {"devbox.lan"};
  f.pol.hosts = hosts;
  f.pol.nhosts = 1;
  f.req.origin = NULL;
  f.req.host = "devbox.lan:7878";
  cr_expect_eq(decide(&f), 0);
  f.req.host = "192.168.1.20:7878";
  cr_expect_eq(decide(&f), 403, "an IP literal of no listener");
  f.pol.any_ip_literal = true;
  cr_expect_eq(decide(&f), 0, "a wildcard listener accepts IP literals");
}

/* ---- T2 CSRF: Fetch Metadata, Origin, content type (H10–H15) ---------------------------------------------
 */

Test(browser_fence, t2_h10_cross_site_text_plain_is_403_and_without_metadata_415) {
  fx f;
  init(&f);
  f.req.origin = "https://evil.example";
  f.req.sec_fetch_site = "cross-site";
  f.req.content_type = "text/plain";
  cr_expect_eq(decide(&f), 403);
  f.req.origin = NULL;
  f.req.sec_fetch_site = NULL;
  cr_expect_eq(decide(&f), 415);
}

Test(browser_fence, t2_sec_fetch_site_only_same_origin_for_api) {
  static const char *const refused[] = {"same-site", "cross-site", "none", "SAME-SITE", "bogus"};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    fx f;
    init(&f);
    f.req.sec_fetch_site = refused[i];
    cr_expect_eq(decide(&f), 403, "Sec-Fetch-Site %s", refused[i]);
  }
  fx f;
  init(&f);
  f.req.sec_fetch_site = NULL; /* a non-browser client: then the token decides */
  f.req.origin = NULL;
  cr_expect_eq(decide(&f), 0);
}

Test(browser_fence, t2_origin_exact_match_no_prefix_no_null) {
  static const char *const refused[] = {
      "null",
      "http://127.0.0.1:7878.evil.example",
      "http://127.0.0.1:78780",
      "http://127.0.0.1:9999",
      "https://127.0.0.1:7878",
      "http://localhost:7878/",
      "http://127.0.0.1",
      "http://evil.example",
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    fx f;
    init(&f);
    f.req.origin = refused[i];
    cr_expect_eq(decide(&f), 403, "Origin %s", refused[i]);
  }
  static const char *const allowed[] = {"http://127.0.0.1:7878", "http://localhost:7878", "http://[::1]:7878",
                                        "HTTP://LOCALHOST:7878"};
  for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++) {
    fx f;
    init(&f);
    f.req.origin = allowed[i];
    cr_expect_eq(decide(&f), 0, "Origin %s → %d", allowed[i], f.d.status);
  }
  fx f;
  init(&f);
  const char *origins[] = {"https://ui.example.org"};
  f.pol.origins = origins;
  f.pol.norigins = 1;
  f.req.origin = "https://ui.example.org";
  cr_expect_eq(decide(&f), 0, "a configured origin");
  f.req.origin = "https://ui.example.org.evil.example";
  cr_expect_eq(decide(&f), 403);
}

Test(browser_fence, t2_content_type_only_json) {
  static const char *const refused[] = {"text/plain", "application/x-www-form-urlencoded",
                                        "multipart/form-data", "application/jsonx",
                                        "application/json; charset=latin1"};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    fx f;
    init(&f);
    f.req.content_type = refused[i];
    cr_expect_eq(decide(&f), 415, "%s", refused[i]);
  }
  static const char *const allowed[] = {"application/json", "application/json;charset=utf-8",
                                        "Application/JSON; charset=\"UTF-8\""};
  for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++) {
    fx f;
    init(&f);
    f.req.content_type = allowed[i];
    cr_expect_eq(decide(&f), 0, "%s", allowed[i]);
  }
}

/* ---- T3 cross-site WebSocket hijacking (W01–W08) ---------------------------------------------------------
 */

Test(browser_fence, t3_w01_bad_origin_upgrade_is_403) {
  fx f;
  init(&f);
  as_upgrade(&f, "/api/ws/mux");
  cr_assert_eq(decide(&f), 0, "%s", f.d.reason);
  cr_expect_eq(f.d.route, BF_ROUTE_WS_MUX);
  f.req.origin = "https://evil.example";
  cr_expect_eq(decide(&f), 403);
  f.req.origin = "null";
  cr_expect_eq(decide(&f), 403);
  init(&f);
  as_upgrade(&f, "/api/ws/host");
  f.req.sec_fetch_site = "same-site";
  cr_expect_eq(decide(&f), 403, "another localhost port is same-site, not same-origin");
}

Test(browser_fence, t3_upgrade_needs_the_bearer_subprotocol) {
  fx f;
  init(&f);
  as_upgrade(&f, "/api/ws/host");
  f.req.ws_protocol = NULL;
  f.req.origin = NULL; /* the verified gap: a no-Origin client must still be refused */
  f.req.sec_fetch_site = NULL;
  cr_expect_eq(decide(&f), 401);
  f.req.ws_protocol = "agenthost.v1";
  cr_expect_eq(decide(&f), 401);
  f.req.ws_protocol = "agenthost.v1, agenthost.bearer.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
  cr_expect_eq(decide(&f), 401, "a wrong token");
  char only[128];
  snprintf(only, sizeof only, "agenthost.bearer.%s", f.token_text);
  f.req.ws_protocol = only;
  cr_expect_eq(decide(&f), 400, "agenthost.v1 missing");
  f.req.ws_protocol = f.ws_proto;
  f.req.authorization = f.bearer; /* Authorization does not stand in for the subprotocol on an upgrade */
  f.req.ws_protocol = NULL;
  cr_expect_eq(decide(&f), 401);
}

Test(browser_fence, t3_upgrade_only_on_the_two_streams) {
  fx f;
  init(&f);
  as_upgrade(&f, "/api/host.describe");
  cr_expect_eq(decide(&f), 405);
  init(&f);
  as_upgrade(&f, "/index.html");
  cr_expect_eq(decide(&f), 400);
  init(&f);
  as_get(&f, "/api/ws/mux");
  cr_expect_eq(decide(&f), 400, "the stream without an upgrade");
  init(&f);
  f.req.upgrade_other = "h2c";
  cr_expect_eq(decide(&f), 400, "h2c is refused");
}

/* ---- T4 LAN exposure: the token, and privilege by peer address, never by Host (H16–H18) ------------------
 */

Test(browser_fence, t4_h18_lan_peer_privileged_method) {
  fx f;
  init(&f);
  set_peer(&f, "192.168.1.50");
  path(&f, "/api/plugin.load");
  f.req.host = "127.0.0.1:7878"; /* spoofed */
  f.req.authorization = NULL;
  f.req.origin = NULL;
  f.req.sec_fetch_site = NULL;
  cr_expect_eq(decide(&f), 401, "no token");
  f.req.authorization = f.bearer;
  cr_expect_eq(decide(&f), 403, "valid token, peer not loopback");
  cr_expect_not(f.d.loopback);
  path(&f, "/api/host.describe");
  cr_expect_eq(decide(&f), 0, "a public method from the LAN with the token");
  cr_expect_not(f.d.loopback);
  path(&f, "/api/brand.new-method");
  cr_expect_eq(decide(&f), 403, "an unknown method counts as privileged");
}

Test(browser_fence, t4_loopback_peers) {
  static const char *const loop[] = {"127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1"};
  for (size_t i = 0; i < sizeof loop / sizeof loop[0]; i++) {
    fx f;
    init(&f);
    set_peer(&f, loop[i]);
    path(&f, "/api/plugin.load");
    cr_expect_eq(decide(&f), 0, "%s", loop[i]);
    cr_expect(f.d.loopback, "%s", loop[i]);
  }
  static const char *const lan[] = {"10.0.0.1", "::ffff:192.168.1.1", "fe80::1", "128.0.0.1", "::2"};
  for (size_t i = 0; i < sizeof lan / sizeof lan[0]; i++) {
    fx f;
    init(&f);
    set_peer(&f, lan[i]);
    path(&f, "/api/session.delete");
    cr_expect_eq(decide(&f), 403, "%s", lan[i]);
  }
}

Test(browser_fence, t4_token_forms) {
  static const char *const refused[] = {
      NULL,
      "",
      "Bearer",
      "Bearer ",
      "Basic dXNlcjpwYXNz",
      "Token x",
      "Bearer AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    fx f;
    init(&f);
    f.req.authorization = refused[i];
    cr_expect_eq(decide(&f), 401, "%s", refused[i] ? refused[i] : "(none)");
  }
  fx f;
  init(&f);
  char longer[128], shorter[128], padded[128];
  snprintf(longer, sizeof longer, "Bearer %sA", f.token_text);
  snprintf(shorter, sizeof shorter, "Bearer %.42s", f.token_text);
  snprintf(padded, sizeof padded, "Bearer %s=", f.token_text);
  const char *bad[] = {longer, shorter, padded};
  for (size_t i = 0; i < 3; i++) {
    f.req.authorization = bad[i];
    cr_expect_eq(decide(&f), 401, "%s", bad[i]);
  }
  char lower[80];
  snprintf(lower, sizeof lower, "bearer %s", f.token_text);
  f.req.authorization = lower;
  cr_expect_eq(decide(&f), 0, "the scheme is case-insensitive");
}

Test(browser_fence, t4_token_codec_and_constant_time_compare) {
  uint8_t t[BF_TOKEN_BYTES], back[BF_TOKEN_BYTES];
  for (int i = 0; i < BF_TOKEN_BYTES; i++)
    t[i] = (uint8_t)(255 - i);
  char text[BF_TOKEN_CHARS + 1];
  bf_token_encode(t, text);
  cr_expect_eq(strlen(text), 43);
  cr_assert(bf_token_decode(text, 43, back));
  cr_expect_eq(memcmp(t, back, sizeof t), 0);
  cr_expect(bf_token_matches(t, text, 43));
  text[42] = text[42] == 'A' ? 'Q' : 'A'; /* non-canonical trailing bits or another token */
  cr_expect_not(bf_token_matches(t, text, 43));
  cr_expect_not(bf_token_matches(t, text, 42));
  cr_expect_not(bf_token_decode("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", 43, back));
}

/* ---- T5 bodies: limits before reading, framing (H19–H28) -------------------------------------------------
 */

Test(browser_fence, t5_h20_content_length_over_the_limit_is_413) {
  fx f;
  init(&f);
  path(&f, "/api/session.prompt");
  f.req.content_length = "167772161"; /* 160 MiB + 1 */
  cr_expect_eq(decide(&f), 413);
  f.req.content_length = "167772160";
  cr_expect_eq(decide(&f), 0, "exactly 160 MiB on session.prompt");
  path(&f, "/api/session.create");
  f.req.content_length = "1048577";
  cr_expect_eq(decide(&f), 413, "1 MiB + 1 elsewhere");
  f.req.content_length = "1048576";
  cr_expect_eq(decide(&f), 0);
  path(&f, "/api/respond");
  f.req.content_length = "1048577";
  cr_expect_eq(decide(&f), 413, "respond has the default limit");
}

Test(browser_fence, t5_framing) {
  fx f;
  init(&f);
  f.req.content_length = NULL;
  f.req.transfer_encoding = "chunked";
  cr_expect_eq(decide(&f), 411);
  f.req.content_length = "10";
  cr_expect_eq(decide(&f), 411, "chunked with a length is refused too");
  f.req.transfer_encoding = NULL;
  f.req.content_length = NULL;
  cr_expect_eq(decide(&f), 411, "no length");
  static const char *const bad[] = {"-1", "1e3", "0x10", "", "99999999999999999999999", "12 34"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    f.req.content_length = bad[i];
    cr_expect_eq(decide(&f), 400, "Content-Length \"%s\"", bad[i]);
  }
  init(&f);
  as_get(&f, "/index.html");
  f.req.content_length = "5";
  cr_expect_eq(decide(&f), 400, "a GET with a body");
}

/* ---- routes and methods (API-HTTP-HANDLER) ----------------------------------------------------------------
 */

Test(browser_fence, routes_and_methods) {
  fx f;
  init(&f);
  as_get(&f, NULL);
  cr_expect_eq(decide(&f), 405, "GET on a method");
  cr_expect_str_eq(f.d.allow, "POST");
  init(&f);
  f.req.method = "PUT";
  cr_expect_eq(decide(&f), 405);
  init(&f);
  path(&f, "/api/respond");
  cr_expect_eq(decide(&f), 0);
  cr_expect_eq(f.d.route, BF_ROUTE_RESPOND);
  init(&f);
  as_get(&f, "/api/sessions/0192aabb-ccdd-7eee-8fff-000000000001/export");
  cr_expect_eq(decide(&f), 0, "%s", f.d.reason);
  cr_expect_eq(f.d.route, BF_ROUTE_EXPORT);
  cr_expect_str_eq(f.d.session_id, "0192aabb-ccdd-7eee-8fff-000000000001");
  f.req.authorization = NULL;
  cr_expect_eq(decide(&f), 401, "the export is authenticated");
  init(&f);
  path(&f, "/api/Host.Describe");
  cr_expect_eq(decide(&f), 404, "not a method name");
  init(&f);
  path(&f, "/api/a/b");
  cr_expect_eq(decide(&f), 404);
  init(&f);
  f.req.method = "POST";
  path(&f, "/index.html");
  f.req.authorization = NULL;
  cr_expect_eq(decide(&f), 405, "only GET outside /api");
}

Test(browser_fence, static_ui_is_public_and_navigable) {
  fx f;
  init(&f);
  as_get(&f, "/");
  f.req.authorization = NULL;
  f.req.origin = NULL;
  f.req.sec_fetch_site = "none"; /* the launch URL typed or opened */
  cr_expect_eq(decide(&f), 0, "%s", f.d.reason);
  cr_expect_eq(f.d.route, BF_ROUTE_STATIC);
  f.req.sec_fetch_site = "cross-site";
  f.req.sec_fetch_mode = "no-cors"; /* a <script src> from another site: XSSI */
  cr_expect_eq(decide(&f), 403);
  f.req.sec_fetch_mode = "navigate";
  cr_expect_eq(decide(&f), 0, "a link from elsewhere opens the page (no token in it)");
}

/* ---- T8 the request target (H36, H37) --------------------------------------------------------------------
 */

Test(browser_fence, t8_request_target) {
  fx f;
  init(&f);
  as_get(&f, NULL);
  f.req.authorization = NULL;
  path(&f, "/app.js#/../../etc/passwd");
  cr_expect_eq(decide(&f), 400, "H37 '#' in the target");
  path(&f, "/a\\..\\..\\etc\\passwd");
  cr_expect_eq(decide(&f), 400, "backslash");
  static const char nul[] = "/index.html\0.png";
  f.req.path = nul;
  f.req.path_len = sizeof nul - 1;
  cr_expect_eq(decide(&f), 400, "NUL");
  path(&f, "/a\r\nSet-Cookie: x");
  cr_expect_eq(decide(&f), 400, "control characters");
  path(&f, "relative");
  cr_expect_eq(decide(&f), 400, "not origin-form");
  char big[9000];
  memset(big, 'a', sizeof big - 1);
  big[0] = '/';
  big[sizeof big - 1] = '\0';
  path(&f, big);
  cr_expect_eq(decide(&f), 414);
}

/* ---- T9: nothing of the request is echoed in the decision
 * -------------------------------------------------- */

Test(browser_fence, t9_reasons_are_constant_text) {
  fx f;
  init(&f);
  path(&f, "/api/\x1b[2J\r\n[INFO] auth ok");
  cr_expect_eq(decide(&f), 400);
  cr_expect_null(strchr(f.d.reason, '\x1b'));
  init(&f);
  f.req.authorization = "Bearer secret-token-value";
  cr_expect_eq(decide(&f), 401);
  cr_expect_null(strstr(f.d.reason, "secret"));
}

/* ---- the order of the pipeline (SECURITY.md §2.3) ---------------------------------------------------------
 */

Test(browser_fence, order_host_before_token_before_privilege_before_framing) {
  fx f;
  init(&f);
  f.req.host = "evil.example";
  f.req.authorization = NULL;
  f.req.content_length = "999999999999";
  cr_expect_eq(decide(&f), 403, "Host and token both wrong: 403, not 401");
  init(&f);
  f.req.sec_fetch_site = "cross-site";
  f.req.authorization = NULL;
  cr_expect_eq(decide(&f), 403, "Fetch Metadata before the token");
  init(&f);
  f.req.origin = "https://evil.example";
  f.req.authorization = NULL;
  f.req.content_type = "text/plain";
  cr_expect_eq(decide(&f), 403, "Origin before the token and the content type");
  init(&f);
  f.req.authorization = NULL;
  f.req.content_length = "999999999999";
  f.req.content_type = "text/plain";
  cr_expect_eq(decide(&f), 401, "the token before the content type and the length");
  init(&f);
  set_peer(&f, "10.1.1.1");
  path(&f, "/api/plugin.load");
  f.req.content_length = "999999999999";
  cr_expect_eq(decide(&f), 403, "privilege before the length");
  init(&f);
  f.req.content_type = "text/plain";
  f.req.content_length = "999999999999";
  cr_expect_eq(decide(&f), 415, "content type before the length");
  init(&f);
  f.req.method = "GET";
  f.req.content_length = "999999999999";
  cr_expect_eq(decide(&f), 405, "the method before the framing");
}

/* API-WS-HOST: the mux's ?after=CURSOR: digits only, up to INT64_MAX; a sign, a blank (an encoded %20 or %2B
 * decodes to one) or an overflow is refused (strtoll took " 5" and "+5"; the fuzzing harness states the
 * rule). */
Test(fence, the_mux_cursor_is_digits_that_fit) {
  int64_t v = -1;
  cr_expect(bf_mux_cursor("0", &v) && v == 0);
  cr_expect(bf_mux_cursor("42", &v) && v == 42);
  cr_expect(bf_mux_cursor("007", &v) && v == 7);
  cr_expect(bf_mux_cursor("9223372036854775807", &v) && v == INT64_MAX);
  static const char *const bad[] = {
      "", "+5", " 5", "5 ", "-1", "0x10", "1e3", "9223372036854775808", "99999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    v = -1;
    cr_expect_not(bf_mux_cursor(bad[i], &v), "accepted \"%s\"", bad[i]);
    cr_expect_eq(v, -1, "\"%s\" wrote the cursor", bad[i]);
  }
}
