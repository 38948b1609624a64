#!/usr/bin/env python3
"""A scripted OpenAI-compatible HTTP server for agenthost's tests (stdlib only).

    fake_model.py --port-file FILE [--control-port-file FILE] [--tls CERT KEY] [--script FILE]

Listens on 127.0.0.1 (an ephemeral port, written to --port-file once it accepts); with --tls, over TLS.
--control-port-file: a second, plain-HTTP listener for the control requests only (so that a test can
script a TLS server without TLS of its own). Every request that is
not a control request takes the next step of the script (the last step repeats when the script runs
out; no script at all answers 404). A step is a JSON object:

    status       HTTP status (200)
    headers      {name: value} added to the response
    body         a string sent as the whole body (Content-Length)
    json         a value sent as the body (application/json)
    sse          a list of events, each a JSON value (sent as `data: <json>`) or a raw string sent as
                 is; "[DONE]" becomes `data: [DONE]`. Sent as text/event-stream, chunked, one chunk
                 per event.
    raw          a list of strings sent as they are, one chunk each (for malformed streams)
    delay_ms     pause before each event / raw write (0)
    head_delay_ms  pause before the response head (0)
    drop_after   close the connection after this many events / writes, before the body's end
    hang         after the events, keep the connection open without sending (until the client goes)
    stamp        replace "{{t}}" in each event with time.monotonic_ns() as it is written (CLOCK_MONOTONIC,
                 shared with the reader on this machine: for latency benchmarks)

Control requests (never consume a step):
    POST /_control/script     the body is the new script (a list of steps); the request log is kept
    GET  /_control/requests   [{method, path, headers, body, time}] of every scripted request so far
    GET  /_control/events     [{event: "disconnect" | "done", time, path}]: when a client went away while
                              the server was still sending, and when a response was completed
"""
import argparse
import json
import os
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATE = {"script": [], "next": 0, "requests": [], "events": []}


def now():
    return time.time()


def next_step():
    with LOCK:
        script = STATE["script"]
        if not script:
            return None
        i = min(STATE["next"], len(script) - 1)
        STATE["next"] += 1
        return script[i]


def record_event(kind, path):
    with LOCK:
        STATE["events"].append({"event": kind, "time": now(), "path": path})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: the tests read the control endpoints
        pass

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def send_json(self, status, value):
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def control(self, body):
        if self.command == "POST" and self.path == "/_control/script":
            script = json.loads(body or b"[]")
            with LOCK:
                STATE["script"] = script if isinstance(script, list) else [script]
                STATE["next"] = 0
            self.send_json(200, {"steps": len(STATE["script"])})
        elif self.path == "/_control/requests":
            with LOCK:
                self.send_json(200, list(STATE["requests"]))
        elif self.path == "/_control/events":
            with LOCK:
                self.send_json(200, list(STATE["events"]))
        else:
            self.send_json(404, {"error": "no such control"})

    def handle_any(self):
        body = self.read_body()
        if self.path.startswith("/_control/"):
            self.control(body)
            return
        with LOCK:
            STATE["requests"].append({
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body.decode("utf-8", "replace"),
                "time": now(),
            })
        step = next_step()
        if step is None:
            self.send_json(404, {"error": {"message": "no script"}})
            return
        try:
            self.respond(step)
            record_event("done", self.path)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            record_event("disconnect", self.path)
        self.close_connection = True

    def write_piece(self, data, delay_ms):
        if delay_ms:
            time.sleep(delay_ms / 1000.0)
        self.wfile.write(data)
        self.wfile.flush()

    def respond(self, step):
        if step.get("head_delay_ms"):
            time.sleep(step["head_delay_ms"] / 1000.0)
        status = step.get("status", 200)
        extra = step.get("headers", {})
        delay = step.get("delay_ms", 0)
        drop = step.get("drop_after")
        pieces = None
        if "sse" in step:
            pieces = []
            for ev in step["sse"]:
                if ev == "[DONE]":
                    pieces.append(b"data: [DONE]\n\n")
                elif isinstance(ev, str):
                    pieces.append(ev.encode())
                else:
                    pieces.append(b"data: " + json.dumps(ev).encode() + b"\n\n")
            ctype = "text/event-stream"
        elif "raw" in step:
            pieces = [p.encode() for p in step["raw"]]
            ctype = extra.get("Content-Type", "text/event-stream")
        if pieces is not None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            for k, v in extra.items():
                if k != "Content-Type":
                    self.send_header(k, v)
            self.end_headers()
            self.wfile.flush()
            for i, p in enumerate(pieces):
                if drop is not None and i >= drop:
                    self.drop()
                    return
                if p:
                    if step.get("stamp"):  # the time of the write itself, after the delay
                        if delay:
                            time.sleep(delay / 1000.0)
                        p = p.replace(b"{{t}}", str(time.monotonic_ns()).encode())
                        self.write_piece(b"%x\r\n" % len(p) + p + b"\r\n", 0)
                    else:
                        self.write_piece(b"%x\r\n" % len(p) + p + b"\r\n", delay)
            if step.get("hang"):
                self.hang()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        if "json" in step:
            data = json.dumps(step["json"]).encode()
            ctype = "application/json"
        else:
            data = step.get("body", "").encode()
            ctype = extra.get("Content-Type", "text/plain")
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra.items():
            if k != "Content-Type":
                self.send_header(k, v)
        self.end_headers()
        if drop is not None:
            self.wfile.write(data[: max(0, int(drop))])
            self.wfile.flush()
            self.drop()
            return
        self.write_piece(data, delay)
        if step.get("hang"):
            self.hang()

    def drop(self):
        """Close the connection before the body's end (no last chunk, or short of Content-Length)."""
        self.wfile.flush()
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.connection.close()

    def hang(self):
        """Keep the connection open, sending nothing, until the client goes (or 60 s)."""
        self.connection.settimeout(0.02)
        end = now() + 60
        while now() < end:
            try:
                if self.connection.recv(1) == b"":
                    raise ConnectionResetError()
            except socket.timeout:
                continue
            except ssl.SSLWantReadError:
                continue

    do_GET = handle_any
    do_POST = handle_any
    do_PUT = handle_any
    do_DELETE = handle_any


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many clients at once (benchmarks): the default backlog of 5 delays them


def write_port(path, port):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.rename(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    ap.add_argument("--script")
    ap.add_argument("--control-port-file")
    args = ap.parse_args()
    if args.script:
        with open(args.script) as f:
            s = json.load(f)
        STATE["script"] = s if isinstance(s, list) else [s]
    srv = Server(("127.0.0.1", 0), Handler)
    if args.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls[0], args.tls[1])
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    if args.control_port_file:
        ctl = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=ctl.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        write_port(args.control_port_file, ctl.server_address[1])
    write_port(args.port_file, srv.server_address[1])
    try:
        srv.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
