"""Churn through the API, CI profile: the state machine of `harness.stress.churn`, a few short examples.

After every step the EPP is settled and its datastore must equal the oracle. Two runs: pods the node
agent runs (readiness through the simulators' health and the agent's probe, graceful termination
through a preStop sleep; the check polls the oracle after settling, because the agent also writes on
its own), and forged pods (every write the test's own; the check is strict: the first verdict after
settling must be consistent). The long profile (20 seeds x 300 pods) is
`benchmarks/churn_long.py`; `EPP_CHURN_EXAMPLES` / `EPP_CHURN_STEPS` lengthen this one.

Hypothesis reports a failing example as the list of steps that produced it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from kubernetes.client import ApiClient

from harness.cluster.controlplane import ClusterAccess
from harness.stress import churn

EXAMPLES = int(os.environ.get("EPP_CHURN_EXAMPLES", "3"))  # the first is hypothesis's simplest one
STEPS = int(os.environ.get("EPP_CHURN_STEPS", "10"))


@pytest.mark.parametrize(
    ("kind", "examples", "steps"),
    [
        # Longer, so that a graceful pod is Terminating in its preStop sleep in most runs: the window
        # where an EPP that ignores deletionTimestamp still routes to it (upstream #713's kind).
        pytest.param(churn.PodKind.AGENT, 3 * EXAMPLES, 2 * STEPS, id="pods-the-node-agent-runs"),
        pytest.param(churn.PodKind.FORGED, EXAMPLES, 3 * STEPS, id="forged-pods-strict"),
    ],
)
def test_datastore_equals_the_oracle_after_every_step(
    control_plane: ClusterAccess,
    kube_api: ApiClient,
    namespace: str,
    kind: churn.PodKind,
    examples: int,
    steps: int,
) -> None:
    started = time.monotonic()
    stats = churn.run(
        kube_api,
        Path(control_plane.kubeconfig_path),
        namespace,
        churn.ChurnSettings(pod_kind=kind),
        examples=examples,
        steps=steps,
    )
    print(churn.summary(stats, time.monotonic() - started))
    assert stats.mismatches == []
    assert stats.checks >= stats.steps > 0, "the machine ran steps and checked after each"
