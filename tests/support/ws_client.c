/* See ws_client.h. */
#include "ws_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A TCP connection to `ip`:port, or -1; `rcvbuf` > 0 sets the receive buffer, `nodelay` TCP_NODELAY. */
static int connect_to(const char *ip, int port, int rcvbuf, bool nodelay) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  if (rcvbuf > 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  int one = 1;
  if (nodelay)
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, ip, &a.sin_addr) != 1 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int tc_connect(int port, int rcvbuf) {
  return connect_to("127.0.0.1", port, rcvbuf, true);
}

int tc_connect_ip(const char *ip, int port) {
  return connect_to(ip, port, 0, false);
}

/* Send `out` or receive into `in` (the other is NULL) exactly `len` bytes; a receive waits for each read
 * until `deadline` at the most. */
static bool transfer(int fd, const void *out, void *in, size_t len, uint64_t deadline) {
  size_t done = 0;
  while (done < len) {
    if (in) {
      int left = (int)(deadline > now_ms() ? deadline - now_ms() : 0);
      struct pollfd pfd = {.fd = fd, .events = POLLIN};
      if (poll(&pfd, 1, left) <= 0)
        return false;
    }
    ssize_t n = in ? recv(fd, (char *)in + done, len - done, 0)
                   : send(fd, (const char *)out + done, len - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    done += (size_t)n;
  }
  return true;
}

bool tc_send(int fd, const void *buf, size_t len) {
  return transfer(fd, buf, NULL, len, 0);
}

bool tc_send_str(int fd, const char *s) {
  return tc_send(fd, s, strlen(s));
}

/* Read exactly `len` bytes before the deadline. */
static bool read_exact(int fd, void *buf, size_t len, uint64_t deadline) {
  return transfer(fd, NULL, buf, len, deadline);
}

const char *tc_header(const char *head, const char *name, char *buf, size_t cap) {
  size_t n = strlen(name);
  const char *line = strstr(head, "\r\n");
  while (line && line[2]) {
    line += 2;
    if (strncasecmp(line, name, n) == 0 && line[n] == ':') {
      const char *v = line + n + 1;
      while (*v == ' ')
        v++;
      const char *end = strstr(v, "\r\n");
      size_t len = end ? (size_t)(end - v) : strlen(v);
      if (len >= cap)
        len = cap - 1;
      memcpy(buf, v, len);
      buf[len] = '\0';
      return buf;
    }
    line = strstr(line, "\r\n");
  }
  return NULL;
}

int tc_read_response(int fd, tc_resp *r, int timeout_ms) {
  memset(r, 0, sizeof *r);
  uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
  size_t cap = 65536, len = 0;
  char *head = malloc(cap);
  /* Byte by byte up to the blank line, so that nothing of a following response is consumed. */
  while (len + 1 < cap) {
    if (!read_exact(fd, head + len, 1, deadline)) {
      free(head);
      return -1;
    }
    len++;
    if (len >= 4 && memcmp(head + len - 4, "\r\n\r\n", 4) == 0)
      break;
  }
  head[len] = '\0';
  int status = 0;
  if (sscanf(head, "HTTP/1.%*1[01] %d", &status) != 1) {
    free(head);
    return -1;
  }
  r->status = status;
  r->head = head;
  char cl[32];
  size_t body = tc_header(head, "content-length", cl, sizeof cl) ? strtoull(cl, NULL, 10) : 0;
  r->body = malloc(body + 1);
  if (body && !read_exact(fd, r->body, body, deadline)) {
    tc_resp_free(r);
    return -1;
  }
  r->body[body] = '\0';
  r->body_len = body;
  return status;
}

void tc_resp_free(tc_resp *r) {
  free(r->head);
  free(r->body);
  memset(r, 0, sizeof *r);
}

bool tc_wait_eof(int fd, int timeout_ms) {
  uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
  char buf[65536];
  for (;;) {
    int left = (int)(deadline > now_ms() ? deadline - now_ms() : 0);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, left) <= 0)
      return false;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
      return true;
  }
}

int tc_ws_open(int port, const char *path, const char *extra, tc_resp *hs, int rcvbuf) {
  int fd = tc_connect(port, rcvbuf);
  if (fd < 0)
    return -1;
  char req[4096];
  snprintf(req, sizeof req,
           "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n%s\r\n",
           path, port, extra ? extra : "");
  if (!tc_send_str(fd, req) || tc_read_response(fd, hs, 5000) != 101) {
    close(fd);
    return -1;
  }
  return fd;
}

bool tc_ws_send(int fd, int opcode, const void *payload, size_t len) {
  unsigned char hdr[14];
  size_t h = 0;
  hdr[h++] = (unsigned char)(0x80 | (opcode & 0x0f));
  if (len < 126) {
    hdr[h++] = (unsigned char)(0x80 | len);
  } else if (len < 65536) {
    hdr[h++] = 0x80 | 126;
    hdr[h++] = (unsigned char)(len >> 8);
    hdr[h++] = (unsigned char)len;
  } else {
    hdr[h++] = 0x80 | 127;
    for (int i = 7; i >= 0; i--)
      hdr[h++] = (unsigned char)((uint64_t)len >> (8 * i));
  }
  const unsigned char mask[4] = {0x12, 0x34, 0x56, 0x78};
  memcpy(hdr + h, mask, 4);
  h += 4;
  unsigned char *buf = malloc(h + len);
  memcpy(buf, hdr, h);
  for (size_t i = 0; i < len; i++)
    buf[h + i] = ((const unsigned char *)payload)[i] ^ mask[i % 4];
  bool ok = tc_send(fd, buf, h + len);
  free(buf);
  return ok;
}

int tc_ws_recv(int fd, int *opcode, char **payload, size_t *len, int timeout_ms) {
  uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
  unsigned char h[2];
  *payload = NULL;
  *len = 0;
  if (!read_exact(fd, h, 2, deadline))
    return -1;
  *opcode = h[0] & 0x0f;
  uint64_t n = h[1] & 0x7f;
  if (n == 126) {
    unsigned char e[2];
    if (!read_exact(fd, e, 2, deadline))
      return -1;
    n = ((uint64_t)e[0] << 8) | e[1];
  } else if (n == 127) {
    unsigned char e[8];
    if (!read_exact(fd, e, 8, deadline))
      return -1;
    n = 0;
    for (int i = 0; i < 8; i++)
      n = (n << 8) | e[i];
  }
  unsigned char mask[4] = {0};
  bool masked = h[1] & 0x80;
  if (masked && !read_exact(fd, mask, 4, deadline))
    return -1;
  char *p = malloc(n + 1);
  if (!p || (n && !read_exact(fd, p, n, deadline))) {
    free(p);
    return -1;
  }
  if (masked)
    for (uint64_t i = 0; i < n; i++)
      p[i] ^= (char)mask[i % 4];
  p[n] = '\0';
  *payload = p;
  *len = n;
  return 0;
}

int tc_ws_close_code(const char *payload, size_t len) {
  if (len < 2)
    return 1005;
  return ((unsigned char)payload[0] << 8) | (unsigned char)payload[1];
}
