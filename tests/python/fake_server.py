#!/usr/bin/env python3
"""A scripted stand-in for `agenthost sdk`, used by test_client.py for what the real host cannot be
made to do on demand (malformed output, a turn/ended without a reason, a server request answered twice).

Usage: fake_server.py [options...] sdk — the scenario is read from $AH_FAKE_SCENARIO.
"""
import json
import os
import sys


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def event(seq, kind, data, **extra):
    ev = {"cursor": f"c{seq}", "sessionId": "s1", "seq": seq, "kind": kind,
          "time": "2026-01-01T00:00:00.000Z", "data": data}
    ev.update(extra)
    send({"jsonrpc": "2.0", "method": "session.event", "params": {"sessionId": "s1", "event": ev}})


def main():
    scenario = os.environ.get("AH_FAKE_SCENARIO", "")
    for line in sys.stdin:
        msg = json.loads(line)
        mid = msg.get("id")
        method = msg.get("method")
        if method is None:
            continue  # a response or a notification from the client
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": mid, "result": {"serverInfo": {"name": "fake", "version": "0"},
                                                           "protocolVersion": 1, "capabilities": {}}})
        elif method == "shutdown":
            send({"jsonrpc": "2.0", "id": mid, "result": {}})
            return 0
        elif method == "noisy":
            # Garbage the client must survive, then the real answer.
            sys.stdout.write("not json\n[1,2]\n\n")
            send({"jsonrpc": "2.0", "id": 999999, "result": "unknown id"})
            send({"jsonrpc": "2.0", "id": "1", "result": "a string id is not the number 1"})
            send({"jsonrpc": "2.0", "id": mid, "result": {"ok": True, "echo": msg.get("params")}})
        elif method == "ask":
            send({"jsonrpc": "2.0", "id": "srv-1", "method": "request/question",
                  "params": {"id": "q1", "sessionId": "s1", "turnId": "t1", "kind": "question",
                             "params": {"question": "?"}, "options": [], "state": "pending"}})
            send({"jsonrpc": "2.0", "id": mid, "result": {}})
        elif method == "session/prompt":
            send({"jsonrpc": "2.0", "id": mid, "result": {"sessionId": "s1", "messageId": "m1"}})
            event(1, "inbox/received", {"content": []}, messageId="m1")
            send({"jsonrpc": "2.0", "method": "session.status", "params": {"sessionId": "s1", "status": "running"}})
            event(2, "inbox/claimed", {}, messageId="m1", turnId="t1")
            event(3, "message/committed", {"role": "assistant", "text": "hi"}, turnId="t1")
            end = {"usage": {"inputTokens": 0, "outputTokens": 0}}
            if scenario != "no-reason":
                end["reason"] = "end"
            event(4, "turn/ended", end, messageId="m1", turnId="t1")
            send({"jsonrpc": "2.0", "method": "session.status", "params": {"sessionId": "s1", "status": "idle"}})
        else:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "method not found",
                                                          "data": {"category": "not-found", "name": method}}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
