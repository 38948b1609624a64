"""Synchronous client of the agenthost SDK surface (``agenthost sdk``: JSON-RPC 2.0, one JSON object a line).

Threading model
---------------
A :class:`Client` owns one child process and two daemon threads: the *reader* thread parses the
child's stdout, routes each response to the waiting caller by its id, fans notifications out to the
subscriptions and queues server requests; the *stderr* thread keeps the last lines of the child's
standard error. Every public method may be called from any thread; callbacks never run on the
reader thread except subscription *filters*, which must be quick and must not call the client.

Nothing is retried, replayed or resubscribed automatically.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import json
import os
import queue
import signal
import subprocess
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import (Any, Callable, Deque, Dict, Iterator, List, Mapping, Optional, Sequence, Set,
                    Tuple, Union)

from .errors import (AlreadyResponded, ConnectionLost, ProtocolError, RequestId, RpcError,
                     TransportError, UnknownOutcome)
from .recording import Recorder

__all__ = [
    "Client", "Session", "Subscription", "Notification", "ServerRequest", "InitializeResult",
    "PromptReceipt", "RunResult", "LateResponse", "PROTOCOL_VERSION",
]

#: The SDK wire version this client speaks.
PROTOCOL_VERSION = 1

JSON = Any
Filter = Callable[["Notification"], bool]

_END = object()  # sentinel closing a subscription queue


def _id_key(value: Any) -> Tuple[str, Any]:
    """A dictionary key that keeps ids exactly as sent: ``1``, ``1.0``, ``True`` and ``"1"`` differ."""
    return (type(value).__name__, value)


@dataclass(frozen=True)
class Notification:
    """A notification from the server: ``method`` and ``params`` as sent."""

    method: str
    params: JSON

    @property
    def session_id(self) -> Optional[str]:
        """``params.sessionId`` when present."""
        return self.params.get("sessionId") if isinstance(self.params, dict) else None

    @property
    def event(self) -> Optional[Dict[str, Any]]:
        """The stored event of a ``session.event`` notification, else ``None``."""
        if self.method == "session.event" and isinstance(self.params, dict):
            ev = self.params.get("event")
            return ev if isinstance(ev, dict) else None
        return None


@dataclass
class ServerRequest:
    """A request the server sent to this client (``request/approval``, ``request/question``, or any
    other method: unknown ones are kept as they are).

    ``id`` is the JSON-RPC id exactly as received. ``state`` is local: ``"pending"`` until
    :meth:`Client.respond` or :meth:`Client.respond_error` sent an answer, then ``"responded"``.
    Another client may still answer the same host request.
    """

    id: RequestId
    method: str
    params: JSON
    state: str = "pending"

    @property
    def kind(self) -> Optional[str]:
        """``params.kind`` (``approval`` or ``question``) when present."""
        return self.params.get("kind") if isinstance(self.params, dict) else None

    @property
    def session_id(self) -> Optional[str]:
        """``params.sessionId`` when present."""
        return self.params.get("sessionId") if isinstance(self.params, dict) else None

    @property
    def options(self) -> List[Any]:
        """``params.options`` (for an approval: ``allow_once``, ``allow_always``, ...)."""
        opts = self.params.get("options") if isinstance(self.params, dict) else None
        return list(opts) if isinstance(opts, list) else []


@dataclass(frozen=True)
class InitializeResult:
    """The answer to ``initialize``; ``raw`` is the whole result object."""

    server_name: str
    server_version: str
    protocol_version: int
    capabilities: Dict[str, Any]
    raw: Dict[str, Any]


@dataclass(frozen=True)
class PromptReceipt:
    """The durable receipt of ``session/prompt``: the prompt is stored in the session's inbox."""

    session_id: str
    message_id: str


@dataclass
class RunResult:
    """What :meth:`Session.run` observed between the prompt's inbox receipt and the session's next idle.

    This is an *interval summary*, not a per-prompt verdict: work admitted by another producer into
    the same session before it became idle is part of it.

    - ``final_response``: the last committed assistant text of the session in the interval (or ``None``);
    - ``message_id``: the prompt's message id;
    - ``finish_reason``: ``data.reason`` of the last ``turn/ended`` of the session in the interval
      (``end``, ``max-tokens``, ``cancelled``, ``error``, ``refusal``); ``cancelled`` with ``error`` "the
      prompt never ran: closed while it was queued" when a close cancelled the prompt before it ran
      (its ``inbox/cancelled``);
    - ``usage``: that event's ``data.usage``;
    - ``events``: every stored event of the session and its subagents in the interval, in arrival order
      (unknown kinds are kept as they are);
    - ``turns``: each turn of the session and its subagents that ended in the interval,
      ``{sessionId, parent, turnId, usage, model?, roundTrips}`` — a turn's usage is its model round
      trips (``model/usage``) when the provider reported them, else its ``turn/ended`` usage, never both;
    - ``total_usage``: the session's own turns summed, with ``turns``; ``tree_usage``: with its
      subagents' too, each session counted once, with ``turns`` and ``sessions``.
    """

    final_response: Optional[str]
    message_id: str
    finish_reason: str
    usage: Optional[Dict[str, Any]]
    events: List[Dict[str, Any]] = field(default_factory=list)
    session_id: str = ""
    error: Optional[str] = None
    turns: List[Dict[str, Any]] = field(default_factory=list)
    total_usage: Dict[str, int] = field(default_factory=dict)
    tree_usage: Dict[str, int] = field(default_factory=dict)


_TOKEN_KEYS = ("inputTokens", "cachedInputTokens", "outputTokens", "reasoningTokens", "requests")


def _tokens(u: Any, round_trip: bool = False) -> Dict[str, int]:
    u = u if isinstance(u, dict) else {}
    out = {k: (u[k] if isinstance(u.get(k), int) and u[k] >= 0 else 0) for k in _TOKEN_KEYS}
    if round_trip and "requests" not in u:
        out["requests"] = 1
    return out


def _add(a: Dict[str, int], b: Mapping[str, int]) -> None:
    for k in _TOKEN_KEYS:
        a[k] = a.get(k, 0) + b.get(k, 0)


def run_usage(events: Sequence[Mapping[str, Any]], root: str,
              parents: Mapping[str, str]) -> Tuple[List[Dict[str, Any]], Dict[str, int], Dict[str, int]]:
    """Per turn, the root's own and the tree's usage of a run's events (the rule of docs/usage.md)."""
    turns: Dict[Tuple[str, str], Dict[str, Any]] = {}
    order: List[Tuple[str, str]] = []
    for ev in events:
        sid, turn, kind = ev.get("sessionId"), ev.get("turnId"), ev.get("kind")
        if not isinstance(sid, str) or not isinstance(turn, str):
            continue
        data = ev.get("data") if isinstance(ev.get("data"), dict) else {}
        t = turns.setdefault((sid, turn), {"rounds": [], "end": None})
        if kind == "model/usage":
            t["rounds"].append(data.get("usage"))
        elif kind == "turn/ended":
            t["end"] = data.get("usage")
            order.append((sid, turn))
    out: List[Dict[str, Any]] = []
    own: Dict[str, int] = {k: 0 for k in _TOKEN_KEYS}
    tree: Dict[str, int] = {k: 0 for k in _TOKEN_KEYS}
    sessions: Set[str] = set()
    own_turns = 0
    for sid, turn in order:
        t = turns[(sid, turn)]
        use = {k: 0 for k in _TOKEN_KEYS}
        model = None
        if t["rounds"]:
            for r in t["rounds"]:
                _add(use, _tokens(r, round_trip=True))
                model = r.get("model") if isinstance(r, dict) else model
        else:
            use = _tokens(t["end"])
            end = t["end"] if isinstance(t["end"], dict) else {}
            model = None if len(end.get("models") or []) > 1 else end.get("model")
        item: Dict[str, Any] = {"sessionId": sid, "parent": parents.get(sid), "turnId": turn, "usage": use,
                                "roundTrips": len(t["rounds"])}
        if isinstance(model, str):
            item["model"] = model
        out.append(item)
        _add(tree, use)
        sessions.add(sid)
        if sid == root:
            _add(own, use)
            own_turns += 1
    own["turns"] = own_turns
    tree["turns"] = len(out)
    tree["sessions"] = max(len(sessions), 1)
    return out, own, tree


@dataclass(frozen=True)
class LateResponse:
    """A response that arrived after its request was given up as :class:`UnknownOutcome`."""

    method: str
    id: RequestId
    result: JSON = None
    error: Optional[Dict[str, Any]] = None


class Subscription:
    """A queue of notifications, created by :meth:`Client.subscribe`.

    Iterate over it, or call :meth:`next`. It ends when :meth:`close` is called, when its filter
    raised (the exception is kept in :attr:`error`; other subscriptions are not affected) or when the
    client's connection ended (:attr:`transport_error`). Messages queued before the end are still
    delivered.
    """

    def __init__(self, client: "Client", flt: Optional[Filter]) -> None:
        self._client = client
        self._filter = flt
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._ended = False
        self._drained = False
        self.error: Optional[BaseException] = None
        self.transport_error: Optional[TransportError] = None

    # Called on the reader thread.
    def _offer(self, note: Notification) -> None:
        if self._ended:
            return
        if self._filter is not None:
            try:
                if not self._filter(note):
                    return
            except Exception as exc:  # a filter failure ends this subscription only
                self.error = exc
                self._end()
                return
        self._queue.put(note)

    def _end(self, transport_error: Optional[TransportError] = None) -> None:
        if self._ended:
            return
        if transport_error is not None:
            self.transport_error = transport_error
        self._ended = True
        self._queue.put(_END)
        self._client._unsubscribe(self)

    @property
    def closed(self) -> bool:
        """True once the subscription ended (messages queued before may still be read)."""
        return self._ended

    def next(self, timeout: Optional[float] = None) -> Optional[Notification]:
        """The next notification; ``None`` once the subscription ended and its queue is drained.

        Raises :class:`TimeoutError` when ``timeout`` seconds passed without one.
        """
        if self._drained:
            return None
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no notification within {timeout} s") from None
        if item is _END:
            self._drained = True
            self._queue.put(_END)
            return None
        return item

    def __iter__(self) -> Iterator[Notification]:
        while True:
            note = self.next()
            if note is None:
                return
            yield note

    def close(self) -> None:
        """End the subscription (local only: nothing is sent to the server)."""
        self._end()

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Waiter:
    __slots__ = ("method", "id", "event", "response", "error")

    def __init__(self, method: str, id: RequestId) -> None:
        self.method = method
        self.id = id
        self.event = threading.Event()
        self.response: Optional[Dict[str, Any]] = None
        self.error: Optional[BaseException] = None


_live_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


@atexit.register
def _close_live_clients() -> None:
    # A child must not outlive an interpreter that forgot to close its client.
    for client in list(_live_clients):
        try:
            client.close(shutdown_timeout=0.5, eof_timeout=1.0, term_timeout=1.0)
        except Exception:
            pass


class Client:
    """A connection to one ``agenthost sdk`` child process, spawned lazily on the first request.

    :param binary: the agenthost executable; default ``$AGENTHOST_BIN`` else ``agenthost`` (``PATH``).
    :param args: options placed before the ``sdk`` command (e.g. ``["--state-dir", DIR]``).
    :param cwd: the child's working directory (default: inherited).
    :param env: environment variables for the child. By default they are *merged* over
        ``os.environ``; a value of ``None`` removes a variable. With ``env_replace=True`` the child
        gets exactly ``env``.
    :param timeout: default seconds a request waits for its answer before :class:`UnknownOutcome`
        (``None``: wait forever).
    :param stderr_lines: how many of the last stderr lines are kept for :class:`TransportError`.
    :param command: the command word (``"sdk"``); exposed for testing.

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, binary: Optional[str] = None, args: Sequence[str] = (), cwd: Optional[str] = None,
                 env: Optional[Mapping[str, Optional[str]]] = None, env_replace: bool = False,
                 timeout: Optional[float] = 30.0, stderr_lines: int = 400, command: str = "sdk",
                 record_dir: Optional[str] = None) -> None:
        self.binary = binary or os.environ.get("AGENTHOST_BIN") or "agenthost"
        self.args = list(args)
        self.command = command
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self.env_replace = env_replace
        self.timeout = timeout
        self._lock = threading.RLock()
        self._write_lock = threading.Lock()
        self._proc: Optional[subprocess.Popen] = None
        self._reader: Optional[threading.Thread] = None
        self._stderr_reader: Optional[threading.Thread] = None
        self._stderr: Deque[str] = collections.deque(maxlen=stderr_lines)
        self._ids = itertools.count(1)
        self._pending: Dict[Tuple[str, Any], _Waiter] = {}
        self._abandoned: Dict[Tuple[str, Any], str] = {}
        self._late: Deque[LateResponse] = collections.deque(maxlen=1000)
        self._diagnostics: Deque[str] = collections.deque(maxlen=1000)
        self._subs: List[Subscription] = []
        self._requests: "queue.Queue[Any]" = queue.Queue()
        self._transport_error: Optional[TransportError] = None
        self._closing = False
        self._closed = False
        self.close_stage: Optional[str] = None
        self.initialize_result: Optional[InitializeResult] = None
        #: this connection's recording (``record_dir``): every line sent and received
        self.recorder: Optional[Recorder] = (
            Recorder(record_dir, meta={"protocol": PROTOCOL_VERSION, "binary": self.binary}) if record_dir else None)

    # ---- process -----------------------------------------------------------------------------------

    def _child_env(self) -> Optional[Dict[str, str]]:
        if self.env is None:
            return None if not self.env_replace else {}
        base: Dict[str, str] = {} if self.env_replace else dict(os.environ)
        for k, v in self.env.items():
            if v is None:
                base.pop(k, None)
            else:
                base[k] = str(v)
        return base

    def start(self) -> None:
        """Spawn the child now (otherwise the first request does). Raises :class:`TransportError`."""
        with self._lock:
            if self._closed or self._closing:
                raise TransportError("the client is closed", self.exit_status, list(self._stderr))
            if self._proc is not None:
                return
            argv = [self.binary, *self.args, self.command]
            try:
                self._proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    cwd=self.cwd, env=self._child_env(), start_new_session=True, bufsize=0)
            except OSError as exc:
                raise TransportError(f"cannot start {argv[0]!r}: {exc}") from exc
            _live_clients.add(self)
            if self.recorder is not None:
                self.recorder.mark("open", self.binary)
            self._reader = threading.Thread(target=self._read_stdout, name="agenthost-reader", daemon=True)
            self._stderr_reader = threading.Thread(target=self._read_stderr, name="agenthost-stderr",
                                                   daemon=True)
            self._stderr_reader.start()  # first: the reader's EOF path joins it
            self._reader.start()

    @property
    def pid(self) -> Optional[int]:
        """The child's pid (also its process group id), once spawned."""
        return self._proc.pid if self._proc is not None else None

    @property
    def exit_status(self) -> Optional[int]:
        """The child's exit status once observed (negative: killed by that signal)."""
        return self._proc.returncode if self._proc is not None else None

    def stderr_tail(self) -> List[str]:
        """The last lines the child wrote to its standard error."""
        return list(self._stderr)

    def late_responses(self) -> List[LateResponse]:
        """Responses that arrived after their request was given up (:class:`UnknownOutcome`)."""
        return list(self._late)

    def diagnostics(self) -> List[str]:
        """Lines the reader could not use (invalid JSON, unknown response ids, ...)."""
        return list(self._diagnostics)

    def _read_stderr(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stderr is not None
        for raw in iter(proc.stderr.readline, b""):
            self._stderr.append(raw.decode("utf-8", "replace").rstrip("\r\n"))

    def _read_stdout(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        try:
            for raw in iter(proc.stdout.readline, b""):
                self._dispatch_line(raw)
        except Exception as exc:  # never let the reader die silently
            self._diagnostics.append(f"reader failed: {exc!r}")
        self._on_eof()

    def _dispatch_line(self, raw: bytes) -> None:
        text = raw.strip()
        if not text:
            return
        if self.recorder is not None:
            self.recorder.message(False, text)
        try:
            msg = json.loads(text.decode("utf-8", "replace"))
        except ValueError:
            self._diagnostics.append(f"invalid JSON from the server: {text[:200]!r}")
            return
        if not isinstance(msg, dict):
            self._diagnostics.append(f"non-object from the server: {text[:200]!r}")
            return
        has_id = "id" in msg
        method = msg.get("method")
        if isinstance(method, str) and has_id:
            self._requests.put(ServerRequest(id=msg["id"], method=method, params=msg.get("params")))
        elif isinstance(method, str):
            note = Notification(method=method, params=msg.get("params"))
            with self._lock:
                subs = list(self._subs)
            for sub in subs:
                sub._offer(note)
        elif has_id:
            key = _id_key(msg["id"])
            with self._lock:
                waiter = self._pending.pop(key, None)
                late_method = None if waiter else self._abandoned.pop(key, None)
            if waiter is not None:
                waiter.response = msg
                waiter.event.set()
            elif late_method is not None:
                self._late.append(LateResponse(method=late_method, id=msg["id"], result=msg.get("result"),
                                               error=msg.get("error")))
            else:
                self._diagnostics.append(f"response with an unknown id: {text[:200]!r}")
        else:
            self._diagnostics.append(f"neither method nor id: {text[:200]!r}")

    def _on_eof(self) -> None:
        proc = self._proc
        assert proc is not None
        status = None
        if not self._closing:
            # Give the child a moment to exit so the error carries its status and full stderr.
            try:
                status = proc.wait(timeout=2.0)
            except Exception:
                status = None
            self._join_stderr()
        err = TransportError("the agenthost process closed its output", status, list(self._stderr))
        if self.recorder is not None:
            self.recorder.mark("close" if self._closing else "loss", "the agenthost process closed its output")
            self.recorder.close()
        with self._lock:
            self._transport_error = err
            waiters = list(self._pending.values())
            self._pending.clear()
            subs = list(self._subs)
        for w in waiters:
            w.error = ConnectionLost("the agenthost process closed its output", w.method, w.id, status,
                                     list(self._stderr))
            w.event.set()
        for sub in subs:
            sub._end(err)
        self._requests.put(_END)

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    def _write(self, msg: Dict[str, Any]) -> None:
        """Write one message as one line. Raises TransportError when the pipe is gone."""
        line = json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        with self._write_lock:
            if self.recorder is not None:
                self.recorder.message(True, line[:-1])
            try:
                proc.stdin.write(line)
                proc.stdin.flush()
            except (OSError, ValueError) as exc:
                raise self._transport_failure(f"cannot write to the agenthost process: {exc}") from exc

    def _transport_failure(self, message: str) -> TransportError:
        if self._transport_error is not None:
            return TransportError(message, self._transport_error.exit_status, self._transport_error.stderr_tail)
        proc = self._proc
        status = None
        if proc is not None:
            try:
                status = proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
        self._join_stderr()
        return TransportError(message, status, list(self._stderr))

    def _join_stderr(self) -> None:
        t = self._stderr_reader
        if t is not None and t.ident is not None and t is not threading.current_thread():
            t.join(timeout=1.0)

    # ---- raw JSON-RPC ------------------------------------------------------------------------------

    def request(self, method: str, params: JSON = None, timeout: Union[float, None, str] = "default") -> JSON:
        """Send a request and return its ``result``.

        Raises :class:`RpcError` for an error answer, :class:`UnknownOutcome` when ``timeout`` seconds
        passed (default: the client's timeout; ``None`` waits forever) — the server may still act, a
        late answer goes to :meth:`late_responses` —, :class:`ConnectionLost` when the child went
        away after the request was written, :class:`TransportError` when it could not be written.
        Unknown methods pass through unchanged.
        """
        wait = self.timeout if timeout == "default" else timeout
        self.start()
        with self._lock:
            if self._transport_error is not None:
                raise self._transport_failure(f"{method}: the agenthost process is gone")
            rid: int = next(self._ids)
            waiter = _Waiter(method, rid)
            self._pending[_id_key(rid)] = waiter
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        try:
            self._write(msg)
        except TransportError:
            with self._lock:
                self._pending.pop(_id_key(rid), None)
            raise
        if not waiter.event.wait(None if wait is None else max(0.0, float(wait))):
            with self._lock:
                if self._pending.pop(_id_key(rid), None) is not None:
                    self._abandoned[_id_key(rid)] = method
                    raise UnknownOutcome(method, rid, "timeout")
            waiter.event.wait()  # answered while we gave up: take the answer
        if waiter.error is not None:
            raise waiter.error
        resp = waiter.response or {}
        if "error" in resp:
            e = resp.get("error")
            if not isinstance(e, dict) or not isinstance(e.get("code"), int):
                raise ProtocolError(f"{method}: malformed error object {e!r}")
            raise RpcError(e["code"], str(e.get("message", "")), e.get("data"), method, rid)
        if "result" not in resp:
            raise ProtocolError(f"{method}: a response with neither result nor error")
        return resp["result"]

    def notify(self, method: str, params: JSON = None) -> None:
        """Send a notification (no answer is expected)."""
        self.start()
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self._write(msg)

    def subscribe(self, filter: Optional[Filter] = None) -> Subscription:
        """A new subscription to the server's notifications. ``filter(notification)`` returning false
        skips a notification; raising ends this subscription only. Does not spawn the child."""
        sub = Subscription(self, filter)
        with self._lock:
            if self._transport_error is not None:
                sub._ended = True
                sub.transport_error = self._transport_error
                sub._queue.put(_END)
                return sub
            self._subs.append(sub)
        return sub

    def next_request(self, timeout: Optional[float] = None) -> Optional[ServerRequest]:
        """The next request the server sent (oldest first), or ``None`` once the connection ended.

        Raises :class:`TimeoutError` when ``timeout`` seconds passed. Only sent when the client
        initialized with ``requests=True``.
        """
        try:
            item = self._requests.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no server request within {timeout} s") from None
        if item is _END:
            self._requests.put(_END)
            return None
        return item

    def _claim(self, req: ServerRequest) -> None:
        with self._lock:
            if req.state != "pending":
                raise AlreadyResponded(f"server request {req.id!r} ({req.method}) was already answered")
            req.state = "responded"

    def respond(self, req: ServerRequest, result: JSON) -> None:
        """Answer a server request with a result (``{"optionId": ...}`` or ``{"answer": ...}``)."""
        self._claim(req)
        self._write({"jsonrpc": "2.0", "id": req.id, "result": result})

    def respond_error(self, req: ServerRequest, code: int, message: str, data: JSON = None) -> None:
        """Answer a server request with a JSON-RPC error (an approval is then denied, a question
        cancelled)."""
        self._claim(req)
        err: Dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            err["data"] = data
        self._write({"jsonrpc": "2.0", "id": req.id, "error": err})

    # ---- typed calls -------------------------------------------------------------------------------

    def initialize(self, cwd: Optional[str] = None, *, provider: Optional[str] = None,
                   model: Optional[str] = None, max_tokens: Optional[int] = None, requests: bool = False,
                   deltas: bool = False, client_info: Optional[Mapping[str, Any]] = None,
                   capabilities: Optional[Mapping[str, Any]] = None,
                   protocol_version: int = PROTOCOL_VERSION,
                   timeout: Union[float, None, str] = "default") -> InitializeResult:
        """``initialize``: must be the first request. ``cwd`` defaults to the current directory.

        ``requests=True`` declares that this client answers approvals and questions
        (see :meth:`next_request`); otherwise they stay pending for other surfaces.
        ``deltas=True`` asks for the streamed text: ``session.delta`` (and ``session.reasoning``)
        notifications ``{sessionId, turnId, messageId, text}`` as the provider streams.
        """
        caps: Dict[str, Any] = dict(capabilities or {})
        caps.setdefault("requests", requests)
        if deltas:
            caps.setdefault("deltas", True)
        params: Dict[str, Any] = {"cwd": os.path.abspath(cwd or os.getcwd()), "protocolVersion": protocol_version,
                                  "clientInfo": dict(client_info or {"name": "agenthost-python",
                                                                     "version": _version()}),
                                  "capabilities": caps}
        if provider is not None:
            params["provider"] = provider
        if model is not None:
            params["model"] = model
        if max_tokens is not None:
            params["maxTokens"] = max_tokens
        res = self.request("initialize", params, timeout)
        if not isinstance(res, dict):
            raise ProtocolError(f"initialize: the result is not an object: {res!r}")
        info = res.get("serverInfo")
        if not isinstance(info, dict) or not isinstance(info.get("name"), str) \
                or not isinstance(info.get("version"), str):
            raise ProtocolError(f"initialize: serverInfo needs string name and version: {info!r}")
        pv = res.get("protocolVersion")
        if not isinstance(pv, int) or isinstance(pv, bool):
            raise ProtocolError(f"initialize: protocolVersion is not an integer: {pv!r}")
        caps_out = res.get("capabilities")
        result = InitializeResult(info["name"], info["version"], pv, caps_out if isinstance(caps_out, dict) else {},
                                  res)
        self.initialize_result = result
        return result

    def prompt(self, text: Optional[str] = None, *, content: Optional[Sequence[Mapping[str, Any]]] = None,
               session_id: Optional[str] = None,
               timeout: Union[float, None, str] = "default") -> PromptReceipt:
        """``session/prompt``: queue a prompt (``text`` or ``content`` blocks) in a session, created
        when ``session_id`` is omitted or not yet known. Returns the durable receipt; the turn runs
        afterwards (follow it with :meth:`subscribe` or use :meth:`Session.run`)."""
        if (text is None) == (content is None):
            raise ValueError("give exactly one of text and content")
        params: Dict[str, Any] = {}
        if session_id is not None:
            params["sessionId"] = session_id
        if text is not None:
            params["text"] = text
        else:
            params["content"] = [dict(b) for b in content or ()]
        res = self.request("session/prompt", params, timeout)
        if not isinstance(res, dict) or not isinstance(res.get("sessionId"), str) \
                or not isinstance(res.get("messageId"), str):
            raise ProtocolError(f"session/prompt: expected {{sessionId, messageId}}, got {res!r}")
        return PromptReceipt(res["sessionId"], res["messageId"])

    def cancel(self, session_id: str, timeout: Union[float, None, str] = "default") -> JSON:
        """``session/cancel``: cancel the session's running turn (it ends ``cancelled``)."""
        return self.request("session/cancel", {"sessionId": session_id}, timeout)

    def close_session(self, session_id: str, timeout: Union[float, None, str] = "default") -> JSON:
        """``session/close``: stop the session's admission and cancel its work."""
        return self.request("session/close", {"sessionId": session_id}, timeout)

    def shutdown(self, timeout: Union[float, None, str] = "default") -> JSON:
        """``shutdown``: the server answers ``{}`` then exits 0. Prefer :meth:`close`."""
        return self.request("shutdown", None, timeout)

    def session(self, session_id: Optional[str] = None) -> "Session":
        """A :class:`Session` handle; without an id the session is created by its first prompt."""
        return Session(self, session_id)

    # ---- close -------------------------------------------------------------------------------------

    def close(self, shutdown_timeout: float = 2.0, eof_timeout: float = 2.0,
              term_timeout: float = 2.0) -> Optional[int]:
        """Stop the child and return its exit status (negative: the signal that killed it).

        Escalation, each step bounded: a best-effort ``shutdown`` request, then stdin EOF, then
        SIGTERM to the child's process group, then SIGKILL. Returns only after the exit was observed
        (the child is reaped: no zombie). :attr:`close_stage` tells which step ended it. Idempotent.
        """
        with self._lock:
            if self._closed:
                return self.exit_status
            proc = self._proc
            if proc is None:
                self._closed = True
                self.close_stage = "never started"
                return None
        stage = "exited"
        if proc.poll() is None:
            answered = False
            if self._transport_error is None and shutdown_timeout > 0:
                try:
                    self.request("shutdown", None, shutdown_timeout)
                    answered = True
                except Exception:
                    pass
            with self._lock:
                self._closing = True
            if self._wait(proc, shutdown_timeout if answered else 0.0):
                stage = "shutdown"
            else:
                stage = "eof"
                with self._write_lock:
                    try:
                        assert proc.stdin is not None
                        proc.stdin.close()
                    except OSError:
                        pass
                if not self._wait(proc, eof_timeout):
                    stage = "sigterm"
                    self._signal_group(proc, signal.SIGTERM)
                    if not self._wait(proc, term_timeout):
                        stage = "sigkill"
                        self._signal_group(proc, signal.SIGKILL)
                        proc.wait()
        with self._lock:
            self._closing = True
        for stream in (proc.stdin,):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        for t in (self._reader, self._stderr_reader):
            if t is not None and t is not threading.current_thread():
                t.join(timeout=2.0)
        for stream in (proc.stdout, proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        with self._lock:
            self._closed = True
            self.close_stage = stage
            subs = list(self._subs)
        err = self._transport_error or TransportError("the client was closed", proc.returncode, list(self._stderr))
        for sub in subs:
            sub._end(err)
        _live_clients.discard(self)
        return proc.returncode

    @staticmethod
    def _wait(proc: subprocess.Popen, seconds: float) -> bool:
        try:
            proc.wait(timeout=max(0.0, seconds))
            return True
        except subprocess.TimeoutExpired:
            return False

    @staticmethod
    def _signal_group(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # start_new_session: the child leads its own group
        except (ProcessLookupError, PermissionError):
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Session:
    """A handle on one session of the host, created by :meth:`Client.session`.

    ``id`` is ``None`` until the first prompt created the session.
    """

    def __init__(self, client: Client, session_id: Optional[str] = None) -> None:
        self.client = client
        self.id = session_id

    def prompt(self, text: Optional[str] = None, *, content: Optional[Sequence[Mapping[str, Any]]] = None,
               timeout: Union[float, None, str] = "default") -> PromptReceipt:
        """Queue a prompt; returns the receipt (see :meth:`Client.prompt`)."""
        receipt = self.client.prompt(text, content=content, session_id=self.id, timeout=timeout)
        self.id = receipt.session_id
        return receipt

    def cancel(self) -> JSON:
        """Cancel the running turn of this session."""
        if self.id is None:
            raise ValueError("the session has no id yet")
        return self.client.cancel(self.id)

    def close(self) -> JSON:
        """Close this session on the host."""
        if self.id is None:
            raise ValueError("the session has no id yet")
        return self.client.close_session(self.id)

    def run(self, prompt: Union[str, Sequence[Mapping[str, Any]]], timeout: Optional[float] = None,
            settle_timeout: float = 5.0) -> RunResult:
        """Send a prompt and collect what happens until the session is next idle.

        Subscribes before sending; drops events before the ``inbox/received`` of the receipt's
        message id; collects the session's events (and those of the subagents it starts) until the
        session reports ``idle`` and every turn begun in the interval — the prompt's own included —
        has ended. ``finish_reason`` is ``data.reason`` of the session's last ``turn/ended``; a missing
        or non-string reason raises :class:`ProtocolError`.

        ``timeout`` bounds the whole run (``None``: no bound) and raises :class:`UnknownOutcome`
        (``method="session/prompt"``) with the events so far in its ``events`` attribute.
        ``settle_timeout`` bounds how long, after ``idle``, the run waits for turn ends still on their
        way (a prompt that was never claimed, e.g. because the session closed, has none).
        Raises :class:`TransportError` when the connection ended first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        wanted = ("session.event", "session.status", "subagent.started", "subagent.finished")
        sub = self.client.subscribe(lambda n: n.method in wanted)
        try:
            if isinstance(prompt, str):
                receipt = self.prompt(prompt, timeout="default")
            else:
                receipt = self.prompt(content=prompt, timeout="default")
            return self._collect(sub, receipt, deadline, settle_timeout)
        finally:
            sub.close()

    def _collect(self, sub: Subscription, receipt: PromptReceipt, deadline: Optional[float],
                 settle_timeout: float) -> RunResult:
        sid, mid = receipt.session_id, receipt.message_id
        tree: Set[str] = {sid}
        parents: Dict[str, str] = {}
        started = False
        idle = False
        idle_at = 0.0
        own_ended = False
        open_turns: Set[str] = set()
        events: List[Dict[str, Any]] = []
        last_text: Optional[str] = None
        last_end: Optional[Dict[str, Any]] = None
        own_cancelled: Optional[Dict[str, Any]] = None
        while True:
            if own_cancelled is not None:  # it will never run: nothing more is waited for
                break
            if started and idle and own_ended and not open_turns:
                break
            now = time.monotonic()
            wait: Optional[float] = None if deadline is None else deadline - now
            if started and idle:
                settle_left = idle_at + settle_timeout - now
                if settle_left <= 0:
                    break
                wait = settle_left if wait is None else min(wait, settle_left)
            if wait is not None and wait <= 0:
                exc = UnknownOutcome("session/prompt", mid, "run timed out before the session was idle")
                exc.events = events  # type: ignore[attr-defined]
                raise exc
            try:
                note = sub.next(wait)
            except TimeoutError:
                continue
            if note is None:
                if sub.transport_error is not None:
                    raise sub.transport_error
                raise TransportError("the subscription ended before the session was idle")
            params = note.params if isinstance(note.params, dict) else {}
            if note.method == "subagent.started" and params.get("parentSessionId") in tree:
                if isinstance(params.get("sessionId"), str):
                    tree.add(params["sessionId"])
                    parents[params["sessionId"]] = params["parentSessionId"]
                continue
            if note.method == "session.status":
                if started and params.get("sessionId") == sid:
                    idle = params.get("status") == "idle"
                    idle_at = time.monotonic()
                continue
            ev = note.event
            if ev is None:
                continue
            ev_sid = params.get("sessionId", ev.get("sessionId"))
            kind = ev.get("kind")
            if not started:
                if ev_sid == sid and kind == "inbox/received" and ev.get("messageId") == mid:
                    started = True
                    events.append(ev)
                continue
            if ev_sid not in tree:
                continue
            events.append(ev)
            data = ev.get("data") if isinstance(ev.get("data"), dict) else {}
            if kind == "subagent/started" and isinstance(data.get("sessionId"), str):
                tree.add(data["sessionId"])
                parents[data["sessionId"]] = ev_sid
            if ev_sid != sid:
                continue
            turn = ev.get("turnId")
            if kind in ("inbox/claimed", "turn/started") and isinstance(turn, str):
                open_turns.add(turn)
            elif kind == "message/committed" and data.get("role", "assistant") == "assistant":
                if isinstance(data.get("text"), str):
                    last_text = data["text"]
            elif kind == "turn/ended":
                if isinstance(turn, str):
                    open_turns.discard(turn)
                if ev.get("messageId") == mid:
                    own_ended = True
                last_end = ev
            elif kind == "inbox/cancelled" and ev.get("messageId") == mid:
                own_ended = True  # never ran: a close cancelled it while it was queued
                own_cancelled = ev
        if own_cancelled is not None:
            data = own_cancelled.get("data") if isinstance(own_cancelled.get("data"), dict) else {}
            turns, own, tree_usage = run_usage(events, sid, parents)
            return RunResult(final_response=None, message_id=mid, finish_reason="cancelled", usage=None,
                             events=events, session_id=sid,
                             error=f"the prompt never ran: {data.get('reason', 'cancelled')} while it was queued",
                             turns=turns, total_usage=own, tree_usage=tree_usage)
        if last_end is None:
            raise ProtocolError(f"session {sid}: no turn/ended between the receipt of {mid} and idle")
        end_data = last_end.get("data")
        reason = end_data.get("reason") if isinstance(end_data, dict) else None
        if not isinstance(reason, str):
            raise ProtocolError(f"session {sid}: turn/ended without a string reason: {last_end!r}")
        usage = end_data.get("usage") if isinstance(end_data.get("usage"), dict) else None
        error = end_data.get("error") if isinstance(end_data.get("error"), str) else None
        turns, own, tree_usage = run_usage(events, sid, parents)
        return RunResult(final_response=last_text, message_id=mid, finish_reason=reason, usage=usage,
                         events=events, session_id=sid, error=error, turns=turns, total_usage=own,
                         tree_usage=tree_usage)


def _version() -> str:
    from . import __version__
    return __version__
