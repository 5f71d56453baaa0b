"""What every route of the server depends on: the error type, and who is asking.

The server's state (``users``, ``hub``, the reply threads) lives on ``app.state``; the
dependencies below read it from the request, so routes in any module can declare them::

    async def route(desk: DeskDep) -> ...   # the caller's desk (401 without a valid token)
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, Request

from app.serve.edge import MISSING_TOKEN
from app.serve.hub import Desk
from app.serve.users import User


class ApiError(Exception):
    """An error response: HTTP ``status`` with OpenAI's error body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def not_found(what: str) -> ApiError:
    return ApiError(404, what, "not_found_error")


async def current_user(request: Request) -> User:
    """The user the edge found the request's token to be (``edge.py``: a request without a
    valid one gets its 401 there, before its body is read)."""
    user = request.scope.get("user")
    if user is None:  # a route reached without the edge in front: refuse, never guess
        raise ApiError(401, MISSING_TOKEN, "authentication_error")
    return user


UserDep = Annotated[User, Depends(current_user)]


async def desk_of(request: Request, user: UserDep) -> Desk:
    """The caller's desk (opened on first use, off the event loop: it loads their index).
    Under ``serve --ray``, a 503 while another replica holds the user's lease."""
    from app.serve.lease import LeaseBusy

    state = request.app.state
    try:
        return await asyncio.get_running_loop().run_in_executor(state.pool, state.hub.desk, user)
    except LeaseBusy:
        raise ApiError(
            503, "your memory is busy on another replica of this server; retry", "server_error"
        ) from None


DeskDep = Annotated[Desk, Depends(desk_of)]
