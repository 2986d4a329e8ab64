"""`with piece:` for every long-lived harness piece that has ``start()`` and ``stop()``.

Fixtures start and stop these pieces explicitly; scripts and one-off tests use a ``with`` block. One
mixin keeps the two uses identical everywhere, instead of a pair of dunder methods per class.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self


class StartStop:
    """``__enter__`` starts (and returns the piece), ``__exit__`` stops whatever happened inside."""

    def start(self) -> object:
        raise NotImplementedError

    def stop(self) -> object:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
