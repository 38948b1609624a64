#!/usr/bin/env python3
"""The soak (make soak): one daemon under mixed load for a long time, its memory and descriptors watched.

    soak.py --agenthost BIN --fake-model tests/fakes/fake_model.py --python-client plugins/sdk/python
            [--seconds 1800] [--settle 30] [--warmup S]

What runs, all at once, against one `agenthost serve` (its own state directory, the openai provider on
the scripted fake model server streaming every answer in chunks):

- browser: 3 workers, each with its session, prompting over POST /api/session.prompt and waiting for the
  turn's end on the mux WebSocket; every 5th prompt also renames the session through the remote gateway
  (POST /api/remote.invoke sessions.rename) — the remote surface;
- a mux reader that keeps every cursor it saw and reconnects with ?after= when the socket closes (a reload
  of the browser plugin closes it 1001): the cursors it gets must only grow (no duplicate, nothing out of
  order across reconnections);
- a reconnecting tab: a mux socket opened, read for a moment and closed again, in a loop;
- a slow consumer: a mux socket with a small receive buffer that is never read, checked and replaced
  every 30 s (the daemon closes it 1013 once its queue is full, or it holds it);
- sdk: the Python client (`agenthost sdk`, a second host process on the same store) running prompts;
- acp: `agenthost acp` (a third process) driven over JSON-RPC lines: initialize, session/new, prompts;
- reloads: every plugin of the daemon (browser, remote, openai, mcp) reloaded in turn, one every 10 s.

The daemon's VmRSS and open descriptors are sampled every 5 s. The baseline is taken once the warm-up is
over (default: a tenth of the run, at least 20 s); the end figure after the load has stopped and the
sessions had `--settle` seconds to leave memory (idle_unload_s = 5). Verdicts: RSS drift (end against
baseline) < 5 %, descriptors at the end no more than at the baseline of each kind (files, pipes, ...; no
connection of the soak's clients left; the connections to the fake model, the HTTP client's cache, at most
one per prompt in flight), 0 crashes (every process alive
until stopped, the daemon's orderly stop with status 0), 0 prompts without an end within 60 s, 0 cursors
out of order (--no-memory-verdicts: the figures of RSS and descriptors without a verdict, for the
short run of the test suite). Prints the figures and the verdicts; exits 1 when a verdict is missed or
the soak could not run, 0 otherwise.
"""

import argparse
import base64
import http.client
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

STOP = threading.Event()
MODEL_POOL_MAX = 5  # connections to the fake model the daemon may keep: one per prompt in flight
LOCK = threading.Lock()
PROMPT_TIMEOUT = 60.0
# The reloads so far: plugin name -> [(start, end)] (time.monotonic(); end None while running).
RELOADS = {}


def reloading(name, t0, t1=None):
    """Whether a reload of plugin `name` overlapped [t0, t1] (1 s of margin on each side)."""
    t1 = time.monotonic() if t1 is None else t1
    with LOCK:
        for start, end in RELOADS.get(name, []):
            if start - 1.0 <= t1 and (end is None or end + 1.0 >= t0):
                return True
    return False


class Counters:
    def __init__(self):
        self.v = {}
        self.lat = {}

    def add(self, name, n=1):
        with LOCK:
            self.v[name] = self.v.get(name, 0) + n

    def sample(self, name, seconds):
        with LOCK:
            self.lat.setdefault(name, []).append(seconds)

    def get(self, name):
        with LOCK:
            return self.v.get(name, 0)


C = Counters()


def log(msg):
    print("soak: " + msg, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---- the daemon's figures -----------------------------------------------------------------------------

def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def fd_count(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return -1


def socket_inodes(pid):
    """Socket inode -> what it is: 'tcp to :PORT', 'tcp listening :PORT', 'tcp from :PORT' or 'unix'."""
    out = {}
    for name in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (pid, name)) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local, remote, state, inode = parts[1], parts[2], parts[3], parts[9]
                    lport, rport = int(local.split(":")[1], 16), int(remote.split(":")[1], 16)
                    if state == "0A":
                        out[inode] = "tcp listening :%d" % lport
                    else:
                        out[inode] = "tcp (:%d, :%d)" % (lport, rport)
        except OSError:
            pass
    return out


def fd_census(pid, names):
    """The daemon's descriptors by kind: a count per kind; TCP sockets named by the port of a known peer
    (names: port -> what listens there), the rest by their target (pipe, eventfd, a file...)."""
    census = {}
    inodes = socket_inodes(pid)
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return census
    for fd in fds:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            kind = inodes.get(target[8:-1], "unix socket")
            if kind.startswith("tcp ("):
                lport, rport = [int(x.strip(" :)")) for x in kind[5:].split(",")]
                kind = ("tcp to %s" % names[rport] if rport in names else
                        "tcp from a client of %s" % names[lport] if lport in names else kind)
        elif target.startswith("pipe:"):
            kind = "pipe"
        elif target.startswith("anon_inode:"):
            kind = target
        else:
            kind = "file " + target
        census[kind] = census.get(kind, 0) + 1
    return census


def census_text(c):
    return ", ".join("%s %d" % (k, v) for k, v in sorted(c.items()))


# ---- the browser carrier: POST envelopes, a WebSocket client ------------------------------------------

class Browser:
    def __init__(self, port, token):
        self.port = port
        self.token = token
        self.rpc = 0

    def call(self, method, payload, timeout=30):
        """The call's value; raises RuntimeError for a business error, OSError when the carrier fails."""
        with LOCK:
            self.rpc += 1
            rpc = "r-%d" % self.rpc
        body = json.dumps({"kind": "client-request", "rpcId": rpc, "method": method, "payload": payload})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", "/api/" + method, body=body, headers={
                "Host": "127.0.0.1:%d" % self.port,
                "Origin": "http://127.0.0.1:%d" % self.port,
                "Authorization": "Bearer " + self.token,
                "Content-Type": "application/json",
            })
            resp = conn.getresponse()
            data = resp.read()
        except (http.client.HTTPException, socket.timeout) as e:
            raise OSError(str(e))
        finally:
            conn.close()
        if resp.status == 503:
            raise OSError("503")  # a plugin reloading answers unavailable at the carrier
        answer = json.loads(data)
        if "error" in answer:
            raise RuntimeError("%s: %s" % (method, answer["error"]))
        return answer["value"]


class WebSocket:
    def __init__(self, port, token, path, rcvbuf=0, timeout=10):
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        req = ("GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nOrigin: http://127.0.0.1:%d\r\n"
               "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
               "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: agenthost.v1, agenthost.bearer.%s\r\n\r\n"
               % (path, port, port, key, token))
        self.sock.sendall(req.encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            d = self.sock.recv(65536)
            if not d:
                raise OSError("closed during the handshake")
            self.buf += d
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise OSError("upgrade refused: " + head.split(b"\r\n")[0].decode(errors="replace"))

    def _need(self, n):
        while len(self.buf) < n:
            d = self.sock.recv(262144)
            if not d:
                raise EOFError()
            self.buf += d
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send(self, opcode, payload=b""):
        mask = os.urandom(4)
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def recv(self):
        """(opcode, payload) of the next whole message; pings answered; (8, code) for a close."""
        message = b""
        first = None
        while True:
            b0, b1 = self._need(2)
            opcode, fin, n = b0 & 0x0F, b0 & 0x80, b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._need(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._need(8))[0]
            payload = self._need(n)
            if opcode == 9:
                self.send(10, payload)
                continue
            if opcode == 10:
                continue
            if opcode == 8:
                code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else 1005
                return 8, code
            if first is None:
                first = opcode
            message += payload
            if fin:
                return first, message

    def close(self):
        try:
            self.send(8, struct.pack(">H", 1000))
        except OSError:
            pass
        self.sock.close()


class Mux:
    """The mux reader: every session.event's cursor (they must only grow), the turns that ended."""

    def __init__(self, port, token):
        self.port, self.token = port, token
        self.cursor = 0
        self.ended = {}  # sessionId -> count of turn/ended seen
        self.reason = {}  # sessionId -> the reason of its last turn/ended
        self.cond = threading.Condition()

    def run(self):
        while not STOP.is_set():
            try:
                ws = WebSocket(self.port, self.token, "/api/ws/mux?after=%d" % self.cursor, timeout=1)
            except OSError:
                C.add("mux connect refused")
                time.sleep(0.2)
                continue
            C.add("mux connects")
            try:
                while not STOP.is_set():
                    try:
                        op, payload = ws.recv()
                    except socket.timeout:
                        continue
                    if op == 8:
                        C.add("mux closed %d" % payload)
                        break
                    frame = json.loads(payload)
                    if frame.get("method") != "session.event":
                        continue
                    cursor = frame["cursor"]
                    with self.cond:
                        if cursor <= self.cursor:
                            C.add("mux cursor out of order")
                        self.cursor = max(self.cursor, cursor)
                        ev = frame["payload"]["event"]
                        if ev["kind"] == "turn/ended":
                            sid = ev["sessionId"]
                            self.ended[sid] = self.ended.get(sid, 0) + 1
                            self.reason[sid] = (ev.get("data") or {}).get("reason")
                            self.cond.notify_all()
                    C.add("mux events")
            except (EOFError, OSError):
                C.add("mux connection lost")
            finally:
                ws.sock.close()

    def last_reason(self, sid):
        with self.cond:
            return self.reason.get(sid)

    def ended_count(self, sid):
        with self.cond:
            return self.ended.get(sid, 0)

    def wait_ended(self, sid, more_than, timeout):
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.ended.get(sid, 0) <= more_than:
                left = deadline - time.monotonic()
                if left <= 0 or STOP.is_set():
                    return False
                self.cond.wait(min(left, 0.5))
            return True


def retrying(fn, what):
    """fn() again while the carrier fails (a reload in progress), for up to 30 s."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return fn()
        except OSError:
            C.add(what + " retried (carrier)")
            if time.monotonic() > deadline or STOP.is_set():
                raise
            time.sleep(0.2)


def browser_worker(n, browser, mux, cwd):
    sid = retrying(lambda: browser.call("session.create", {"cwd": cwd, "title": "soak-browser-%d" % n}),
                   "browser")["sessionId"]
    i = 0
    while not STOP.is_set():
        i += 1
        seen = mux.ended_count(sid)
        t0 = time.monotonic()
        try:
            retrying(lambda: browser.call("session.prompt", {"sessionId": sid, "text": "soak %d" % i}),
                     "browser prompt")
        except (OSError, RuntimeError) as e:
            # Withdrawing the browser plugin cancels its calls in flight (documented): expected then.
            if "'cancelled'" in str(e) and reloading("browser", t0):
                C.add("browser prompts cancelled by a browser reload")
            elif not STOP.is_set():
                C.add("browser prompt failed")
                log("browser prompt failed: %s" % e)
            time.sleep(0.2)
            continue
        if mux.wait_ended(sid, seen, PROMPT_TIMEOUT):
            reason = mux.last_reason(sid)
            if reason == "end":
                C.add("browser prompts")
                C.sample("browser", time.monotonic() - t0)
            elif reloading("openai", t0):
                # The provider withdrawn under a running turn: the turn ends, not as "end".
                C.add("browser turns ended %s by an openai reload" % reason)
            else:
                C.add("browser prompt failed")
                log("browser turn ended %s" % reason)
        elif not STOP.is_set():
            C.add("prompts without an end")
            log("browser session %s: no turn end within %.0f s" % (sid, PROMPT_TIMEOUT))
        if i % 5 == 0:
            try:
                retrying(lambda: browser.call("remote.invoke", {
                    "namespace": "sessions", "method": "rename",
                    "args": {"session": sid, "title": "soak-browser-%d-%d" % (n, i)}}), "remote")
                C.add("remote calls")
            except (OSError, RuntimeError) as e:
                # While the remote plugin reloads its descriptor is withdrawn (unavailable, not-found),
                # and a browser reload cancels the call in flight.
                if any(w in str(e) for w in ("unavailable", "not-found", "cancelled")) and (
                        reloading("remote", t0) or reloading("browser", t0)):
                    C.add("remote calls refused (reload)")
                elif not STOP.is_set():
                    C.add("remote calls failed")
                    log("remote.invoke failed: %s" % e)


def reconnecting_tab(port, token):
    cursor = 0
    while not STOP.is_set():
        try:
            ws = WebSocket(port, token, "/api/ws/mux?after=%d" % cursor, timeout=0.5)
        except OSError:
            time.sleep(0.2)
            continue
        C.add("tab reconnects")
        end = time.monotonic() + 1.5
        try:
            while time.monotonic() < end:
                try:
                    op, payload = ws.recv()
                except socket.timeout:
                    continue
                if op == 8:
                    break
                frame = json.loads(payload)
                if frame.get("method") == "session.event":
                    cursor = max(cursor, frame["cursor"])
        except (EOFError, OSError):
            pass
        ws.close()


def slow_consumer(port, token):
    while not STOP.is_set():
        try:
            ws = WebSocket(port, token, "/api/ws/mux", rcvbuf=4096, timeout=2)
        except OSError:
            time.sleep(0.5)
            continue
        C.add("slow consumers")
        STOP.wait(30)
        # Drain what it was sent: the daemon gave up on it (a close 1013, or the connection dropped when
        # the close frame could not be sent within 10 s), or it still holds it.
        ws.sock.settimeout(0.5)
        try:
            while True:
                op, payload = ws.recv()
                if op == 8:
                    C.add("slow consumer closed %d" % payload)
                    break
        except socket.timeout:
            C.add("slow consumer held")
        except (EOFError, OSError):
            C.add("slow consumer dropped")
        ws.sock.close()


def sdk_worker(binary, args, cwd, client_dir):
    sys.path.insert(0, client_dir)
    from agenthost import Client  # noqa: E402 (the repository's client, not an installed one)

    while not STOP.is_set():
        with Client(binary=binary, args=args) as client:
            client.initialize(cwd=cwd)
            session = client.session()
            for i in range(200):  # then a new child: spawn and exit are part of the soak
                if STOP.is_set():
                    break
                t0 = time.monotonic()
                result = session.run("sdk soak %d" % i, timeout=PROMPT_TIMEOUT)
                if result.finish_reason == "end":
                    C.add("sdk prompts")
                    C.sample("sdk", time.monotonic() - t0)
                else:
                    C.add("sdk prompt failed")
                    log("sdk prompt ended %s" % result.finish_reason)
        C.add("sdk children")


def acp_worker(binary, args, cwd):
    while not STOP.is_set():
        p = subprocess.Popen([binary] + args + ["acp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, bufsize=1)
        rid = 0

        def request(method, params):
            nonlocal rid
            rid += 1
            p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n")
            p.stdin.flush()
            while True:
                line = p.stdout.readline()
                if not line:
                    raise EOFError("agenthost acp closed its output")
                msg = json.loads(line)
                if msg.get("id") == rid and "method" not in msg:
                    if "error" in msg:
                        raise RuntimeError("%s: %s" % (method, msg["error"]))
                    return msg["result"]
                if msg.get("method") == "session/update":
                    C.add("acp updates")

        request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        sid = request("session/new", {"cwd": cwd, "mcpServers": []})["sessionId"]
        for i in range(200):
            if STOP.is_set():
                break
            t0 = time.monotonic()
            try:
                r = request("session/prompt", {"sessionId": sid,
                                               "prompt": [{"type": "text", "text": "acp soak %d" % i}]})
            except RuntimeError as e:
                C.add("acp prompt failed")
                log("acp prompt failed: %s" % e)
                continue
            if r.get("stopReason") == "end_turn":
                C.add("acp prompts")
                C.sample("acp", time.monotonic() - t0)
            else:
                C.add("acp prompt failed")
                log("acp prompt stopped %s" % r)
        p.stdin.close()
        status = p.wait(timeout=30)
        if status != 0:
            C.add("crashes")
            log("agenthost acp exited with status %d" % status)
        C.add("acp children")


def reloader(binary, args, names):
    i = 0
    while not STOP.wait(10):
        name = names[i % len(names)]
        i += 1
        with LOCK:
            window = [time.monotonic(), None]
            RELOADS.setdefault(name, []).append(window)
        r = subprocess.run([binary] + args + ["plugins", "reload", name], capture_output=True, text=True,
                           timeout=60)
        with LOCK:
            window[1] = time.monotonic()
            RELOADS[name][-1] = tuple(window)
        if r.returncode == 0 and r.stdout.startswith("reloaded " + name):
            C.add("reloads")
        else:
            C.add("reloads failed")
            log("reload %s failed (%d): %s %s" % (name, r.returncode, r.stdout.strip(), r.stderr.strip()))


def guarded(name, fn, *a):
    def run():
        try:
            fn(*a)
        except Exception as e:  # a worker that dies is a finding, not a silent stop
            if not STOP.is_set():
                C.add("workers died")
                log("worker %s died: %r" % (name, e))

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(p / 100.0 * len(values) + 0.5)) - 1))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agenthost", required=True)
    ap.add_argument("--fake-model", required=True)
    ap.add_argument("--python-client", required=True)
    ap.add_argument("--seconds", type=float, default=1800)
    ap.add_argument("--settle", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=None)
    ap.add_argument("--no-memory-verdicts", dest="memory_verdicts", action="store_false",
                    help="print the RSS and descriptor figures without judging them (a short run's warm-up is "
                         "too short for a drift to mean anything)")
    opts = ap.parse_args()
    warmup = opts.warmup if opts.warmup is not None else max(20.0, opts.seconds / 10)
    binary = os.path.abspath(opts.agenthost)

    work = tempfile.mkdtemp(prefix="agenthost-soak-")
    fake = daemon = None
    missed = []
    try:
        # The fake model: every answer streamed in 12 chunks, 5 ms apart.
        port_file = os.path.join(work, "fake.port")
        fake = subprocess.Popen([sys.executable, opts.fake_model, "--port-file", port_file],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            time.sleep(0.05)
        fake_port = int(open(port_file).read())
        chunks = [{"choices": [{"index": 0, "delta": {"content": "chunk %d " % i}}]} for i in range(12)]
        chunks[-1]["choices"][0]["finish_reason"] = "stop"
        chunks.append({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 12,
                                                "total_tokens": 24}})
        script = json.dumps([{"sse": chunks + ["[DONE]"], "delay_ms": 5}])
        conn = http.client.HTTPConnection("127.0.0.1", fake_port, timeout=10)
        conn.request("POST", "/_control/script", body=script)
        assert conn.getresponse().status == 200
        conn.close()

        port = free_port()
        cwd = os.path.join(work, "project")
        os.makedirs(cwd)
        conf = os.path.join(work, "agenthost.ini")
        with open(conf, "w") as f:
            f.write("[host]\nstate_dir = %s/state\nruntime_dir = %s/run\ndefault_provider = fake\n"
                    "idle_unload_s = 5\n"
                    "[plugin.browser]\nlisten = 127.0.0.1:%d\nws_queue_bytes = 262144\n"
                    "[provider.fake]\ntype = openai\nbase_url = http://127.0.0.1:%d/v1\nmodel = m1\n"
                    "max_retries = 0\n" % (work, work, port, fake_port))
        args = ["--config", conf]
        serve_log = open(os.path.join(work, "serve.log"), "w")
        daemon = subprocess.Popen([binary] + args + ["serve"], stdout=subprocess.PIPE, stderr=serve_log,
                                  text=True)
        url = daemon.stdout.readline().strip()
        if "#k=" not in url:
            log("the daemon printed no launch URL; its log is %s" % serve_log.name)
            return 1
        token = url.split("#k=", 1)[1]
        listing = subprocess.run([binary] + args + ["plugins", "list"], capture_output=True, text=True,
                                 check=True).stdout
        names = [line.split()[0] for line in listing.splitlines()
                 if line.split() and line.split()[0] in ("browser", "remote", "openai", "mcp")]
        log("daemon pid %d on port %d; plugins reloaded in turn: %s; %.0f s (warm-up %.0f s, settle %.0f s)"
            % (daemon.pid, port, ", ".join(names), opts.seconds, warmup, opts.settle))

        browser = Browser(port, token)
        mux = Mux(port, token)
        threads = [guarded("mux", mux.run)]
        time.sleep(0.5)
        threads += [guarded("browser-%d" % n, browser_worker, n, browser, mux, cwd) for n in range(3)]
        threads += [guarded("tab", reconnecting_tab, port, token), guarded("slow", slow_consumer, port, token),
                    guarded("sdk", sdk_worker, binary, args, cwd, opts.python_client),
                    guarded("acp", acp_worker, binary, args, cwd),
                    guarded("reload", reloader, binary, args, names)]

        samples = []
        start = time.monotonic()
        baseline = None
        base_census = {}
        peer_names = {fake_port: "the fake model", port: "the browser listener"}
        while time.monotonic() - start < opts.seconds:
            time.sleep(5)
            if daemon.poll() is not None:
                C.add("crashes")
                log("the daemon exited with status %d during the soak" % daemon.returncode)
                break
            now = time.monotonic() - start
            samples.append((now, rss_kib(daemon.pid), fd_count(daemon.pid)))
            if baseline is None and now >= warmup:
                baseline = samples[-1]
                base_census = fd_census(daemon.pid, peer_names)
                log("baseline at %.0f s: RSS %d KiB, %d descriptors" % baseline)
                log("descriptors at the baseline: %s" % census_text(base_census))
            if int(now) % 300 < 5:
                log("%.0f s: RSS %d KiB, %d fds; prompts browser %d, sdk %d, acp %d; reloads %d"
                    % (now, samples[-1][1], samples[-1][2], C.get("browser prompts"), C.get("sdk prompts"),
                       C.get("acp prompts"), C.get("reloads")))
        STOP.set()
        for t in threads:
            t.join(timeout=PROMPT_TIMEOUT + 10)
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            log("workers still running after the stop: %s" % ", ".join(alive))
        time.sleep(opts.settle)
        end = (time.monotonic() - start, rss_kib(daemon.pid), fd_count(daemon.pid))
        end_census = fd_census(daemon.pid, peer_names)
        peak = max(s[1] for s in samples) if samples else -1

        stop = subprocess.run([binary] + args + ["stop"], capture_output=True, text=True, timeout=90)
        try:
            status = daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            status = -1
        if stop.returncode != 0 or status != 0:
            C.add("crashes")
            log("the daemon's stop: agenthost stop %d, exit status %s" % (stop.returncode, status))

        # ---- figures ----------------------------------------------------------------------------------
        print("soak: figures over %.0f s" % opts.seconds)
        for surface in ("browser", "sdk", "acp"):
            lat = C.lat.get(surface, [])
            print("  %-8s prompts %6d  failed %4d  prompt→end p50 %7.1f ms  p99 %7.1f ms"
                  % (surface, C.get(surface + " prompts"), C.get(surface + " prompt failed"),
                     percentile(lat, 50) * 1000, percentile(lat, 99) * 1000))
        print("  remote   calls %d, refused while the remote or browser plugin reloaded %d, failed otherwise %d"
              % (C.get("remote calls"), C.get("remote calls refused (reload)"), C.get("remote calls failed")))
        with LOCK:
            by_reload = sorted((k, v) for k, v in C.v.items() if "reload" in k and k.startswith("browser "))
        print("  browser  expected outcomes of reloads: %s"
              % (", ".join("%s %d" % (k, v) for k, v in by_reload) or "none"))
        print("  reloads  %d done, %d failed; mux connects %d (1001 closes %d), events %d, "
              "cursors out of order %d" % (C.get("reloads"), C.get("reloads failed"), C.get("mux connects"),
                                            C.get("mux closed 1001"), C.get("mux events"),
                                            C.get("mux cursor out of order")))
        print("  tabs     %d reconnections; slow consumers %d: closed 1013 %d, dropped %d, held %d, closed "
              "1001 (reload) %d" % (C.get("tab reconnects"), C.get("slow consumers"),
                                    C.get("slow consumer closed 1013"), C.get("slow consumer dropped"),
                                    C.get("slow consumer held"), C.get("slow consumer closed 1001")))
        print("  children sdk %d, acp %d (each ran up to 200 prompts, then exited and was replaced)"
              % (C.get("sdk children"), C.get("acp children")))
        print("  carrier  retries while a plugin reloaded: browser %d, prompt %d, remote %d"
              % (C.get("browser retried (carrier)"), C.get("browser prompt retried (carrier)"),
                 C.get("remote retried (carrier)")))
        if baseline is None:
            log("the run ended before the warm-up did: no baseline")
            return 1
        drift = 100.0 * (end[1] - baseline[1]) / baseline[1]
        print("  daemon   RSS baseline %d KiB (at %.0f s), peak %d KiB, end %d KiB (after %.0f s settle): "
              "drift %+.1f %%" % (baseline[1], baseline[0], peak, end[1], opts.settle, drift))
        print("  daemon   descriptors baseline %d, end %d" % (baseline[2], end[2]))
        grown = {k: end_census.get(k, 0) - base_census.get(k, 0) for k in set(end_census) | set(base_census)}
        print("  daemon   descriptors at the end: %s; against the baseline: %s"
              % (census_text(end_census), census_text({k: v for k, v in grown.items() if v}) or "the same"))

        verdicts = []
        if opts.memory_verdicts:
            # Per kind: the soak's own connections come and go (none is left at the end), so a total
            # taken while some were open could hide a leak of another kind.
            # The connections to the fake model are the HTTP client's cache (libcurl keeps a connection per
            # turn that ran at once, up to four times as many): a pool, bounded by the prompts in flight
            # (3 browser workers, the sdk and the acp child), not flat.
            pool = "tcp to the fake model"
            flat = all(v <= 0 for k, v in grown.items() if k != pool) and \
                end_census.get(pool, 0) <= MODEL_POOL_MAX and \
                not any(k.startswith("tcp from a client") for k in end_census)
            verdicts += [("RSS drift < 5 %", drift < 5.0),
                         ("descriptors flat (none of any kind more than at the baseline; the model "
                          "connections a pool of at most %d)" % MODEL_POOL_MAX, flat)]
        verdicts += [
            ("every worker stopped when told", not alive),
            ("0 crashes", C.get("crashes") == 0 and C.get("workers died") == 0),
            ("every prompt ended (0 without an end in %.0f s)" % PROMPT_TIMEOUT,
             C.get("prompts without an end") == 0),
            ("0 cursors out of order on the mux", C.get("mux cursor out of order") == 0),
            ("0 failed prompts, remote calls, reloads",
             sum(C.get(k) for k in ("browser prompt failed", "sdk prompt failed", "acp prompt failed",
                                    "remote calls failed", "reloads failed")) == 0),
            ("prompts on every surface",
             all(C.get(k) > 0 for k in ("browser prompts", "sdk prompts", "acp prompts", "remote calls"))),
        ]
        for name, ok in verdicts:
            print("  %-48s %s" % (name, "met" if ok else "MISSED"))
            if not ok:
                missed.append(name)
        print("soak: %d passed, %d failed" % (len(verdicts) - len(missed), len(missed)))
        return 1 if missed else 0
    finally:
        STOP.set()
        for p in (daemon, fake):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
