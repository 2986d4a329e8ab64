"""`with piece:` for every long-lived harness piece that has ``start()`` and ``stop()``.

Fixtures start and stop these pieces explicitly; scripts and one-off tests use a ``with`` block. One
mixin keeps the two uses identical everywhere, instead of a pair of dunder methods per class.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self


class StartStop:
    """``__enter__`` starts (and returns the piece), ``__exit__`` stops whatever happened inside.

    A piece made of several parts defines ``_start()`` instead of ``start()``: a start that fails
    half-way then stops what it had started (``stop()`` must be idempotent) before raising.
    """

    def start(self) -> Self:
        try:
            self._start()
        except BaseException as exc:
            self._on_failed_start(exc)
            self.stop()
            raise
        return self

    def _start(self) -> None:
        raise NotImplementedError

    def _on_failed_start(self, exc: BaseException) -> None:
        """Hook: note what the failed start had seen, before ``stop()`` takes it away."""

    def stop(self) -> object:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
