"""Integration tests of the Python client (plugins/sdk/python) against the real `agenthost sdk`.

The binary comes from $AH_TEST_AGENTHOST (meson sets it); tests that need it are skipped without it.
A few tests use small script binaries (a child that ignores SIGTERM, one that exits 3, one that reports
its environment) or tests/python/fake_server.py for what the real host cannot be made to do.

Run: PYTHONPATH=plugins/sdk/python AH_TEST_AGENTHOST=build/host/agenthost \
     python3 -m unittest -v discover -s tests/python
Besides unittest's own summary, a final line "N passed, N failed" is printed at exit.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from typing import Any, List, Optional, Tuple

from agenthost import (AlreadyResponded, Client, ConnectionLost, Notification, ProtocolError, RpcError,
                       TransportError, UnknownOutcome)

HERE = os.path.dirname(os.path.abspath(__file__))
AGENTHOST = os.environ.get("AH_TEST_AGENTHOST", "")

# ---- "N passed, N failed" at exit ---------------------------------------------------------------------

_totals = {"run": 0, "failed": 0, "skipped": 0}


class _CountingResult(unittest.TextTestResult):
    """unittest's text result that also adds its counts to the module totals printed at exit."""

    def stopTestRun(self) -> None:
        super().stopTestRun()
        _totals["run"] += self.testsRun
        _totals["failed"] += len(self.failures) + len(self.errors) + len(self.unexpectedSuccesses)
        _totals["skipped"] += len(self.skipped)


unittest.TextTestRunner.resultclass = _CountingResult  # the runner unittest.main() builds uses it


@atexit.register
def _print_totals() -> None:
    if _totals["run"] == 0 and _totals["failed"] == 0:
        return
    passed = _totals["run"] - _totals["failed"] - _totals["skipped"]
    if _totals["skipped"]:
        print(f"{_totals['skipped']} skipped", flush=True)
    print(f"{passed} passed, {_totals['failed']} failed", flush=True)


# ---- helpers -----------------------------------------------------------------------------------------


def write_script(directory: str, name: str, body: str) -> str:
    """An executable /bin/sh script in DIRECTORY."""
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def group_gone(pgid: int, within: float = 2.0) -> bool:
    """True once no process of the group PGID is left (zombies reaped by init count as gone)."""
    deadline = time.monotonic() + within
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def process_alive(pid: int) -> bool:
    """True while PID exists and is not a zombie (a zombie has exited, whoever reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class TmpDirCase(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="ah-py-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.clients: List[Client] = []

    def tearDown(self) -> None:
        for c in self.clients:
            c.close(shutdown_timeout=2.0, eof_timeout=2.0, term_timeout=1.0)

    def track(self, client: Client) -> Client:
        self.clients.append(client)
        return client


@unittest.skipUnless(AGENTHOST and os.access(AGENTHOST, os.X_OK), "AH_TEST_AGENTHOST is not an executable")
class RealHostTest(TmpDirCase):
    """Against the real `agenthost sdk` with a private state dir and an empty configuration."""

    def setUp(self) -> None:
        super().setUp()
        self.config = os.path.join(self.tmp, "empty.ini")
        open(self.config, "w").close()
        # The sessions' cwd lies outside the state directory: the file tools refuse the host's own files.
        self.work = tempfile.mkdtemp(prefix="ah-py-work-")
        self.addCleanup(shutil.rmtree, self.work, True)

    def client(self, requests: bool = False, initialize: bool = True, **kw) -> Client:
        c = self.track(Client(AGENTHOST, args=["--state-dir", self.tmp, "--runtime-dir",
                                                os.path.join(self.tmp, "run"), "--config", self.config], **kw))
        if initialize:
            c.initialize(self.work, requests=requests)
        return c

    def test_initialize_fields(self) -> None:
        c = self.client(initialize=False)
        res = c.initialize(self.work)
        self.assertEqual(res.server_name, "agenthost")
        self.assertRegex(res.server_version, r"^\d+\.\d+")
        self.assertEqual(res.protocol_version, 1)
        self.assertIsInstance(res.capabilities, dict)
        self.assertEqual(res.raw["serverInfo"]["name"], "agenthost")
        with self.assertRaises(RpcError) as ctx:  # a second initialize is refused
            c.initialize(self.work)
        self.assertEqual(ctx.exception.code, -32600)

    def test_request_before_initialize_is_not_initialized(self) -> None:
        c = self.client(initialize=False)
        with self.assertRaises(RpcError) as ctx:
            c.prompt("hello")
        self.assertEqual(ctx.exception.code, -32002)
        self.assertEqual(ctx.exception.method, "session/prompt")
        c.initialize(self.work)  # the connection is still usable

    def test_unknown_session_is_32002(self) -> None:
        c = self.client()
        with self.assertRaises(RpcError) as ctx:
            c.prompt("hello", session_id="no-such-session")
        self.assertEqual(ctx.exception.code, -32002)
        self.assertIsInstance(ctx.exception.data, dict)

    def test_receipt_then_events_then_idle(self) -> None:
        c = self.client()
        sub = c.subscribe()
        receipt = c.prompt("hello")
        seen: List[str] = []
        while True:
            n = sub.next(timeout=10)
            assert n is not None
            if n.session_id != receipt.session_id:
                continue
            if n.method == "session.event":
                seen.append(n.event["kind"])  # type: ignore[index]
            elif n.method == "session.status" and n.params["status"] == "idle" and "turn/ended" in seen:
                break
        self.assertEqual(seen[0], "inbox/received")
        self.assertIn("message/committed", seen)
        self.assertEqual(seen[-1], "turn/ended")

    def test_run_hello(self) -> None:
        c = self.client()
        t0 = time.monotonic()
        r = c.session().run("hello", timeout=20)
        print(f"\n  run('hello'): {1000 * (time.monotonic() - t0):.1f} ms, {len(r.events)} events", flush=True)
        self.assertEqual(r.final_response, "echo: hello")
        self.assertEqual(r.finish_reason, "end")
        self.assertTrue(r.message_id)
        self.assertIsInstance(r.usage, dict)
        self.assertEqual(r.events[0]["kind"], "inbox/received")
        self.assertEqual(r.events[0]["messageId"], r.message_id)
        self.assertEqual([e for e in r.events if e["kind"] == "turn/ended"][-1]["data"]["reason"], "end")

    def test_deltas_stream_the_text_when_asked(self) -> None:
        c = self.track(Client(AGENTHOST, args=["--state-dir", self.tmp, "--runtime-dir",
                                                os.path.join(self.tmp, "run"), "--config", self.config]))
        res = c.initialize(self.work, deltas=True)
        self.assertIs(res.capabilities.get("deltas"), True)
        with c.subscribe(lambda n: n.method == "session.delta") as sub:
            r = c.session().run("/chunks 4\nstreamed in pieces", timeout=20)
            pieces = []
            while True:
                try:
                    n = sub.next(timeout=0.5)
                except TimeoutError:
                    break
                assert n is not None
                self.assertEqual(n.params["messageId"], r.message_id)
                pieces.append(n.params["text"])
        self.assertEqual(len(pieces), 4)
        self.assertEqual("".join(pieces), r.final_response)
        plain = self.client()  # without deltas=True: none
        with plain.subscribe(lambda n: n.method == "session.delta") as sub:
            plain.session().run("/chunks 4\nstreamed in pieces", timeout=20)
            with self.assertRaises(TimeoutError):
                sub.next(timeout=0.5)

    def test_run_twice_in_one_session(self) -> None:
        c = self.client()
        s = c.session()
        first = s.run("one", timeout=20)
        second = s.run("two", timeout=20)
        self.assertEqual(first.session_id, second.session_id)
        self.assertNotEqual(first.message_id, second.message_id)
        self.assertEqual(second.final_response, "echo: two")
        self.assertEqual(second.events[0]["messageId"], second.message_id)  # earlier events dropped

    def test_run_subagent(self) -> None:
        c = self.client()
        r = c.session().run("/subagent hi", timeout=20)
        self.assertEqual(r.final_response, "subagent: echo: hi")
        self.assertEqual(r.finish_reason, "end")
        child = {e["sessionId"] for e in r.events} - {r.session_id}
        self.assertEqual(len(child), 1, "the child's events are part of the run")

    def test_run_usage_counts_the_subagent_once_and_agrees_with_analyze_of_the_recording(self) -> None:
        """The run's usage (the client's arithmetic) equals `agenthost analyze` of this connection's own
        recording (the host's arithmetic): the two implementations tested against each other."""
        from agenthost import analyze
        rec = os.path.join(self.tmp, "rec")
        c = self.client(record_dir=rec)
        s = c.session()
        r = s.run("/subagent count me", timeout=20)
        r2 = s.run("and once more", timeout=20)
        self.assertEqual(len(r.turns), 2, r.turns)
        child = [t for t in r.turns if t["sessionId"] != r.session_id]
        self.assertEqual(len(child), 1)
        self.assertEqual(child[0]["parent"], r.session_id)
        self.assertEqual(r.total_usage["turns"], 1)
        self.assertEqual(r.tree_usage["sessions"], 2)
        self.assertEqual(r.tree_usage["inputTokens"],
                         r.total_usage["inputTokens"] + child[0]["usage"]["inputTokens"])
        self.assertEqual(r.total_usage["inputTokens"], r.usage["inputTokens"], "echo reports no round trips")
        c.close()
        files = [os.path.join(rec, f) for f in os.listdir(rec) if f.endswith(".jsonl")]
        self.assertEqual(len(files), 1)
        with open(files[0].replace(".jsonl", ".meta.json")) as f:
            meta = json.load(f)
        self.assertEqual(meta["source"], "client:python")
        rep = analyze(files, binary=AGENTHOST)
        self.assertEqual(rep["coverage"], {"complete": True, "issues": []})
        root = next(x for x in rep["sessions"] if x["id"] == r.session_id)
        own = dict(r.total_usage)
        own.pop("turns")
        both = dict(r2.total_usage)
        both.pop("turns")
        self.assertEqual(root["usage"], {k: own[k] + both[k] for k in own}, "the same arithmetic, two runs")
        self.assertEqual(root["treeUsage"]["sessions"], 2)
        self.assertEqual(len(root["turns"]), 2)

    @staticmethod
    def run_in_background(s: Any, text: str) -> Tuple[threading.Thread, dict]:
        """s.run(text) on a thread of its own: out gets "result" or "error", then "done" (monotonic)."""
        out: dict = {}

        def runner() -> None:
            try:
                out["result"] = s.run(text, timeout=20)
            except BaseException as exc:  # reported by the caller's assertions
                out["error"] = exc
            out["done"] = time.monotonic()

        th = threading.Thread(target=runner)
        th.start()
        return th, out

    def test_cancel_during_sleep(self) -> None:
        c = self.client()
        s = c.session()
        s.run("warm up", timeout=20)  # the session exists: its id is known
        sub = c.subscribe(lambda n: n.method == "session.event" and n.session_id == s.id
                          and n.event is not None and n.event.get("kind") == "turn/started")
        th, out = self.run_in_background(s, "/sleep 5000")
        self.assertIsNotNone(sub.next(timeout=10))
        t0 = time.monotonic()
        c.cancel(s.id)  # type: ignore[arg-type]
        th.join(timeout=10)
        self.assertNotIn("error", out)
        elapsed = out["done"] - t0
        print(f"\n  cancel → run() returned in {1000 * elapsed:.1f} ms", flush=True)
        self.assertEqual(out["result"].finish_reason, "cancelled")
        self.assertLess(elapsed, 1.0)

    def test_a_run_whose_queued_prompt_a_close_cancels_ends_cancelled_at_once(self) -> None:
        """SDK-TS-RUN: a prompt a close cancels while queued ends the run at once, cancelled."""
        c = self.client()
        s = c.session()
        s.run("warm up", timeout=20)
        started = c.subscribe(lambda n: n.method == "session.event" and n.session_id == s.id
                              and n.event is not None and n.event.get("kind") == "turn/started")
        first = s.prompt("/sleep 5000")  # runs
        self.assertIsNotNone(started.next(timeout=10))
        th, out = self.run_in_background(s, "queued behind the sleep")
        time.sleep(0.3)  # its receipt is in
        t0 = time.monotonic()
        c.close_session(s.id)  # type: ignore[arg-type]
        th.join(timeout=15)
        self.assertNotIn("error", out)
        r = out["result"]
        self.assertEqual(r.finish_reason, "cancelled")
        self.assertIn("never ran", r.error or "")
        self.assertIsNone(r.final_response)
        kinds = [e.get("kind") for e in r.events if e.get("messageId") == r.message_id]
        self.assertEqual(kinds, ["inbox/received", "inbox/cancelled"])
        self.assertNotEqual(r.message_id, first.message_id)
        self.assertLess(out["done"] - t0, 3.0, "it did not wait for the settle time")

    def test_approval_answered_through_server_request(self) -> None:
        c = self.client(requests=True)
        target = os.path.join(self.work, "approved.txt")
        args = json.dumps({"path": target, "content": "yes"})
        out: dict = {}
        s = c.session()
        th = threading.Thread(target=lambda: out.setdefault("result", s.run(f"/tool write_file {args}", timeout=20)))
        th.start()
        req = c.next_request(timeout=10)
        assert req is not None
        self.assertEqual(req.method, "request/approval")
        self.assertEqual(req.kind, "approval")
        self.assertIn("allow_once", req.options)
        self.assertEqual(req.params["params"]["tool"], "write_file")
        c.respond(req, {"optionId": "allow_once"})
        with self.assertRaises(AlreadyResponded):
            c.respond(req, {"optionId": "allow_once"})
        th.join(timeout=20)
        r = out["result"]
        self.assertEqual(r.finish_reason, "end")
        kinds = [e["kind"] for e in r.events]
        self.assertIn("tool/approval", kinds)
        approval = [e for e in r.events if e["kind"] == "tool/approval"][0]
        self.assertEqual(approval["data"]["outcome"], "granted")
        with open(target) as f:
            self.assertEqual(f.read(), "yes")

    def test_approval_denied_by_error_response(self) -> None:
        c = self.client(requests=True)
        target = os.path.join(self.work, "denied.txt")
        out: dict = {}
        s = c.session()
        args = json.dumps({"path": target, "content": "no"})
        th = threading.Thread(target=lambda: out.setdefault("result", s.run(f"/tool write_file {args}", timeout=20)))
        th.start()
        req = c.next_request(timeout=10)
        assert req is not None
        c.respond_error(req, -32000, "the user said no")
        th.join(timeout=20)
        approval = [e for e in out["result"].events if e["kind"] == "tool/approval"][0]
        self.assertEqual(approval["data"]["outcome"], "denied")
        self.assertFalse(os.path.exists(target))

    def test_filter_exception_ends_only_its_subscription(self) -> None:
        c = self.client()

        def bad(n: Notification) -> bool:
            raise RuntimeError("filter failed")

        broken = c.subscribe(bad)
        healthy = c.subscribe()
        r = c.session().run("hello", timeout=20)
        self.assertEqual(r.final_response, "echo: hello")  # run's own subscription kept working
        self.assertIsNone(broken.next(timeout=5))
        self.assertTrue(broken.closed)
        self.assertIsInstance(broken.error, RuntimeError)
        self.assertFalse(healthy.closed)
        got = healthy.next(timeout=5)
        self.assertIsNotNone(got)
        c.session().run("again", timeout=20)  # the client is unaffected
        self.assertFalse(healthy.closed)

    def test_timeout_is_unknown_outcome(self) -> None:
        c = self.client()
        pid = c.pid
        assert pid is not None
        # The host answers in well under 1 ms; stopping it for the request makes the timeout certain.
        os.kill(pid, signal.SIGSTOP)
        try:
            with self.assertRaises(UnknownOutcome) as ctx:
                c.request("session/prompt", {"text": "late"}, timeout=0.001)
        finally:
            os.kill(pid, signal.SIGCONT)
        self.assertEqual(ctx.exception.method, "session/prompt")
        self.assertIsInstance(ctx.exception.id, int)
        self.assertEqual(ctx.exception.outcome, "unknown")
        # The server still acted: the late receipt is observable, never delivered as a success.
        deadline = time.monotonic() + 5
        while not c.late_responses() and time.monotonic() < deadline:
            time.sleep(0.01)
        late = c.late_responses()
        self.assertEqual(len(late), 1)
        self.assertEqual(late[0].id, ctx.exception.id)
        self.assertEqual(late[0].method, "session/prompt")
        self.assertIn("messageId", late[0].result)
        # The client keeps working after an abandoned request.
        self.assertEqual(c.session().run("after", timeout=20).final_response, "echo: after")

    def test_close_is_orderly_shutdown(self) -> None:
        c = self.client()
        pid = c.pid
        assert pid is not None
        t0 = time.monotonic()
        status = c.close()
        print(f"\n  close(): {1000 * (time.monotonic() - t0):.1f} ms, stage {c.close_stage}", flush=True)
        self.assertEqual(status, 0)
        self.assertEqual(c.close_stage, "shutdown")
        with self.assertRaises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        self.assertTrue(group_gone(pid))
        with self.assertRaises(TransportError):
            c.request("initialize", {"cwd": self.work})

    def test_concurrent_requests_are_routed_by_id(self) -> None:
        c = self.client()
        receipts: List[List[str]] = [[] for _ in range(8)]
        errors: List[BaseException] = []

        def worker(i: int) -> None:
            try:
                for j in range(20):
                    receipts[i].append(c.prompt(f"t{i}-{j}", timeout=10).message_id)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        self.assertEqual(errors, [])
        ids = [m for r in receipts for m in r]
        self.assertEqual(len(ids), 160)
        self.assertEqual(len(set(ids)), 160)
        # Round trips of a cheap request (an unknown method answered -32601), for the record.
        n = 2000
        t0 = time.monotonic()
        for _ in range(n):
            try:
                c.request("no/such-method", {}, timeout=10)
            except RpcError as e:
                self.assertEqual(e.code, -32601)
        dt = time.monotonic() - t0
        print(f"\n  {n / dt:.0f} sequential round trips/s ({1e6 * dt / n:.0f} us each)", flush=True)

    def test_a_host_spawned_from_a_short_lived_thread_outlives_that_thread(self) -> None:
        # The host watches its parent process, not the thread that spawned it.
        c = self.client(initialize=False)
        t = threading.Thread(target=lambda: c.initialize(self.work))
        t.start()
        t.join()
        time.sleep(0.5)
        self.assertTrue(process_alive(c.pid))
        self.assertEqual(c.session().run("still here").final_response, "echo: still here")

    def test_kill_9_of_the_client_leaves_no_orphan_host(self) -> None:
        code = ("import sys, time\n"
                "from agenthost import Client\n"
                "c = Client(sys.argv[1], args=sys.argv[2:])\n"
                "c.initialize(sys.argv[3])\n"
                "print(c.pid, flush=True)\n"
                "time.sleep(60)\n")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        proc = subprocess.Popen([sys.executable, "-c", code, AGENTHOST, "--state-dir", self.tmp, "--runtime-dir",
                                 os.path.join(self.tmp, "run"), "--config", self.config],
                                stdout=subprocess.PIPE, env=env)
        try:
            assert proc.stdout is not None
            host_pid = int(proc.stdout.readline())
            self.assertTrue(process_alive(host_pid))
        finally:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        t0 = time.monotonic()
        while process_alive(host_pid) and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        print(f"\n  host gone {1000 * (time.monotonic() - t0):.0f} ms after kill -9 of its client", flush=True)
        self.assertFalse(process_alive(host_pid), "the host outlived its killed client")

    def test_stdin_eof_stops_the_host(self) -> None:
        c = self.client()
        status = c.close(shutdown_timeout=0, eof_timeout=10)
        self.assertEqual(c.close_stage, "eof")
        self.assertEqual(status, 0)


class ScriptBinaryTest(TmpDirCase):
    """Clients driving small script binaries instead of agenthost."""

    def test_close_escalates_to_sigkill_without_zombie(self) -> None:
        binary = write_script(self.tmp, "stubborn", "trap '' TERM\nsleep 100\n")
        c = self.track(Client(binary))
        c.start()
        pid = c.pid
        assert pid is not None
        t0 = time.monotonic()
        status = c.close(shutdown_timeout=0.2, eof_timeout=0.2, term_timeout=0.3)
        print(f"\n  close() of a SIGTERM-ignoring child: {1000 * (time.monotonic() - t0):.0f} ms, "
              f"stage {c.close_stage}, status {status}", flush=True)
        self.assertEqual(c.close_stage, "sigkill")
        self.assertEqual(status, -9)
        with self.assertRaises(ChildProcessError):  # reaped: no zombie of ours
            os.waitpid(pid, os.WNOHANG)
        self.assertFalse(os.path.exists(f"/proc/{pid}"))
        self.assertTrue(group_gone(pid), "the whole process group (sleep too) was killed")

    def test_exit_status_and_stderr_tail(self) -> None:
        binary = write_script(self.tmp, "failing", "echo 'line one' >&2\necho 'fatal: no luck' >&2\nexit 3\n")
        c = self.track(Client(binary))
        with self.assertRaises(TransportError) as ctx:
            c.initialize(self.tmp)
        self.assertEqual(ctx.exception.exit_status, 3)
        self.assertIn("fatal: no luck", ctx.exception.stderr_tail)
        self.assertIn("fatal: no luck", str(ctx.exception))
        if isinstance(ctx.exception, ConnectionLost):  # written before the exit: the outcome is unknown
            self.assertEqual(ctx.exception.method, "initialize")

    def test_exit_while_a_request_waits_is_connection_lost(self) -> None:
        binary = write_script(self.tmp, "reads-then-fails", "read line\necho 'fatal: gave up' >&2\nexit 3\n")
        c = self.track(Client(binary))
        with self.assertRaises(ConnectionLost) as ctx:
            c.request("session/prompt", {"text": "x"}, timeout=10)
        e = ctx.exception
        self.assertIsInstance(e, TransportError)
        self.assertIsInstance(e, UnknownOutcome)  # it was written: the outcome is unknown
        self.assertEqual((e.method, e.id, e.exit_status), ("session/prompt", 1, 3))
        self.assertEqual(e.stderr_tail, ["fatal: gave up"])

    def test_stderr_tail_keeps_last_400_lines(self) -> None:
        binary = write_script(self.tmp, "chatty", "i=0\nwhile [ $i -lt 1000 ]; do echo \"err $i\" >&2; "
                                                   "i=$((i+1)); done\nexit 5\n")
        c = self.track(Client(binary))
        with self.assertRaises(TransportError) as ctx:
            c.request("anything", timeout=10)
        tail = ctx.exception.stderr_tail
        self.assertEqual(ctx.exception.exit_status, 5)
        self.assertEqual(len(tail), 400)
        self.assertEqual(tail[-1], "err 999")
        self.assertEqual(tail[0], "err 600")

    def test_missing_binary_is_transport_error(self) -> None:
        c = self.track(Client(os.path.join(self.tmp, "does-not-exist")))
        with self.assertRaises(TransportError):
            c.initialize(self.tmp)

    ENV_SCRIPT = ('read line\nprintf \'{"jsonrpc":"2.0","id":1,"result":{"mark":"%s","override":"%s","path":"%s"}}\\n\' '
                  '"$AH_PARENT_MARK" "$AH_OVERRIDE" "$PATH"\nread line\n')

    def test_env_merged_with_parent(self) -> None:
        os.environ["AH_PARENT_MARK"] = "from-parent"
        self.addCleanup(os.environ.pop, "AH_PARENT_MARK", None)
        c = self.track(Client(write_script(self.tmp, "envy", self.ENV_SCRIPT), env={"AH_OVERRIDE": "set"}))
        res = c.request("env", timeout=10)
        self.assertEqual(res["mark"], "from-parent")
        self.assertEqual(res["override"], "set")
        self.assertEqual(res["path"], os.environ.get("PATH", ""))

    def test_env_replaced(self) -> None:
        os.environ["AH_PARENT_MARK"] = "from-parent"
        self.addCleanup(os.environ.pop, "AH_PARENT_MARK", None)
        c = self.track(Client(write_script(self.tmp, "envy", self.ENV_SCRIPT), env={"AH_OVERRIDE": "only"},
                              env_replace=True))
        res = c.request("env", timeout=10)
        self.assertEqual(res["mark"], "")
        self.assertEqual(res["override"], "only")

    def test_binary_from_environment_variable(self) -> None:
        script = write_script(self.tmp, "viaenv", "echo 'picked via AGENTHOST_BIN' >&2\nexit 4\n")
        os.environ["AGENTHOST_BIN"] = script
        self.addCleanup(os.environ.pop, "AGENTHOST_BIN", None)
        c = self.track(Client())
        self.assertEqual(c.binary, script)
        with self.assertRaises(TransportError) as ctx:
            c.request("x", timeout=10)
        self.assertEqual(ctx.exception.exit_status, 4)


class FakeServerTest(TmpDirCase):
    """Against tests/python/fake_server.py (a scripted server)."""

    def fake(self, scenario: str = "") -> Client:
        binary = os.path.join(self.tmp, "fake")
        with open(binary, "w") as f:
            f.write(f"#!/bin/sh\nexec {sys.executable} {os.path.join(HERE, 'fake_server.py')} \"$@\"\n")
        os.chmod(binary, 0o755)
        c = self.track(Client(binary, env={"AH_FAKE_SCENARIO": scenario}))
        c.initialize(self.tmp)
        return c

    def test_malformed_lines_and_unknown_ids_are_skipped(self) -> None:
        c = self.fake()
        res = c.request("noisy", {"x": [1, "é"]}, timeout=10)
        self.assertEqual(res, {"ok": True, "echo": {"x": [1, "é"]}})
        diag = "\n".join(c.diagnostics())
        self.assertIn("invalid JSON", diag)
        self.assertIn("unknown id", diag)

    def test_rpc_error_keeps_code_message_data(self) -> None:
        c = self.fake()
        with self.assertRaises(RpcError) as ctx:
            c.request("no/such", {}, timeout=10)
        e = ctx.exception
        self.assertEqual((e.code, e.message), (-32601, "method not found"))
        self.assertEqual(e.data, {"category": "not-found", "name": "no/such"})
        self.assertEqual((e.category, e.name), ("not-found", "no/such"))

    def test_run_without_reason_is_protocol_error(self) -> None:
        c = self.fake("no-reason")
        with self.assertRaises(ProtocolError):
            c.session().run("x", timeout=10)

    def test_run_with_reason(self) -> None:
        r = self.fake().session().run("x", timeout=10)
        self.assertEqual((r.final_response, r.finish_reason, r.message_id), ("hi", "end", "m1"))

    def test_server_request_id_kept_and_answered_once(self) -> None:
        c = self.fake()
        c.request("ask", timeout=10)
        req = c.next_request(timeout=5)
        assert req is not None
        self.assertEqual(req.id, "srv-1")
        self.assertEqual(req.method, "request/question")
        c.respond(req, {"answer": "42"})
        with self.assertRaises(AlreadyResponded):
            c.respond_error(req, -32000, "twice")

    def test_next_request_timeout_and_end(self) -> None:
        c = self.fake()
        with self.assertRaises(TimeoutError):
            c.next_request(timeout=0.05)
        c.close()
        self.assertIsNone(c.next_request(timeout=5))


if __name__ == "__main__":
    unittest.main(verbosity=2)
