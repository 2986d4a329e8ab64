"""Small builders for scheduling tests: one PodMetrics per call, fresh at `NOW` unless told otherwise."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from epp.api.types import EndpointKey
from epp.datastore.types import Metrics, Pod, PodMetrics

NOW = 1000.0


def pm(
    name: str,
    queue: int = 0,
    kv: float = 0.0,
    active: Iterable[str] = (),
    waiting: Iterable[str] = (),
    max_lora: int = 0,
    updated_at: float | None = NOW,
) -> PodMetrics:
    return PodMetrics(
        Pod(EndpointKey("default", name), f"10.0.0.{abs(hash(name)) % 250}", 8000),
        Metrics(
            waiting_queue_size=queue,
            kv_cache_usage=kv,
            active_models=frozenset(active),
            waiting_models=frozenset(waiting),
            max_active_models=max_lora,
            updated_at=updated_at,
        ),
    )


def names(pods: Sequence[PodMetrics]) -> list[str]:
    return [p.pod.key.name for p in pods]
