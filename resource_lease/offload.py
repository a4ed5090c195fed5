"""Blocking calls from async code: run in a worker thread, never on the event loop.

Django's own way (asgiref's ``sync_to_async``), not thread-sensitive: the engine's
connections are its own, one per thread, and a statement must not queue behind a view's ORM
work on the one thread-sensitive thread.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from asgiref.sync import sync_to_async

T = TypeVar("T")


def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Awaitable[T]:
    """Run ``fn`` in a worker thread (Django's ``sync_to_async``, not thread-sensitive)."""
    return sync_to_async(functools.partial(fn, *args, **kwargs), thread_sensitive=False)()


S = TypeVar("S")
P = ParamSpec("P")


def async_twin(method: Callable[Concatenate[S, P], T]) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """The async twin of a blocking method, as a one-line class attribute
    (``aleader = async_twin(leader)``): ``await obj.aleader(...)`` runs ``obj.leader(...)`` in
    a worker thread (``in_thread``), never on the event loop. For a property, pass its getter
    (``astate = async_twin(state.fget)``)."""

    async def twin(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
        return await in_thread(method, self, *args, **kwargs)

    name = getattr(method, "__name__", "call")
    twin.__name__ = twin.__qualname__ = f"a{name}"
    twin.__doc__ = f"``{name}()`` for async code (run in a worker thread, never on the event loop)."
    return twin


__all__ = ["async_twin", "in_thread"]
