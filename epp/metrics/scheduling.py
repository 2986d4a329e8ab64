"""Time spent scheduling, for `inference_extension_scheduler_e2e_duration_seconds` (v1 names).

`TimedScheduler` wraps whatever scheduler the runner built and reports each decision's (`rank()`)
duration, failed ones included (a 429 or 503 decision is scheduling work too), so neither the
handlers nor the schedulers know about Prometheus.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from epp.datastore.types import PodMetrics
from epp.scheduling.filters import LLMRequest


class _Scheduler(Protocol):
    def rank(self, request: LLMRequest, pods: list[PodMetrics], limit: int) -> Sequence[PodMetrics]: ...


class _Sink(Protocol):
    def scheduled(self, seconds: float) -> None: ...


class TimedScheduler:
    def __init__(
        self, scheduler: _Scheduler, sink: _Sink, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._scheduler = scheduler
        self._sink = sink
        self._clock = clock

    def rank(self, request: LLMRequest, pods: list[PodMetrics], limit: int) -> Sequence[PodMetrics]:
        start = self._clock()
        try:
            return self._scheduler.rank(request, pods, limit)
        finally:
            self._sink.scheduled(self._clock() - start)
