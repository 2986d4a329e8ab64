"""Values the datastore hands out. All frozen: readers get snapshots, writers swap whole values."""

from __future__ import annotations

from dataclasses import dataclass, field

from epp.api.types import EndpointKey


@dataclass(frozen=True, slots=True)
class Metrics:
    """One scrape's view of a model server.

    `updated_at` is the injected clock's reading when the scrape finished; None means never scraped,
    which the scheduler must not mistake for idle (DESIGN.md §2, staleness).
    """

    waiting_queue_size: int = 0
    running_queue_size: int = 0
    kv_cache_usage: float = 0.0
    active_models: frozenset[str] = frozenset()
    waiting_models: frozenset[str] = frozenset()
    max_active_models: int = 0
    updated_at: float | None = None

    @property
    def loaded_adapters(self) -> frozenset[str]:
        """Adapters that count for LoRA affinity: running plus waiting (v0.2.0+)."""
        return self.active_models | self.waiting_models


@dataclass(frozen=True, slots=True)
class Pod:
    """A routable endpoint: one pod at one of the pool's target ports (its rank, in `key`).

    The port is kept here, set from the pool's current ports whenever either changes, so the prober
    scrapes and the handlers route each rank on its own port.
    """

    key: EndpointKey
    address: str
    port: int
    # The pod's labels (sorted items): the prober picks the model server's engine by one of them
    # (`inference.networking.k8s.io/engine-type` by default, epp.backend.metrics.refresher.engine_of).
    labels: tuple[tuple[str, str], ...] = ()

    def label(self, key: str) -> str:
        return next((value for name, value in self.labels if name == key), "")

    @property
    def endpoint(self) -> str:
        """`ip:port`, IPv6 in brackets."""
        if ":" in self.address:
            return f"[{self.address}]:{self.port}"
        return f"{self.address}:{self.port}"


@dataclass(frozen=True, slots=True)
class Dispatched:
    """Requests the EPP itself routed to a pod whose responses have not ended yet.

    Unlike scraped metrics this is never stale: it changes the moment the EPP routes a request and
    the moment Envoy closes that request's ext_proc stream. ``models`` are the target models (base
    or adapter) of those requests. ``last`` is the store's dispatch sequence number (1, 2, ... over
    every pod) of the latest request routed to this pod, 0 if none yet: how many dispatches ago a
    pod was last chosen is ``max(last over the pods) - last``, with no clock involved.
    ``prompt_tokens`` are those requests' prompt tokens (estimated from their bodies): context the
    engine reads at every step while they decode. ``prefill_tokens`` are the prompt tokens of those
    that no response byte has come back for yet (when the EPP is not sent response bodies: until
    they end): work the engine still has to prefill, which the next request sent there waits behind.
    ``prefilled_at`` is when the latest first response byte came back from the pod (the EPP's
    monotonic clock, None before any): the engine began a step then.
    """

    count: int = 0
    models: frozenset[str] = frozenset()
    last: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    prefilled_at: float | None = None


@dataclass(frozen=True, slots=True)
class PodMetrics:
    pod: Pod
    metrics: Metrics = field(default_factory=Metrics)
    dispatched: Dispatched = field(default_factory=Dispatched)

    def is_fresh(self, now: float, staleness_threshold: float) -> bool:
        updated = self.metrics.updated_at
        return updated is not None and now - updated <= staleness_threshold
