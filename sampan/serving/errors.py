"""The errors of `sampan serve`, shared by the data plane and every front end.

`ServingError`: a model directory, config or request the server cannot serve.
`RequestError`: a request the server answers with an error; `status` is the status
code (HTTP's numbers: the REST front end sends it as is, and `grpc_code` names the
gRPC status a gRPC front end would answer with), `headers` what the answer adds
(``Retry-After``, ``Connection: close``). Its subclasses say which case it is:

    ModelNotFound   404   no such model, or no such version of it
    ClientGone      499   the client went away before its request arrived: nobody to
                          answer (counted and logged, never sent)

    >>> from sampan.serving.errors import RequestError
    >>> RequestError("the queue is full", 503).grpc_code
    'UNAVAILABLE'
"""
from __future__ import annotations

from ..errors import SampanError


class ServingError(SampanError):
    """A model directory, config or request the server cannot serve (the message names it)."""


# the gRPC status (KServe v2's gRPC protocol) of each status a request can get
GRPC_CODES = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
              408: "DEADLINE_EXCEEDED",
              499: "CANCELLED", 500: "INTERNAL", 503: "UNAVAILABLE",
              504: "DEADLINE_EXCEEDED"}


class RequestError(ServingError):
    """A request the server answers with an error `status` (message names why)."""

    def __init__(self, msg, status=400, headers=None):
        super().__init__(msg)
        self.status = status
        self.headers = headers or {}

    @property
    def grpc_code(self) -> str:
        """The gRPC status name for `status` (``"UNKNOWN"`` for one not listed)."""
        return GRPC_CODES.get(self.status, "UNKNOWN")


class ModelNotFound(RequestError):
    """No model of that name, or no such version of it (404)."""

    def __init__(self, msg):
        super().__init__(msg, 404)


class ClientGone(RequestError):
    """The client closed the connection before its request arrived (499: not answered)."""

    def __init__(self, msg="the client closed the connection"):
        super().__init__(msg, 499)
