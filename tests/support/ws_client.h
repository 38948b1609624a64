/* A tiny HTTP/1.1 and WebSocket client for tests that talk to the browser plugin over raw sockets (no
 * external code): requests are written as given, responses parsed by Content-Length, WebSocket frames
 * built (masked) and parsed by hand. */
#ifndef AGENTHOST_TEST_WS_CLIENT_H
#define AGENTHOST_TEST_WS_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct tc_resp {
  int status;
  char *head; /* status line and headers, lower-cased names kept as sent */
  char *body;
  size_t body_len;
} tc_resp;

/* A TCP connection to 127.0.0.1:port (receive buffer `rcvbuf` bytes when > 0), or -1. */
int tc_connect(int port, int rcvbuf);
/* The same to an IPv4 address `ip`. */
int tc_connect_ip(const char *ip, int port);
bool tc_send(int fd, const void *buf, size_t len);
bool tc_send_str(int fd, const char *s);
/* Read one response (headers, then Content-Length bytes). Returns the status, or -1 on EOF, timeout or a
 * malformed response. */
int tc_read_response(int fd, tc_resp *r, int timeout_ms);
void tc_resp_free(tc_resp *r);
/* The value of header `name` (case-insensitive) in `head`, copied into buf; NULL when absent. */
const char *tc_header(const char *head, const char *name, char *buf, size_t cap);
/* True when the peer closed the connection (EOF or reset) within timeout_ms, reading and dropping bytes. */
bool tc_wait_eof(int fd, int timeout_ms);

/* WebSocket. tc_ws_open sends the upgrade for `path` with `extra` header lines ("Name: value\r\n"…), reads
 * the handshake answer into *hs, and returns the fd when it is 101 (else closes it and returns -1). */
int tc_ws_open(int port, const char *path, const char *extra, tc_resp *hs, int rcvbuf);
bool tc_ws_send(int fd, int opcode, const void *payload, size_t len);
/* Receive one frame: 0 and *opcode, *payload (malloc'ed, NUL-terminated), *len; -1 on EOF/timeout. */
int tc_ws_recv(int fd, int *opcode, char **payload, size_t *len, int timeout_ms);
/* The close code of a close frame's payload (1005 when it has none). */
int tc_ws_close_code(const char *payload, size_t len);

#endif
