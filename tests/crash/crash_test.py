#!/usr/bin/env python3
"""The crash test: acknowledged prompts survive a kill -9 of the daemon (DECISIONS.md "Durability").

Usage: crash_test.py AGENTHOST [--seed N] [--prompts N] [--keep]

1. Start `agenthost serve` in a fresh temporary state and runtime directory.
2. Over the admin socket (JSON Lines JSON-RPC 2.0), create a few sessions and send PROMPTS session.prompt
   requests ("p<N>", round robin over the sessions), pipelined (up to 256 in flight). Every acknowledged
   messageId is appended to acks.txt and flushed as it arrives.
3. After a random fraction (20..80 %, from the printed seed) of the acknowledgments, kill -9 the daemon.
4. Start it again on the same directories (the stale socket and lock are the daemon's business), wait until
   every session is idle and stays so (recovery settled), stop it with SIGTERM (exit 0, "stopped").
5. Check the SQLite file directly: every acknowledged prompt is stored once, seqs have no gap, every turn
   ended exactly once (the interrupted one with reason "error"), no inbox row is left open, and the
   restarted host started normally.

Standard library only. Prints what it checked and ends with "N passed, N failed"; exits 1 on a failure.
"""

import argparse
import json
import os
import random
import selectors
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import shutil

SESSIONS = 4
WINDOW = 256
ADMIN_WAIT_S = 15
SETTLE_LIMIT_S = 60

procs = []  # every daemon started, killed at the end whatever happens


def kill_all():
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
                p.wait(timeout=10)
            except Exception:  # noqa: BLE001 - best effort at exit
                pass


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, ok, what, detail=""):
        if ok:
            self.passed += 1
            print(f"PASS {what}")
        else:
            self.failed += 1
            print(f"FAIL {what}" + (f": {detail}" if detail else ""))
        sys.stdout.flush()
        return ok


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}")
    sys.stdout.flush()


class Daemon:
    def __init__(self, exe, root, config, name):
        self.exe = exe
        self.state = os.path.join(root, "state")
        self.run = os.path.join(root, "run")
        self.sock = os.path.join(self.run, "admin.sock")
        self.log_path = os.path.join(root, f"{name}.log")
        self.config = config
        self.proc = None

    def start(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTHOST_")}
        with open(self.log_path, "ab") as err, open(self.log_path + ".out", "ab") as out:
            self.proc = subprocess.Popen(
                [self.exe, "--config", self.config, "--state-dir", self.state, "--runtime-dir", self.run,
                 "serve"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        procs.append(self.proc)

    def log_text(self):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def connect(self):
        """Wait until the admin socket answers (a fresh one: a stale socket refuses connections)."""
        deadline = time.monotonic() + ADMIN_WAIT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                c = Rpc(self.sock)
                c.call("session.list", {})
                return c
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no answer on {self.sock} after {ADMIN_WAIT_S} s:\n{self.log_text()}")
                time.sleep(0.02)


class Rpc:
    """A blocking JSON Lines JSON-RPC 2.0 client for the simple calls."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(30)
        self.s.connect(path)
        self.buf = b""
        self.next_id = 1

    def call(self, method, params):
        rid = self.next_id
        self.next_id += 1
        self.s.sendall(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode()
                       + b"\n")
        while True:
            while b"\n" not in self.buf:
                chunk = self.s.recv(65536)
                if not chunk:
                    raise ConnectionError("the daemon closed the admin connection")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            msg = json.loads(line)
            if msg.get("id") != rid:
                continue  # not ours (a notification)
            if "error" in msg:
                raise RuntimeError(f"{method}: {msg['error']}")
            return msg["result"]

    def close(self):
        self.s.close()


def flood(sock_path, sessions, total, kill_at, daemon, acks_path):
    """Pipeline `total` prompts; kill -9 the daemon after `kill_at` acknowledgments. Returns stats."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    s.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(s, selectors.EVENT_READ)
    acks = open(acks_path, "w")
    sent = 0
    in_flight = {}
    acked = 0
    errors = []
    out = b""
    inbuf = b""
    killed_at = None
    kill_time = None
    eof = False
    t0 = time.monotonic()
    base_id = 1000
    while not eof:
        # Fill the window.
        while killed_at is None and sent < total and len(in_flight) < WINDOW:
            rid = base_id + sent
            sid = sessions[sent % len(sessions)]
            out += json.dumps({"jsonrpc": "2.0", "id": rid, "method": "session.prompt",
                               "params": {"sessionId": sid, "text": f"p{sent}"}}).encode() + b"\n"
            in_flight[rid] = sid
            sent += 1
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if out else 0)
        sel.modify(s, events)
        ready = sel.select(timeout=30)
        if not ready:
            raise RuntimeError(f"no progress for 30 s ({acked} acknowledged, {len(in_flight)} in flight)")
        for _, ev in ready:
            if ev & selectors.EVENT_WRITE and out:
                try:
                    n = s.send(out)
                    out = out[n:]
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    out = b""  # the daemon is gone: what it answered is still readable
            if ev & selectors.EVENT_READ:
                try:
                    chunk = s.recv(1 << 20)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    eof = True
                    break
                inbuf += chunk
                *lines, inbuf = inbuf.split(b"\n")
                for line in lines:
                    msg = json.loads(line)
                    rid = msg.get("id")
                    if rid not in in_flight:
                        continue
                    sid = in_flight.pop(rid)
                    mid = (msg.get("result") or {}).get("messageId")
                    if mid:
                        acks.write(f"{mid} {sid}\n")
                        acks.flush()
                        acked += 1
                    else:
                        errors.append(msg.get("error"))
                if killed_at is None and acked >= kill_at:
                    os.kill(daemon.proc.pid, signal.SIGKILL)
                    kill_time = time.monotonic()
                    killed_at = acked
        if killed_at is None and sent == total and not in_flight:
            break  # every prompt answered before the kill point (only when kill_at > total)
    acks.close()
    sel.close()
    s.close()
    return {"sent": sent, "acked": acked, "acked_at_kill": killed_at, "errors": errors,
            "in_flight_at_end": len(in_flight), "seconds": (kill_time or time.monotonic()) - t0}


def settle(daemon, sessions):
    """Poll until every session is idle with an unchanged lastSeq over consecutive polls (bounded)."""
    c = daemon.connect()
    t0 = time.monotonic()
    deadline = t0 + SETTLE_LIMIT_S
    stable = 0
    last = None
    try:
        while time.monotonic() < deadline:
            snap = []
            for sid in sessions:
                row = c.call("session.get", {"sessionId": sid})["session"]
                snap.append((row.get("status"), row.get("lastSeq")))
            idle = all(st == "idle" for st, _ in snap)
            stable = stable + 1 if idle and snap == last else 0
            last = snap
            if stable >= 3:
                return True, time.monotonic() - t0
            time.sleep(0.2)
        return False, time.monotonic() - t0
    finally:
        c.close()


def verify(db_path, acked, sessions, checks):
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    q = db.execute

    # (a) every acknowledged messageId has its inbox row and exactly one inbox/received event
    inbox = {mid: (sid, state) for mid, sid, state in q("SELECT message_id, session_id, state FROM inbox")}
    received = {}
    for (mid,) in q("SELECT message_id FROM events WHERE kind = 'inbox/received'"):
        received[mid] = received.get(mid, 0) + 1
    missing_row = [m for m, _ in acked if m not in inbox]
    wrong_session = [m for m, sid in acked if m in inbox and inbox[m][0] != sid]
    not_once = [m for m, _ in acked if received.get(m, 0) != 1]
    checks.check(not missing_row and not wrong_session,
                 f"(a) all {len(acked)} acknowledged prompts have their inbox row in their session",
                 f"{len(missing_row)} missing, {len(wrong_session)} in another session; e.g. "
                 f"{(missing_row + wrong_session)[:3]}")
    checks.check(not not_once, f"(a) each has exactly one inbox/received event ({sum(received.values())} "
                 "received events in all)",
                 f"{len(not_once)} not exactly once, e.g. {[(m, received.get(m, 0)) for m in not_once[:3]]}")
    dup_received = [m for m, n in received.items() if n != 1]
    checks.check(not dup_received, f"(a) no messageId was received twice ({len(received)} distinct)",
                 f"{dup_received[:3]}")

    # (b) per session: seq exactly 1..max, no gap, no duplicate
    bad_seq = []
    total_events = 0
    for (sid,) in q("SELECT id FROM sessions"):
        seqs = [r[0] for r in q("SELECT seq FROM events WHERE session_id = ? ORDER BY seq", (sid,))]
        total_events += len(seqs)
        last_seq = q("SELECT last_seq FROM sessions WHERE id = ?", (sid,)).fetchone()[0]
        if seqs != list(range(1, len(seqs) + 1)) or last_seq != len(seqs):
            bad_seq.append((sid, len(seqs), last_seq))
    checks.check(not bad_seq, f"(b) every session's seqs are exactly 1..max ({total_events} events in "
                 f"{len(sessions)} sessions), matching the sessions' lastSeq",
                 f"gaps, duplicates or another lastSeq (session, events, lastSeq): {bad_seq}")

    # (c) every received messageId has exactly one turn/ended; every turn/started has its turn/ended; an
    # ended-with-error turn says it was interrupted
    ended = {}
    error_ends = []
    for mid, tid, data in q("SELECT message_id, turn_id, data FROM events WHERE kind = 'turn/ended'"):
        ended[mid] = ended.get(mid, 0) + 1
        d = json.loads(data)
        if d.get("reason") == "error":
            error_ends.append((mid, tid, d.get("error", "")))
    not_ended_once = [m for m in received if ended.get(m, 0) != 1]
    checks.check(not not_ended_once, f"(c) every received prompt has exactly one turn/ended "
                 f"({sum(ended.values())} turn/ended events)",
                 f"{len(not_ended_once)} not exactly once, e.g. "
                 f"{[(m, ended.get(m, 0)) for m in not_ended_once[:3]]}")
    started = [r[0] for r in q("SELECT turn_id FROM events WHERE kind = 'turn/started'")]
    ended_turns = {}
    for (tid,) in q("SELECT turn_id FROM events WHERE kind = 'turn/ended'"):
        ended_turns[tid] = ended_turns.get(tid, 0) + 1
    unmatched = [t for t in started if ended_turns.get(t, 0) != 1]
    checks.check(not unmatched, f"(c) every turn/started ({len(started)}) has exactly one turn/ended",
                 f"{len(unmatched)} unmatched, e.g. {unmatched[:3]}")
    not_interrupted = [e for e in error_ends if "interrupted" not in (e[2] or "")]
    checks.check(not not_interrupted, f"(c) turns ended with reason error ({len(error_ends)}) say "
                 "\"interrupted\"", f"{not_interrupted[:3]}")
    # a turn/ended must come after its turn's other events: it is the turn's last event
    late = q("SELECT COUNT(*) FROM events e JOIN events t ON t.session_id = e.session_id AND "
             "t.turn_id = e.turn_id AND t.kind = 'turn/ended' WHERE e.seq > t.seq").fetchone()[0]
    checks.check(late == 0, "(c) turn/ended is the last event of its turn", f"{late} events after it")

    # (d) no inbox row left queued or claimed
    open_rows = q("SELECT state, COUNT(*) FROM inbox WHERE state IN ('queued', 'claimed') "
                  "GROUP BY state").fetchall()
    states = dict(q("SELECT state, COUNT(*) FROM inbox GROUP BY state").fetchall())
    checks.check(not open_rows, f"(d) no inbox row is queued or claimed (inbox states: {states})",
                 f"{open_rows}")
    db.close()
    return {"events": total_events, "received": len(received), "error_ends": len(error_ends),
            "states": states}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("agenthost")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--prompts", type=int, default=10000)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    fraction = rng.uniform(0.2, 0.8)
    kill_at = max(1, int(args.prompts * fraction))
    print(f"crash test: seed {seed} (reproduce with --seed {seed}); {args.prompts} prompts over {SESSIONS} "
          f"sessions, up to {WINDOW} in flight; kill -9 after {kill_at} acknowledgments ({fraction:.1%})")
    sys.stdout.flush()

    root = tempfile.mkdtemp(prefix="agenthost-crash-")
    config = os.path.join(root, "agenthost.ini")
    # Never the user's configuration. The browser and remote plugins (enabled by default) are switched off:
    # this test is about the store, and must not race other tests for a port.
    with open(config, "w") as f:
        f.write("[plugin.browser]\nenabled = false\n[plugin.remote]\nenabled = false\n")
    cwd = os.path.join(root, "work")
    os.mkdir(cwd)
    acks_path = os.path.join(root, "acks.txt")
    checks = Checks()
    t_start = time.monotonic()
    ok = False
    try:
        first = Daemon(args.agenthost, root, config, "daemon1")
        first.start()
        c = first.connect()
        sessions = [c.call("session.create", {"cwd": cwd, "title": f"crash {i}"})["sessionId"]
                    for i in range(SESSIONS)]
        c.close()
        log(f"daemon 1 (pid {first.proc.pid}) up; {len(sessions)} sessions created")

        stats = flood(first.sock, sessions, args.prompts, kill_at, first, acks_path)
        first.proc.wait(timeout=10)
        rate = stats["acked"] / stats["seconds"] if stats["seconds"] > 0 else 0
        log(f"sent {stats['sent']}, acknowledged {stats['acked']} (kill -9 after {stats['acked_at_kill']}; "
            f"{stats['acked'] - (stats['acked_at_kill'] or 0)} more read from the socket after it) in "
            f"{stats['seconds']:.2f} s ({rate:.0f}/s); {len(stats['errors'])} error answers; daemon 1 status "
            f"{first.proc.returncode}")
        checks.check(stats["acked_at_kill"] is not None and first.proc.returncode == -signal.SIGKILL,
                     f"the daemon was killed with SIGKILL after {stats['acked_at_kill']} acknowledgments")
        checks.check(not stats["errors"], "no prompt was refused before the kill",
                     f"{len(stats['errors'])}: {stats['errors'][:3]}")

        acked = []
        with open(acks_path) as f:
            for line in f:
                mid, sid = line.split()
                acked.append((mid, sid))
        checks.check(len(acked) == stats["acked"] and len({m for m, _ in acked}) == len(acked),
                     f"the acknowledgment file holds {len(acked)} distinct messageIds")

        second = Daemon(args.agenthost, root, config, "daemon2")
        t_restart = time.monotonic()
        second.start()
        second.connect().close()
        log(f"daemon 2 (pid {second.proc.pid}) answers after {time.monotonic() - t_restart:.2f} s")
        settled, took = settle(second, sessions)
        checks.check(settled, f"recovery settled: every session idle and unchanged ({took:.2f} s, "
                     f"limit {SETTLE_LIMIT_S} s)")
        second.proc.send_signal(signal.SIGTERM)
        try:
            rc = second.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = None
        text = second.log_text()
        checks.check(rc == 0 and "stopped" in text, f"the restarted daemon stopped on SIGTERM (exit {rc}) "
                     "and logged \"stopped\"", text[-2000:])

        # (e) the restarted host started normally
        store_errors = [ln for ln in text.splitlines() if " ERROR " in ln and ("store" in ln or "session" in ln)]
        checks.check("running in serve mode" in text and not store_errors,
                     "(e) the restarted host logged \"running in serve mode\" and no store ERROR",
                     "\n".join(store_errors[:5]) or text[-2000:])

        db_path = os.path.join(first.state, "agenthost.db")
        figures = verify(db_path, acked, sessions, checks)
        log(f"store: {figures['events']} events, {figures['received']} prompts received, "
            f"{figures['error_ends']} turn(s) ended as interrupted; inbox {figures['states']}")
        log(f"whole run {time.monotonic() - t_start:.1f} s")
        ok = checks.failed == 0
    except Exception as e:  # noqa: BLE001 - any failure is a failed check, reported with its cause
        checks.check(False, "the run completed", f"{type(e).__name__}: {e}")
    finally:
        kill_all()
        if ok and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root} (logs, acks.txt, state/agenthost.db)")
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    import atexit

    atexit.register(kill_all)
    sys.exit(main())
