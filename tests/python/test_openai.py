"""SDK-TS-RUN: the Python client's run() through the openai provider: `agenthost sdk` with [provider.fake] of type
openai on the scripted fake model server (tests/fakes/fake_model.py), started and stopped by each test.

Counted in the "N passed, N failed" line that test_client.py prints at exit.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

from agenthost import Client

AGENTHOST = os.environ.get("AH_TEST_AGENTHOST", "")
FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes", "fake_model.py")


def text_chunk(text):
    return {"choices": [{"index": 0, "delta": {"content": text}}], "model": "fake-model-v2"}


def finish(reason):
    return {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


def usage(i, o):
    return {"choices": [], "usage": {"prompt_tokens": i, "completion_tokens": o}}


@unittest.skipUnless(AGENTHOST and os.access(AGENTHOST, os.X_OK), "AH_TEST_AGENTHOST is not an executable")
class OpenAIProviderTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="ah-py-openai-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.work = tempfile.mkdtemp(prefix="ah-py-openai-work-")
        self.addCleanup(shutil.rmtree, self.work, True)
        port_file = os.path.join(self.tmp, "port")
        control_file = os.path.join(self.tmp, "control-port")
        self.fake = subprocess.Popen([sys.executable, FAKE, "--port-file", port_file,
                                      "--control-port-file", control_file],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(self.stop_fake)
        deadline = time.monotonic() + 10
        while not os.path.exists(port_file) and time.monotonic() < deadline:
            time.sleep(0.02)
        with open(port_file) as f:
            self.port = int(f.read())
        with open(control_file) as f:
            self.control = int(f.read())
        self.config = os.path.join(self.tmp, "agenthost.ini")
        with open(self.config, "w") as f:
            f.write("[plugin.browser]\nenabled = false\n[plugin.remote]\nenabled = false\n"
                    f"[provider.fake]\ntype = openai\nbase_url = http://127.0.0.1:{self.port}/v1\nmodel = m1\n"
                    "max_retries = 2\n")
        self.clients = []

    def tearDown(self) -> None:
        for c in self.clients:
            c.close(shutdown_timeout=2.0, eof_timeout=2.0, term_timeout=1.0)

    def stop_fake(self) -> None:
        self.fake.terminate()
        self.fake.wait(timeout=5)

    def script(self, steps) -> None:
        req = urllib.request.Request(f"http://127.0.0.1:{self.control}/_control/script",
                                     data=json.dumps(steps).encode(), method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def requests(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.control}/_control/requests", timeout=10) as r:
            return json.loads(r.read())

    def client(self, requests: bool = False) -> Client:
        c = Client(AGENTHOST, args=["--state-dir", self.tmp, "--runtime-dir", os.path.join(self.tmp, "run"),
                                    "--config", self.config])
        self.clients.append(c)
        c.initialize(self.work, provider="fake", requests=requests)
        return c

    def test_run_streams_text_and_reports_usage(self) -> None:
        self.script([{"sse": [text_chunk("Hello "), text_chunk("world"), finish("stop"), usage(12, 2), "[DONE]"]}])
        r = self.client().session().run("hi", timeout=30)
        self.assertEqual(r.finish_reason, "end")
        self.assertEqual(r.final_response, "Hello world")
        self.assertEqual(r.usage["inputTokens"], 12)
        self.assertEqual(r.usage["outputTokens"], 2)
        self.assertEqual(r.usage["requests"], 1)
        self.assertEqual(r.usage["model"], "fake-model-v2")
        body = json.loads(self.requests()[0]["body"])
        self.assertEqual(body["messages"][-1], {"role": "user", "content": "hi"})

    def test_a_tool_call_is_approved_through_a_server_request(self) -> None:
        target = os.path.join(self.work, "made.txt")
        args = json.dumps({"path": target, "content": "by the model"})
        self.script([
            {"sse": [{"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "w1", "type": "function", "function": {"name": "write_file", "arguments": args}}]}}]},
                finish("tool_calls"), "[DONE]"]},
            {"sse": [text_chunk("written"), finish("stop"), "[DONE]"]},
        ])
        c = self.client(requests=True)
        s = c.session()
        out: dict = {}
        th = threading.Thread(target=lambda: out.setdefault("result", s.run("make a file", timeout=30)))
        th.start()
        req = c.next_request(timeout=20)
        self.assertIsNotNone(req)
        self.assertEqual(req.kind, "approval")
        self.assertEqual(req.params["params"]["tool"], "write_file")
        c.respond(req, {"optionId": "allow_once"})
        th.join(timeout=30)
        r = out["result"]
        self.assertEqual(r.finish_reason, "end")
        self.assertEqual(r.final_response, "written")
        with open(target) as f:
            self.assertEqual(f.read(), "by the model")
        second = json.loads(self.requests()[1]["body"])
        self.assertEqual(second["messages"][-1]["role"], "tool")
        self.assertEqual(second["messages"][-1]["tool_call_id"], "w1")

    def test_a_rate_limit_is_waited_out_and_shown(self) -> None:
        self.script([
            {"status": 429, "headers": {"retry-after-ms": "300"}, "json": {"error": {"message": "slow down"}}},
            {"sse": [text_chunk("finally"), finish("stop"), "[DONE]"]},
        ])
        r = self.client().session().run("hello", timeout=30)
        self.assertEqual(r.final_response, "finally")
        notes = [e for e in r.events if e["kind"] == "turn/notice"]
        self.assertEqual(len(notes), 1)
        self.assertEqual(notes[0]["data"]["kind"], "retry")
        self.assertEqual(notes[0]["data"]["waitMs"], 300)
        reqs = self.requests()
        self.assertGreaterEqual(reqs[1]["time"] - reqs[0]["time"], 0.28)

    def test_an_error_turn_says_why(self) -> None:
        self.script([{"status": 401, "json": {"error": {"message": "bad key"}}}])
        r = self.client().session().run("hello", timeout=30)
        self.assertEqual(r.finish_reason, "error")
        ended = [e for e in r.events if e["kind"] == "turn/ended"][0]
        self.assertIn("the provider rejected the API key for http://127.0.0.1:", ended["data"]["error"])


if __name__ == "__main__":
    unittest.main()
