"""Recordings of a connection and their analysis (docs/usage.md "Recordings", "agenthost analyze").

:class:`Recorder` writes this client's connection — every line sent and received — in the observation
format the host, the C client and the web UI write: one JSON record per line with its source, connection,
per-connection sequence, direction, wall time and monotonic time, and the original payload with
credentials redacted by name; beside it a metadata document (FILE.meta.json). :func:`analyze` reads
recordings and session exports with ``agenthost analyze --json``: one implementation of the arithmetic.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
import subprocess
import threading
import time
from typing import Any, Dict, Mapping, Optional, Sequence

__all__ = ["Recorder", "analyze", "redact"]

_CREDENTIAL_KEYS = {
    "authorization", "proxy-authorization", "cookie", "set-cookie", "token", "access_token", "refresh_token",
    "id_token", "api_key", "apikey", "api-key", "x-api-key", "secret", "client_secret", "password", "passwd",
    "bearer", "bearer_token", "key", "private_key",
}
_CREDENTIAL_SUFFIXES = ("_token", "_key", "-key", "_secret", "_password", "apikey", "accesstoken")
_CREDENTIAL_TEXT = re.compile(r"(Bearer |bearer |agenthost\.bearer\.|token=)[^ &#\",\n]+")


def _credential_key(k: str) -> bool:
    low = k.lower()
    return low in _CREDENTIAL_KEYS or low.endswith(_CREDENTIAL_SUFFIXES)


def redact(v: Any) -> Any:
    """A copy of ``v`` with credentials replaced by ``"[redacted]"`` (the host's rules)."""
    if isinstance(v, str):
        return _CREDENTIAL_TEXT.sub(r"\1[redacted]", v)
    if isinstance(v, list):
        return [redact(x) for x in v]
    if isinstance(v, dict):
        return {k: ("[redacted]" if _credential_key(k) and isinstance(x, (str, dict, list)) else redact(x))
                for k, x in v.items()}
    return v


def _wall() -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


class Recorder:
    """Writes one connection's observations into ``directory`` (created 0700)."""

    def __init__(self, directory: str, source: str = "client:python", meta: Optional[Mapping[str, Any]] = None,
                 conn: str = "stdio") -> None:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.run_id = f"{int(time.time() * 1000):012x}-{secrets.token_hex(6)}"
        safe = re.sub(r"[^A-Za-z0-9_-]", "-", source)
        base = os.path.join(directory, f"{safe}-{self.run_id}")
        self.path = base + ".jsonl"
        self.source = source
        self.conn = conn
        self._seq = 0
        self._lock = threading.Lock()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self._f = os.fdopen(fd, "w", encoding="utf-8")
        doc: Dict[str, Any] = {
            "format": "agenthost.recording", "version": 1, "source": source, "side": "client",
            "recordingRunId": self.run_id,
            "clock": {"mono": "CLOCK_MONOTONIC", "domain": _boot_id(), "unit": "ns"},
            "started": _wall(), "part": 1,
        }
        for k, v in (meta or {}).items():
            doc.setdefault(k, v)
        mfd = os.open(base + ".meta.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(mfd, "w", encoding="utf-8") as m:
            json.dump(redact(doc), m, indent=2, sort_keys=True)
            m.write("\n")

    def _head(self) -> Dict[str, Any]:
        self._seq += 1
        return {"v": 1, "side": "client", "source": self.source, "conn": self.conn, "seq": self._seq,
                "wall": _wall(), "mono": time.monotonic_ns()}

    def _put(self, rec: Dict[str, Any]) -> None:
        self._f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._f.flush()

    def message(self, sent: bool, line: bytes) -> None:
        """A line as sent or received (without its terminator)."""
        with self._lock:
            if self._f.closed:
                return
            rec = self._head()
            rec["dir"] = "sent" if sent else "received"
            text = line.decode("utf-8", "replace")
            try:
                rec["payload"] = redact(json.loads(text))
            except ValueError:
                rec["raw"] = redact(text)
            self._put(rec)

    def mark(self, event: str, detail: Optional[str] = None) -> None:
        """A connection event: ``open``, ``close`` or ``loss``."""
        with self._lock:
            if self._f.closed:
                return
            rec = self._head()
            rec["event"] = event
            if detail:
                rec["detail"] = detail
            self._put(rec)

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()


def analyze(files: Sequence[str], prices: Optional[str] = None, as_of: Optional[str] = None,
            repeat: Optional[int] = None, binary: Optional[str] = None) -> Dict[str, Any]:
    """``agenthost analyze --json`` on recordings or exports (no server, network or credentials)."""
    argv = [binary or os.environ.get("AGENTHOST_BIN") or "agenthost", "analyze", "--json"]
    if prices:
        argv += ["--prices", prices]
    if as_of:
        argv += ["--as-of", as_of]
    if repeat:
        argv += ["--repeat", str(repeat)]
    out = subprocess.run([*argv, "--", *files], check=True, stdout=subprocess.PIPE)
    return json.loads(out.stdout)
