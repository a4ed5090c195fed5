"""One object per process: made again in a forked child (docs/pitfalls.md#fork)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """``make()``'s object for this process: threads do not survive ``fork()``, so a child
    gets a fresh one (keeping nothing of its parent's jobs, threads or connections) the
    moment it is forked. Call it to get the current one."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._value = make()
        os.register_at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self._value = self._make()

    def __call__(self) -> T:
        return self._value
