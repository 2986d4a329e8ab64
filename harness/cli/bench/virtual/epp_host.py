"""The EPP's routing core, hosted in the virtual-time loop: the real datastore, the real accounting
(in-flight counts and the prefix index) and the real scheduler, wired as the ext_proc handler wires
them (epp.server.runner), minus the network around them.

What each event does, as in the running EPP:
* a scrape writes a ``Metrics`` snapshot stamped with its simulated time
  (``pod_update_metrics_if_exist``, the prober's only write), so staleness is judged on real ages;
* a request hashes its prompt head into blocks, asks the prefix index which pods hold them, and the
  scheduler ranks the datastore's pods (a non-critical request may be shed: ``ResourceExhausted``);
* routing records the prefix and counts the request in flight with its prompt's estimated size
  (``Accounting.routed``); the first token ends its prefill (``Accounting.first_byte``, as the first
  response chunk does in v1's FULL_DUPLEX_STREAMED mode); the end of the response counts it down
  (``Accounting.finished``).

The pool and its pods are written once at the start, as the reconcilers would after a list. This is
the one harness module that writes the datastore directly (tests/unit/layering allows it by name):
no API server takes part in a virtual-time run.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from epp.api.types import InferencePool, NamespacedName, PodObject
from epp.config import SchedulerConfig
from epp.datastore import Metrics, new_datastore
from epp.datastore.types import PodMetrics
from epp.handlers.accounting import Accounting, Dispatch, prompt_token_estimate
from epp.scheduling import LLMRequest, new_scheduler
from harness.sim import EngineState

NAMESPACE = "bench"
POOL = "virtual-pool"
LABELS = {"app": "vllm"}
TARGET_PORT = 8000


class EppHost:
    def __init__(
        self,
        config: SchedulerConfig,
        pods: int,
        clock: Callable[[], float],
        rng: random.Random,
        *,
        response_body_sent: bool = True,
    ) -> None:
        """`response_body_sent`: Envoy sends the EPP response bodies (v1's FULL_DUPLEX_STREAMED), so
        first tokens reach it; False: response body NONE, none does."""
        self._config = config
        self._response_body_sent = response_body_sent
        self._store = new_datastore(prefix_capacity_per_pod=config.prefix_capacity_per_pod)
        self._store.pool_set(InferencePool(NamespacedName(NAMESPACE, POOL), LABELS, (TARGET_PORT,)))
        for i in range(pods):
            pod = PodObject(
                NamespacedName(NAMESPACE, f"pod-{i}"), LABELS, f"10.{i // 250}.{i % 250}.1", ready=True
            )
            self._store.pod_update_or_add(pod)
        self._index = {p.pod.key: int(p.pod.key.name.removeprefix("pod-")) for p in self._store.pod_get_all()}
        self._keys = {i: key for key, i in self._index.items()}
        self._accounting = Accounting(
            self._store,
            prefix_aware=config.prefix_aware,
            block_chars=config.prefix_block_chars,
            max_blocks=config.prefix_max_blocks,
            clock=clock,
        )
        self._scheduler = new_scheduler(config, rng, clock, pool_name=POOL)
        self.head_chars = config.prefix_block_chars * config.prefix_max_blocks

    def scraped(self, pod: int, state: EngineState, max_loras: int, now: float) -> None:
        """A scrape of the engine's gauges, as the prober parses them from ``/metrics``."""
        metrics = Metrics(
            waiting_queue_size=state.waiting,
            running_queue_size=state.running,
            kv_cache_usage=state.kv_cache_usage,
            active_models=frozenset(state.running_loras),
            waiting_models=frozenset(state.waiting_loras),
            max_active_models=max_loras,
            updated_at=now,
        )
        self._store.pod_update_metrics_if_exist(self._keys[pod], metrics)

    def route(
        self, prompt_head: str, target_model: str, critical: bool, body_bytes: int
    ) -> tuple[int, Dispatch | None]:
        """The pod for a request (its index) and its in-flight handle; raises ResourceExhausted (shed).

        `body_bytes` is the size of the request's body, which the EPP estimates the prompt from."""
        accounting = self._accounting
        prefix = accounting.prefix_query(prompt_head, target_model)
        prompt_tokens = prompt_token_estimate(body_bytes)
        request = LLMRequest(
            target_model,
            target_model,
            critical,
            len(prefix.hashes),
            prefix.matches,
            prompt_tokens,
            accounting.clock(),
            self._response_body_sent,
        )
        pods: list[PodMetrics] = list(self._store.pod_get_all())
        pick = self._scheduler.rank(request, pods, 1)[0]
        dispatch = accounting.routed(pick, target_model, prefix, prompt_tokens, self._response_body_sent)
        return self._index[pick.pod.key], dispatch

    def first_byte(self, dispatch: Dispatch | None) -> Dispatch | None:
        """The request's first token reached the client: the first chunk of its response body, which
        the EPP sees only when Envoy sends it response bodies."""
        if dispatch is None or not self._response_body_sent:
            return dispatch
        return self._accounting.first_byte(dispatch)

    def finished(self, dispatch: Dispatch | None) -> None:
        if dispatch is not None:
            self._accounting.finished(dispatch)
