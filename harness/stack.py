"""The whole system as a user runs it: API server objects, pods run by the node agent, the EPP process, Envoy.

`Stack` is what the e2e tests, `harness demo` and `harness up --with-epp` stand up. Pool, models and
pods go through the API server (`harness.cluster.Cluster`); the node agent runs the pods' simulators;
the EPP runs as its own process with a kubeconfig, exactly as in a cluster; clients talk to Envoy's
listener only. What the EPP holds is read through `harness.observer.EppObserver`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from harness.cluster import Cluster
from harness.controlplane import ClusterAccess
from harness.envoy import Envoy, EnvoyOptions
from harness.epp_process import EppProcess
from harness.eventually import eventually
from harness.namespaces import create_namespace
from harness.observer import EppObserver
from harness.settle import SettleBarrier
from harness.sim import SimConfig

BASE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass(frozen=True)
class ModelSpec:
    """One InferenceModel: what clients ask for, and what it resolves to."""

    name: str
    model_name: str
    criticality: str | None = None
    targets: tuple[tuple[str, int | None], ...] = ()


# The sample a newcomer sees: a weighted split across two LoRA adapters, a LoRA target, a
# sheddable model, and the base model served directly.
DEMO_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec("food-review", "food-review", "Critical", (("food-review-1", 70), ("food-review-2", 30))),
    ModelSpec("sql-lora", "sql-lora", "Critical", (("sql-lora-v1", None),)),
    ModelSpec("summaries-batch", "summaries-batch", "Sheddable", ((BASE_MODEL, None),)),
    ModelSpec("llama", BASE_MODEL, "Standard"),
)
DEMO_ADAPTERS = ("food-review-1", "food-review-2", "sql-lora-v1")


@dataclass
class StackOptions:
    namespace: str
    pool_name: str = "vllm-pool"
    pods: int = 4
    models: Sequence[ModelSpec] = DEMO_MODELS
    sim_config: SimConfig = field(
        default_factory=lambda: SimConfig(
            model=BASE_MODEL, lora_adapters=DEMO_ADAPTERS, max_loras=2, max_num_seqs=8, time_scale=0.05
        )
    )
    envoy: EnvoyOptions = field(default_factory=EnvoyOptions)
    epp_args: Sequence[str] = ()
    epp_env: Mapping[str, str] = field(default_factory=dict)
    # False: the Stack applies no pool, models or pods: the EPP and Envoy serve a pool that a user
    # (kubectl apply of examples/cluster/, a test) creates in the namespace afterwards.
    apply_pool: bool = True


class Stack:
    """Start in dependency order; stop in reverse. Usable as a context manager."""

    def __init__(self, access: ClusterAccess, options: StackOptions) -> None:
        self.access = access
        self.options = options
        self.settle_barrier = SettleBarrier()
        self._api: client.ApiClient | None = None
        self.cluster: Cluster | None = None
        self.observer: EppObserver | None = None
        self.epp: EppProcess | None = None
        self.envoy: Envoy | None = None

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        opts = self.options
        self._api = self.access.api_client()
        _ensure_namespace(self._api, opts.namespace)
        self.cluster = cluster = Cluster(
            self._api, opts.namespace, barrier=self.settle_barrier, pool_name=opts.pool_name,
            sim_config=opts.sim_config,
        )  # fmt: skip
        if opts.apply_pool:
            cluster.apply_pool()
            for model in opts.models:
                cluster.apply_model(
                    model.name, model.model_name, criticality=model.criticality, targets=model.targets
                )
            cluster.add_pods([cluster.pod_body(f"{opts.pool_name}-{i}") for i in range(opts.pods)])
        self.epp = EppProcess(
            opts.pool_name,
            opts.namespace,
            self.access.kubeconfig_path,
            # One body limit for both: Envoy's buffer and the EPP's 413 (epp_args may still override).
            extra_args=[f"--maxRequestBodyBytes={opts.envoy.buffer_limit_bytes}", *opts.epp_args],
            extra_env=dict(opts.epp_env),
        )
        self.epp.start()
        self.observer = EppObserver(
            cluster.kube, opts.namespace, opts.pool_name, self.settle_barrier, self.epp.datastore_view
        )
        if opts.apply_pool:
            self.epp.wait_serving()
            self.wait_pods_scraped(opts.pods)
        self.envoy = Envoy(self.epp.ext_proc_address, options=opts.envoy, ext_proc_tls=self.epp.ext_proc_tls)
        self.envoy.start()

    def stop(self) -> None:
        try:
            if self.envoy is not None:
                self.envoy.stop()
                self.envoy = None
        finally:
            try:
                if self.epp is not None:
                    self.epp.close()
                    self.epp = None
            finally:
                self.observer = None
                if self.cluster is not None:
                    self.cluster.close()
                    self.cluster = None
                if self._api is not None:
                    self._api.close()  # type: ignore[no-untyped-call]
                    self._api = None

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ reading the system
    @property
    def base_url(self) -> str:
        """The OpenAI base URL clients use (Envoy's listener)."""
        assert self.envoy is not None
        return f"{self.envoy.base_url}/v1"

    def datastore_view(self) -> dict[str, Any]:
        assert self.epp is not None
        return self.epp.datastore_view()

    def settled(self, timeout: float = 15.0, *, at: Mapping[str, str | int] | None = None) -> dict[str, Any]:
        """The settle barrier (`EppObserver.settled`) against this Stack's EPP process.

        Writes made through `cluster` are recorded; `at` adds resourceVersions written with kubectl
        (per kind plural, e.g. ``{"pods": rv}``). Call it before any "X did not happen" check.
        """
        assert self.observer is not None, "the Stack is not started"
        return self.observer.settled(timeout, at=at)

    def dead_processes(self) -> list[str]:
        dead = []
        if self.envoy is not None and not self.envoy.running:
            dead.append("envoy")
        if self.epp is not None and not self.epp.running:
            dead.append("epp")
        return dead

    def log_tails(self) -> str:
        parts = []
        if self.epp is not None:
            parts.append(f"--- epp log ---\n{self.epp.log_tail()}")
        if self.envoy is not None:
            parts.append(f"--- envoy log ---\n{self.envoy.log_tail()}")
        return "\n".join(parts)

    def wait_pods_scraped(self, count: int, timeout: float = 30.0) -> None:
        """Until the EPP holds `count` pods, each with fresh metrics (routing decisions are real)."""

        def scraped() -> None:
            pods = self.datastore_view().get("pods") or []
            fresh = [p for p in pods if p.get("metricsAgeSeconds") is not None]
            assert len(fresh) == count, f"{len(fresh)}/{count} pods scraped"

        eventually(scraped, timeout=timeout, message="EPP scraped every pod")


def _ensure_namespace(api: client.ApiClient, namespace: str) -> None:
    create_namespace(api, namespace, exist_ok=True)
