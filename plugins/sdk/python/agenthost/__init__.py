"""Python client of the agenthost SDK surface (``agenthost sdk``, JSON-RPC 2.0 over stdio).

Standard library only. See :class:`Client` and :class:`Session`::

    from agenthost import Client

    with Client() as client:
        client.initialize()
        result = client.session().run("hello")
        print(result.final_response, result.finish_reason)
"""

__version__ = "0.1.0"

from .client import (PROTOCOL_VERSION, Client, InitializeResult, LateResponse, Notification,  # noqa: E402
                     PromptReceipt, RunResult, ServerRequest, Session, Subscription)
from .recording import Recorder, analyze  # noqa: E402
from .errors import (AgentHostError, AlreadyResponded, ConnectionLost, ProtocolError,  # noqa: E402
                     RpcError, TransportError, UnknownOutcome)

__all__ = [
    "__version__", "PROTOCOL_VERSION", "Client", "Session", "Subscription", "Notification", "ServerRequest",
    "InitializeResult", "PromptReceipt", "RunResult", "LateResponse", "AgentHostError", "RpcError",
    "TransportError", "UnknownOutcome", "ConnectionLost", "ProtocolError", "AlreadyResponded", "Recorder",
    "analyze",
]
