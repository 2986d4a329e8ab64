"""``harness bench routing``, shortened (two policies, one load, one short trace), so it cannot rot.

Runs the command as a user would (a subprocess with its own throw-away control plane) and checks
what it leaves: exit 0, the summary with the EPP/round-robin ratio, the Markdown table, the JSON file
with one run per policy that served every request, and a PNG.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli.bench.runner import BenchConfig, warm_count

pytestmark = pytest.mark.e2e

TIMEOUT_S = 240.0
POLICIES = ("epp", "envoy-round-robin")
REQUESTS = 40


def test_a_short_routing_benchmark_writes_its_table_json_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    command = [
        sys.executable, "-m", "harness.cli", "bench", "routing",
        "--policies", ",".join(POLICIES), "--loads", "0.9", "--repeats", "1",
        "--requests", str(REQUESTS), "--capacity-requests", "60", "--pods", "4", "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    output = f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    assert result.returncode == 0, output
    label = "sharegpt + 4 adapters over 2 slots (80% of requests)"  # the live default, named in full
    assert f"EPP / round robin, TTFT p90 on the {label} workload:" in result.stdout, output
    assert "left no process behind" in result.stdout, output

    table = (out / "routing.md").read_text()
    for policy in POLICIES:
        assert f"| 0.9 | {policy} |" in table, table

    data = json.loads((out / "routing.json").read_text())
    assert data["policies"] == list(POLICIES)
    assert data["capacity_rps"] > 0
    runs = data["runs"]
    assert sorted(r["policy"] for r in runs) == sorted(POLICIES)
    counted = REQUESTS - warm_count(REQUESTS, BenchConfig.warmup_fraction)  # the warm-up left out
    for run in runs:
        assert run["ok"] == counted, run
        assert sum(run["per_pod"]) == REQUESTS, run  # the simulators served every request
        assert run["ttft"]["p90"] > 0
    assert {r["name"] for r in data["ratios"]} >= {"EPP / round robin, TTFT p90"}

    png = (out / "routing.png").read_bytes()
    assert png.startswith(b"\x89PNG")
