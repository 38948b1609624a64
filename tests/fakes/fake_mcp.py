#!/usr/bin/env python3
"""A scripted MCP server on stdio for what the reference servers do not show: tools/list in pages (a
cursor), every content type in one result (text, image, audio, resource_link, embedded text and blob
resources, structuredContent) and an isError result. One JSON-RPC message per line; protocol 2025-06-18
(the older version agenthost accepts). Every message received is appended to the file named by the first
argument, if any."""
import json
import sys

LOG = sys.argv[1] if len(sys.argv) > 1 else None
PAGES = [
    [{"name": "page_one", "description": "first page", "inputSchema": {"type": "object"}}],
    [{"name": "mixed", "description": "every content type", "inputSchema": {"type": "object"}},
     {"name": "fails", "description": "an isError result", "inputSchema": {"type": "object"}}],
]


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    if LOG:
        with open(LOG, "a") as f:
            f.write(line)
    msg = json.loads(line)
    method, mid = msg.get("method"), msg.get("id")
    if mid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": "2025-06-18",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "fake-mcp", "version": "1"}}})
    elif method == "tools/list":
        page = int(msg.get("params", {}).get("cursor") or 0)
        result = {"tools": PAGES[page]}
        if page + 1 < len(PAGES):
            result["nextCursor"] = str(page + 1)
        send({"jsonrpc": "2.0", "id": mid, "result": result})
    elif method == "tools/call":
        name = msg["params"]["name"]
        if name == "mixed":
            send({"jsonrpc": "2.0", "id": mid, "result": {"content": [
                {"type": "text", "text": "plain text"},
                {"type": "image", "mimeType": "image/png", "data": "AAAA" * 100},
                {"type": "audio", "mimeType": "audio/wav", "data": "AAAA"},
                {"type": "resource_link", "uri": "file:///srv/a.txt", "name": "a.txt"},
                {"type": "resource", "resource": {"uri": "file:///srv/b.txt", "text": "embedded body"}},
                {"type": "resource", "resource": {"uri": "file:///srv/c.bin", "blob": "AAAAAAAA"}},
            ], "structuredContent": {"answer": 42}}})
        elif name == "fails":
            send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "it broke"}],
                                                          "isError": True}})
        else:
            send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": name}]}})
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "method not found"}})
