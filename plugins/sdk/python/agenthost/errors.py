"""Exceptions raised by the agenthost SDK client.

Every exception derives from :class:`AgentHostError`. The hierarchy separates what the server said
(:class:`RpcError`), what happened to the pipe (:class:`TransportError`), what is not known
(:class:`UnknownOutcome`) and what the server sent that the client could not make sense of
(:class:`ProtocolError`).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

RequestId = Union[int, str]


class AgentHostError(Exception):
    """Base class of every error of this package."""


class RpcError(AgentHostError):
    """The server answered a request with a JSON-RPC error object.

    ``code``, ``message`` and ``data`` are kept exactly as the server sent them. agenthost puts
    ``{category, name}`` in ``data``; :attr:`category` and :attr:`name` read them when present.
    """

    def __init__(self, code: int, message: str, data: Any = None,
                 method: Optional[str] = None, id: Optional[RequestId] = None) -> None:
        super().__init__(f"{method + ': ' if method else ''}{message} (code {code})")
        self.code = code
        self.message = message
        self.data = data
        self.method = method
        self.id = id

    @property
    def category(self) -> Optional[str]:
        """``data.category`` when the server sent one."""
        return self.data.get("category") if isinstance(self.data, dict) else None

    @property
    def name(self) -> Optional[str]:
        """``data.name`` when the server sent one."""
        return self.data.get("name") if isinstance(self.data, dict) else None


class TransportError(AgentHostError):
    """The child process could not be started, or its pipe broke or closed.

    ``exit_status`` is the child's exit status when it was observed (negative for a signal, as in
    :attr:`subprocess.Popen.returncode`), else ``None``; ``stderr_tail`` holds the last lines of the
    child's standard error (at most 400 by default).
    """

    def __init__(self, message: str, exit_status: Optional[int] = None,
                 stderr_tail: Sequence[str] = ()) -> None:
        self.reason = message
        self.exit_status = exit_status
        self.stderr_tail: List[str] = list(stderr_tail)
        text = message
        if exit_status is not None:
            text += f" (exit status {exit_status})"
        if self.stderr_tail:
            text += "\n--- stderr (last lines) ---\n" + "\n".join(self.stderr_tail[-20:])
        # Not super(): in ConnectionLost the next class of the MRO is UnknownOutcome.
        Exception.__init__(self, text)

    @property
    def stderr_text(self) -> str:
        """The kept standard error lines joined with newlines."""
        return "\n".join(self.stderr_tail)


class UnknownOutcome(AgentHostError):
    """A request may have reached the server, but its answer was not observed.

    Raised when the local wait timed out (``reason == "timeout"``) or the connection was lost after
    the request was written (``reason == "connection lost"``). The server may still act on it; this
    is never a guessed success or failure. A reply that arrives after a timeout is not delivered to
    the caller, but it stays observable through :meth:`agenthost.Client.late_responses`.
    """

    def __init__(self, method: str, id: Optional[RequestId], reason: str = "timeout") -> None:
        super().__init__(f"outcome unknown for {method} (id {id!r}): {reason}")
        self.method = method
        self.id = id
        self.reason = reason
        self.outcome = "unknown"


class ConnectionLost(TransportError, UnknownOutcome):
    """The child exited or its pipe closed while a written request was waiting for its answer.

    It is both a :class:`TransportError` (with ``exit_status`` and ``stderr_tail``) and an
    :class:`UnknownOutcome` (with ``method`` and ``id``): the request may have taken effect.
    """

    def __init__(self, message: str, method: str, id: Optional[RequestId],
                 exit_status: Optional[int] = None, stderr_tail: Sequence[str] = ()) -> None:
        TransportError.__init__(self, f"{method} (id {id!r}): {message}", exit_status, stderr_tail)
        self.method = method
        self.id = id
        self.reason = "connection lost"
        self.detail = message
        self.outcome = "unknown"


class ProtocolError(AgentHostError):
    """The server sent something that does not follow the SDK wire contract
    (for example a ``turn/ended`` event without a string ``reason``)."""


class AlreadyResponded(AgentHostError):
    """:meth:`agenthost.Client.respond` was called twice for one server request from this client."""
