"""Churn through the API: a hypothesis state machine that changes pods, the pool and models at random,
and after every step settles and checks the EPP's datastore against the consistency oracle.

One change at a time is what the scenario tests show right. What they cannot show is that the
datastore still equals the API server after hundreds of changes in an order nobody thought of: a
pod re-created under its name while a scrape of its old address is in flight, a selector changed
while a pod is Terminating, two models claiming one ``modelName`` in the same second and then the EPP
restarted (its initial list must resolve the tie as the live events did). So the machine draws the
steps, and the check after each is the oracle's, computed from the API alone.

Two kinds of pod, chosen per run (``PodKind``):

- ``agent``: pods the node agent runs (simulator processes, a readiness probe). Readiness flips
  through the simulator's admin port (``/health`` fails, the probe takes the pod out of Ready), an
  IP changes by delete + re-create under the same name (the agent gives the new pod a new address),
  graceful termination through a preStop sleep (the pod stays Ready while Terminating). The agent
  also writes on its own (the final delete once the preStop hook is over), which the settle barrier
  does not wait for, so the check is ``eventually_consistent`` (settle, then poll the oracle).
- ``forged``: stand-in pods (``Cluster.add_forged_pod``), no scheduler and no kubelet, their
  simulators in this process and their status written by the test (``harness.cluster.forged``). Readiness
  is a status write, an IP change is also done in place (no kubelet does that), graceful
  termination is a deletion held by a finalizer. Every write is the test's and recorded, so the
  check is strict: right after ``settled()`` the first verdict must be consistent, no polling, and
  no process runs per pod.

The machine never touches the datastore: writes go to the API server and the simulators' admin
ports, the datastore is read through ``/debug/datastore``.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import hypothesis
from hypothesis import HealthCheck, Phase
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.beds.cluster import DEFAULT_APP_LABEL, DEFAULT_POOL
from harness.beds.testbed import TestBed
from harness.cluster.namespaces import TEST_LABEL, create_namespace

POD_NAMES: Final = tuple(f"p{i}" for i in range(8))
MODEL_OBJECTS: Final = ("m-a", "m-b", "m-c", "m-d", "m-e")
MODEL_NAMES: Final = ("chat", "code")  # few names, many claimants: ownership changes hands often
PORTS: Final = (8000, 8001)
SERVED_PORT: Final = 8000  # what the pods' simulators listen on, whatever the pool says
TIERS: Final = ("a", "b", None)
APPS: Final = (DEFAULT_POOL, "other", None)
# In and out of these the pods' labels move; each is a pool selector the machine may apply.
SELECTORS: Final[tuple[dict[str, str], ...]] = (
    {DEFAULT_APP_LABEL: DEFAULT_POOL},
    {DEFAULT_APP_LABEL: DEFAULT_POOL, "tier": "a"},
    {"tier": "b"},
)
ONE_IN_FOUR: Final = (False, False, False, True)
PRE_STOP_S: Final = 1  # agent pods made to be terminated gracefully stay Ready this long while deleted
# Restarts are a zero-argument rule, which hypothesis's swarm testing can leave nearly alone among the
# enabled rules: then most steps would be restarts, with nothing changed in between.
RESTART_SPACING: Final = 4  # checks between two EPP restarts, at least


class PodKind(enum.Enum):
    AGENT = "agent"
    FORGED = "forged"


@dataclass
class ChurnStats:
    """What a run did, summed over every example the machine ran (printed by the long profile)."""

    examples: int = 0
    steps: int = 0
    checks: int = 0
    pods_created: int = 0
    ip_changes: int = 0
    epp_restarts: int = 0
    models_created: int = 0
    same_second_claims: int = 0  # a model created in the same second as a live claimant of its name
    mismatches: list[str] = field(default_factory=list)
    step_counts: dict[str, int] = field(default_factory=dict)

    def count(self, step: str) -> None:
        self.steps += 1
        self.step_counts[step] = self.step_counts.get(step, 0) + 1


@dataclass(frozen=True)
class ChurnSettings:
    pod_kind: PodKind
    timeout: float = 60.0  # per settle / convergence: generous, the machine is shared with other work
    refresh_interval: float = 0.2  # scraping is not what the oracle checks; keep it cheap


@dataclass
class PodState:
    """A pod as the machine made it: what it expects the API to say."""

    labels: dict[str, str]
    ready: bool
    graceful: bool = False  # agent: made with a preStop sleep, so a graceful delete stays Ready a while
    deleting: dict[str, Any] | None = None  # the graceful delete's answer, while Terminating

    @property
    def terminating(self) -> bool:
        return self.deleting is not None


Workspace = Callable[[], tuple[TestBed, Callable[[], None]]]
"""Makes a fresh TestBed (its own namespace, EPP not started) and the function that removes it."""


class ChurnMachine(RuleBasedStateMachine):
    """One example = one fresh namespace and EPP; the rules below, in whatever order hypothesis draws."""

    def __init__(self, workspace: Workspace, settings: ChurnSettings, stats: ChurnStats) -> None:
        super().__init__()
        self.settings = settings
        self.stats = stats
        self.bed, self._remove = workspace()
        self.pods: dict[str, PodState] = {}
        self.models: dict[str, tuple[str, str]] = {}  # object name -> (modelName, creationTimestamp)
        self.pool = False
        self.selector = SELECTORS[0]
        self.port = PORTS[0]
        self.steps_since_restart = 0
        stats.examples += 1

    @property
    def forged(self) -> bool:
        return self.settings.pod_kind is PodKind.FORGED

    def teardown(self) -> None:
        try:
            self.bed.close()
        finally:
            self._remove()

    # ------------------------------------------------------------------ the check after every step
    @invariant()
    def datastore_equals_the_oracle(self) -> None:
        self.stats.checks += 1
        self.steps_since_restart += 1
        timeout = self.settings.timeout
        if not self.forged:
            self.bed.eventually_consistent(timeout=timeout)
            return
        self.bed.settled(timeout=timeout)
        verdict = self.bed.verdict()
        if not verdict.consistent:
            self.stats.mismatches.append(verdict.summary())
            raise AssertionError(f"settled, yet {verdict.summary()}")

    # ------------------------------------------------------------------ the start
    @initialize()
    def start(self) -> None:
        """The EPP, the pool and two Ready pods in it: every example begins with something to churn."""
        self.bed.start_epp()
        self.bed.apply_pool(self.selector, self.port)
        self.pool = True
        for name in POD_NAMES[:2]:
            self._create(name, dict(self.selector), True, False)

    # ------------------------------------------------------------------ pods
    def _free(self) -> list[str]:
        return [n for n in POD_NAMES if n not in self.pods]

    def _live(self) -> list[str]:
        return sorted(n for n, p in self.pods.items() if not p.terminating)

    def _create(self, name: str, labels: dict[str, str], ready: bool, graceful: bool) -> None:
        if self.forged:
            self.bed.cluster.add_forged_pod(name, labels, ready=ready, ports=(SERVED_PORT,))
        else:
            pre_stop = PRE_STOP_S if graceful else None
            self.bed.cluster.add_pod(name, labels, ready=ready, ports=(SERVED_PORT,), pre_stop=pre_stop)
        self.pods[name] = PodState(dict(labels), ready, graceful=graceful and not self.forged)
        self.stats.pods_created += 1

    @precondition(lambda self: self._free())
    @rule(data=st.data(), app=st.sampled_from(APPS), tier=st.sampled_from(TIERS), ready=st.booleans(),
          graceful=st.booleans())  # fmt: skip
    def add_pod(self, data: st.DataObject, app: str | None, tier: str | None, ready: bool,
                graceful: bool) -> None:  # fmt: skip
        name = data.draw(st.sampled_from(self._free()), label="name")
        self._create(name, _labels(app, tier), ready, graceful)
        self.stats.count("add_pod")

    @precondition(lambda self: len(self._free()) >= 2)
    @rule(data=st.data())
    def add_pods_in_the_pool(self, data: st.DataObject) -> None:
        """Several Ready pods that match the selector now: the pool grows in one step."""
        free = self._free()
        count = data.draw(st.integers(2, min(4, len(free))), label="count")
        names = data.draw(st.lists(st.sampled_from(free), min_size=count, max_size=count, unique=True))
        for name in names:
            self._create(name, dict(self.selector), True, False)
        self.stats.count("add_pods_in_the_pool")

    @precondition(lambda self: self._live())
    @rule(data=st.data(), force=st.booleans())
    def delete_pod(self, data: st.DataObject, force: bool) -> None:
        name = data.draw(st.sampled_from(self._live()), label="name")
        if force:
            self.bed.force_delete_pod(name)
        else:
            self.bed.delete_pod(name)
        del self.pods[name]
        self.stats.count("force_delete_pod" if force else "delete_pod")

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def change_ip(self, data: st.DataObject) -> None:
        """The pod deleted and created again under its name: a new UID and a new address."""
        name = data.draw(st.sampled_from(self._live()), label="name")
        state = self.pods[name]
        old_ip = self.bed.pods[name].ip
        self.bed.delete_pod(name)
        self._create(name, state.labels, state.ready, state.graceful)
        assert self.bed.pods[name].ip != old_ip, f"{name} kept its address {old_ip}"
        self.stats.ip_changes += 1
        self.stats.count("change_ip")

    @precondition(lambda self: self.forged and self._live())
    @rule(data=st.data())
    def move_in_place(self, data: st.DataObject) -> None:
        """Forged only: the same pod object gets another address (no kubelet does this)."""
        name = data.draw(st.sampled_from(self._live()), label="name")
        self.bed.forged_move(name)
        self.stats.ip_changes += 1
        self.stats.count("move_in_place")

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def flip_readiness(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(self._live()), label="name")
        state = self.pods[name]
        if self.forged:
            (self.bed.forged_unready if state.ready else self.bed.forged_ready)(name)
        else:  # the simulator's /health flips; the agent's readiness probe flips Ready
            (self.bed.pod_unready if state.ready else self.bed.pod_ready)(name)
        state.ready = not state.ready
        self.stats.count("flip_readiness")

    @precondition(lambda self: self._live())
    @rule(data=st.data(), app=st.sampled_from(APPS), tier=st.sampled_from(TIERS))
    def relabel(self, data: st.DataObject, app: str | None, tier: str | None) -> None:
        name = data.draw(st.sampled_from(self._live()), label="name")
        self.bed.pod_labels(name, {DEFAULT_APP_LABEL: app, "tier": tier})
        self.pods[name].labels = _labels(app, tier)
        self.stats.count("relabel")

    def _terminable(self) -> list[str]:
        return [n for n in self._live() if self.forged or self.pods[n].graceful]

    @precondition(lambda self: self._terminable())
    @rule(data=st.data())
    def terminate(self, data: st.DataObject) -> None:
        """Graceful deletion begun: deletionTimestamp set, the pod still Ready (agent: its preStop
        sleep; forged: a finalizer holds it). The EPP must drop it now, not when it is gone."""
        name = data.draw(st.sampled_from(self._terminable()), label="name")
        if self.forged:
            self.bed.forged_hold_and_delete(name)
            self.pods[name].deleting = {}
        else:
            self.pods[name].deleting = self.bed.terminate_pod(name)
            # The invariant polls for agent pods (the agent writes on its own), which would wait out
            # the preStop sleep and let an EPP that routes to Terminating pods pass. This one check
            # needs no polling: once the EPP has seen the deletion, the pod is out for good.
            self.bed.settled(timeout=self.settings.timeout)
            assert name not in self.bed.datastore_pods(), f"{name} is Terminating, yet in the datastore"
        self.stats.count("terminate")

    @precondition(lambda self: any(p.terminating for p in self.pods.values()))
    @rule(data=st.data())
    def termination_ends(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(n for n, p in self.pods.items() if p.terminating)))
        if self.forged:
            self.bed.forged_release(name)
        else:
            deleting = self.pods[name].deleting
            assert deleting is not None
            self.bed.cluster.await_gone(name, deleting)
        del self.pods[name]
        self.stats.count("termination_ends")

    # ------------------------------------------------------------------ the pool
    @precondition(lambda self: self.pool)
    @rule(selector=st.sampled_from(range(len(SELECTORS))), port=st.sampled_from(PORTS))
    def change_pool(self, selector: int, port: int) -> None:
        self.selector, self.port = SELECTORS[selector], port
        self.bed.apply_pool(self.selector, self.port)
        self.stats.count("change_pool")

    @precondition(lambda self: self.pool)
    @rule()
    def delete_pool(self) -> None:
        self.bed.delete_pool()
        self.pool = False
        self.stats.count("delete_pool")

    # No arguments, on purpose: hypothesis orders rules by argument count and begins every run with
    # its simplest example, which repeats the first enabled rule of that order. Pool deleted and
    # re-created (at the selector and port it had) keeps that example cheap and still a churn.
    @precondition(lambda self: not self.pool)
    @rule()
    def create_pool(self) -> None:
        self.bed.apply_pool(self.selector, self.port)
        self.pool = True
        self.stats.count("create_pool")

    # ------------------------------------------------------------------ models
    def _free_models(self) -> list[str]:
        return [m for m in MODEL_OBJECTS if m not in self.models]

    def _create_model(self, name: str, model_name: str) -> None:
        created = self.bed.apply_model(name, model_name, criticality="Critical", targets=[(f"{name}-t", 100)])
        stamp = str(created["metadata"]["creationTimestamp"])
        if any(m == model_name and s == stamp for m, s in self.models.values()):
            self.stats.same_second_claims += 1
        self.models[name] = (model_name, stamp)
        self.stats.models_created += 1

    @precondition(lambda self: self._free_models())
    @rule(data=st.data(), model_name=st.sampled_from(MODEL_NAMES), after_a_tick=st.sampled_from(ONE_IN_FOUR))
    def create_model(self, data: st.DataObject, model_name: str, after_a_tick: bool) -> None:
        """``after_a_tick``: once the API server's clock has moved to the next second, so this claimant
        is strictly younger than every live one (otherwise it often shares their second)."""
        name = data.draw(st.sampled_from(self._free_models()), label="name")
        if after_a_tick:
            self.bed.eventually_server_time_after(self.bed.server_time(), timeout=self.settings.timeout)
        self._create_model(name, model_name)
        self.stats.count("create_model")

    @precondition(lambda self: len(self._free_models()) >= 2)
    @rule(data=st.data(), model_name=st.sampled_from(MODEL_NAMES))
    def create_rival_models(self, data: st.DataObject, model_name: str) -> None:
        """Two claimants of one modelName back to back: most often in the same creation second, so
        the tie is broken by namespace/name — the same way live, after a relist and after a restart."""
        free = st.sampled_from(self._free_models())
        names = data.draw(st.lists(free, min_size=2, max_size=2, unique=True), label="names")
        for name in names:
            self._create_model(name, model_name)
        self.stats.count("create_rival_models")

    @precondition(lambda self: self.models)
    @rule(data=st.data())
    def delete_model(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.models)), label="name")
        self.bed.delete_model(name)
        del self.models[name]
        self.stats.count("delete_model")

    # ------------------------------------------------------------------ the EPP
    @precondition(lambda self: self.steps_since_restart >= RESTART_SPACING)
    @rule()
    def restart_epp(self) -> None:
        """A fresh EPP process's memory: everything from the initial lists."""
        self.bed.restart_epp()
        self.steps_since_restart = 0
        self.stats.epp_restarts += 1
        self.stats.count("restart_epp")


def _labels(app: str | None, tier: str | None) -> dict[str, str]:
    labels = {DEFAULT_APP_LABEL: app, "tier": tier}
    return {k: v for k, v in labels.items() if v is not None}


def summary(stats: ChurnStats, seconds: float, **extra: Any) -> str:
    parts = [
        f"examples={stats.examples}",
        f"steps={stats.steps}",
        f"checks={stats.checks}",
        f"pods_created={stats.pods_created}",
        f"ip_changes={stats.ip_changes}",
        f"models_created={stats.models_created}",
        f"same_second_claims={stats.same_second_claims}",
        f"epp_restarts={stats.epp_restarts}",
        f"mismatches={len(stats.mismatches)}",
        f"wall={seconds:.1f}s",
    ]
    parts += [f"{k}={v}" for k, v in extra.items()]
    return " ".join(parts)


def run(
    api_client: client.ApiClient,
    kubeconfig: Path,
    namespace_prefix: str,
    settings: ChurnSettings,
    *,
    examples: int,
    steps: int,
    seed: int | None = None,
    shrink: bool = True,
    stats: ChurnStats | None = None,
) -> ChurnStats:
    """Run the machine: ``examples`` fresh namespaces, ``steps`` steps each (hypothesis's failure
    report lists the steps of a failing example). ``seed`` makes the run reproducible; ``shrink=False``
    reports a failing example as found (the long profile: shrinking thousands of steps takes hours)."""
    stats = stats if stats is not None else ChurnStats()
    numbers = itertools.count()
    core = client.CoreV1Api(api_client)

    def workspace() -> tuple[TestBed, Callable[[], None]]:
        namespace = f"{namespace_prefix}-{next(numbers)}"
        create_namespace(api_client, namespace, TEST_LABEL)
        bed = TestBed(api_client, namespace, kubeconfig, refresh_interval=settings.refresh_interval)

        def remove() -> None:  # requested, not awaited: the next example has its own namespace
            with contextlib.suppress(ApiException):
                core.delete_namespace(namespace, _request_timeout=10)

        return bed, remove

    def machine() -> ChurnMachine:
        return ChurnMachine(workspace, settings, stats)

    if seed is not None:
        machine = hypothesis.seed(seed)(machine)
    phases = tuple(Phase) if shrink else (Phase.explicit, Phase.generate)
    run_state_machine_as_test(
        machine,  # type: ignore[arg-type]  # documented: "a factory", typed as the class
        settings=hypothesis.settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            phases=phases,
            suppress_health_check=list(HealthCheck),
            print_blob=False,
        ),
    )
    return stats
