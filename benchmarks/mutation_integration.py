"""The second stage of the mutation runner: the unit tier's survivors against a fast subset of the
integration tier (`benchmarks/mutation.py --integration`).

mutmut runs the unit tier only: its stats phase maps tests to the functions they reach in-process,
and changing its test selection resets every verdict it holds. A survivor there may still be caught
where a user would see it, through the API server, the node agent's simulated pods and ext_proc. So
each survivor (other than the log-text ones, which change no behaviour) is planted in `epp/` by hand
and the subset of its package runs against one control plane started for the whole stage (passed to
pytest as an external cluster, so no test starts its own). Verdicts are kept in
`mutants/integration-verdicts.json` with a hash of the mutant's diff: a mutant whose diff changed is
checked again, the rest never.

The subsets are the integration tests that run the EPP in this process (the `TestBed`) and take a
few seconds each; the tiers that restart the API server or need Envoy stay out (minutes per mutant).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

SCHEDULING = "tests/integration/routing/test_scheduling.py"
ROUTING = ("tests/integration/routing/test_protocol.py", SCHEDULING)
RECONCILING = (
    "tests/integration/scenarios/test_smoke.py",
    "tests/integration/scenarios/test_pods.py",
    "tests/integration/scenarios/test_pool.py",
    "tests/integration/scenarios/test_models.py",
    "tests/integration/scenarios/test_settle_barrier.py::"
    "test_settled_waits_out_a_failed_reconcile_waiting_to_be_retried",
)
SUBSET_BY_PACKAGE: Mapping[str, tuple[str, ...]] = {
    "h2": ROUTING,
    "handlers": ROUTING,
    "scheduling": (SCHEDULING, "tests/integration/routing/test_staleness.py"),
    "controller": RECONCILING,
    "datastore": (*RECONCILING, SCHEDULING),
    "k8s": (*RECONCILING, "tests/integration/scenarios/test_token_rotation.py"),
}
KILLED = "killed by integration"
SURVIVED = "survived integration"


def diff_key(diff: str) -> str:
    return hashlib.sha256(diff.encode()).hexdigest()[:16]


class Verdicts:
    """The stage's verdicts, by mutant name, each valid only for the diff it was reached with."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._by_name: dict[str, dict[str, str]] = json.loads(path.read_text()) if path.exists() else {}

    def get(self, name: str, diff: str) -> str | None:
        """The verdict for this mutant as it is now; None if never checked or its diff changed."""
        entry = self._by_name.get(name)
        return entry["verdict"] if entry and entry["diff"] == diff_key(diff) else None

    def put(self, name: str, diff: str, verdict: str, failure: str) -> None:
        self._by_name[name] = {"diff": diff_key(diff), "verdict": verdict, "failure": failure}
        self.path.write_text(json.dumps(self._by_name, indent=1, sort_keys=True))


@contextlib.contextmanager
def shared_plane() -> Iterator[dict[str, str]]:
    """One full control plane (CRDs installed) for the stage; the environment that has pytest use it."""
    from harness.cluster.controlplane import FULL, ControlPlane
    from harness.plugin.core import KUBECONFIG_ENV

    plane = ControlPlane(components=FULL, install_crds=True)
    print("==> starting a control plane for the integration subset", flush=True)
    plane.start()
    try:
        yield {**os.environ, KUBECONFIG_ENV: str(plane.kubeconfig_path)}
    finally:
        plane.stop()


def check(
    package: str,
    survivors: Sequence[str],
    verdicts: Verdicts,
    *,
    diff_of: Callable[[str], str],
    planted: Callable[[str], AbstractContextManager[bool]],
    run_tests: Callable[[Sequence[str], Mapping[str, str]], tuple[int, str]],
    env: Mapping[str, str],
) -> int:
    """Each survivor not yet judged as it is now, planted and run against the package's subset;
    returns how many were checked. Prints one line per mutant as it goes."""
    subset = SUBSET_BY_PACKAGE[package]
    checked = 0
    for name in survivors:
        diff = diff_of(name)
        if verdicts.get(name, diff) is not None:
            continue
        with planted(name) as applied:
            if not applied:
                continue
            code, failure = run_tests(subset, env)
        verdict = KILLED if code else SURVIVED
        verdicts.put(name, diff, verdict, failure)
        checked += 1
        print(f"    {verdict:22} {name} {failure[:120]}".rstrip(), flush=True)
    return checked
