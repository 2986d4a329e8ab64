"""`harness replay` as a user runs it: a subprocess, a scenario file, a verdict after every step."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cluster.controlplane import ClusterAccess

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.yaml"))


def replay(scenario: Path, *extra: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "replay", str(scenario), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("scenario", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_replays_consistently(scenario: Path, control_plane: ClusterAccess) -> None:
    run = replay(scenario, "--kubeconfig", str(control_plane.kubeconfig_path))
    assert run.returncode == 0, run.stdout + run.stderr
    steps = re.findall(r"^\[(\d+)\]", run.stdout, re.M)
    verdicts = re.findall(r"^\s+oracle:\s+consistent", run.stdout, re.M)
    assert steps, run.stdout
    assert len(verdicts) == len(steps), run.stdout
    assert f"all {len(steps)} steps consistent" in run.stdout


def test_diverging_scenario_names_the_step(tmp_path: Path, control_plane: ClusterAccess) -> None:
    scenario = tmp_path / "wrong.yaml"
    scenario.write_text(
        "name: wrong expectation\n"
        "steps:\n"
        "  - apply_pool: {selector: {app: vllm}, port: 8000}\n"
        "  - apply_model: {name: chat, criticality: Critical}\n"
        "  - add_pod: {name: p1, labels: {app: vllm}}\n"
        "  - pod_unready: p1\n"
        "    expect: {pods: [p1]}\n"
    )
    run = replay(scenario, "--kubeconfig", str(control_plane.kubeconfig_path))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "DIVERGED at step 4 (pod_unready p1)" in run.stdout
    assert "datastore pods [], expected ['p1']" in run.stdout


def test_settle_step_waits_for_a_given_resource_version_and_says_how_far_the_epp_got(
    tmp_path: Path, control_plane: ClusterAccess
) -> None:
    scenario = tmp_path / "settle.yaml"
    scenario.write_text(
        "name: settle on a write that never comes\n"
        "steps:\n"
        "  - apply_pool: {selector: {app: vllm}, port: 8000}\n"
        "  - add_pod: {name: p1, labels: {app: vllm}}\n"
        "  - settle:\n"
        "    expect: {pods: [p1]}\n"
        "  - settle: {at: {pods: 999999999}, timeout: 1}\n"
    )
    run = replay(scenario, "--kubeconfig", str(control_plane.kubeconfig_path))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "[3] settle" in run.stdout
    assert "DIVERGED at step 4" in run.stdout
    assert re.search(r"EPP settled: still failing .* pods: applied \d+, written 999999999", run.stdout), (
        run.stdout
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("steps: []\n", "non-empty 'steps'", id="no-steps"),
        pytest.param("steps:\n  - settle: {at: {pod: 12}}\n", "'at' maps kinds", id="settle-unknown-kind"),
        pytest.param(
            "steps:\n  - settle: {at: {pods: soon}}\n", "must be a resourceVersion", id="settle-bad-rv"
        ),
        pytest.param("steps:\n  - fly_away: p1\n", "exactly one action", id="unknown-action"),
        pytest.param("steps:\n  - add_pod: {name: p1, colour: red}\n", "unknown keys ['colour']", id="typo"),
    ],
)
def test_malformed_scenario_is_rejected_before_anything_starts(
    tmp_path: Path, text: str, message: str
) -> None:
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(text)
    run = replay(scenario, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    assert message in run.stderr


def test_replay_starts_its_own_control_plane_when_given_no_cluster() -> None:
    run = replay(EXAMPLES[0])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "starting the control plane" in run.stdout
