"""inference-perf against the demo stack's Envoy endpoint, fully offline.

    .venv/bin/python benchmarks/inference_perf/run.py [--install] [--output DIR]

Brings up what ``harness demo`` runs (control plane, the demo pool and models, 4 simulated vLLM
pods, the EPP process, Envoy), points inference-perf at Envoy with ``config.yml`` (random prompts,
streamed completions, two constant-rate stages), then prints the tool's summary, how the EPP spread
the requests over the pods, and where the reports are.

inference-perf needs Python >= 3.12 (every release says so) and pins its own transformers, so it
lives in its own virtualenv, by default ``<harness cache>/inference-perf-venv``; ``--install``
creates it with a Python 3.12/3.13 found on PATH or under pyenv. Offline means: the tokenizer is a
local directory built once by ``build_tokenizer.py`` (no Hub download), and the tool runs with
``HF_HUB_OFFLINE=1``. inference-perf exits 0 even when every request failed, so success here is
read from its ``summary_lifecycle_metrics.json`` (no failures, at least one success).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from harness.base.binaries import cache_root
from harness.beds.stack import Stack, StackOptions
from harness.cluster.controlplane import ControlPlane

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "config.yml"
BUILD_TOKENIZER = HERE / "build_tokenizer.py"
PACKAGE = "inference-perf==0.7.0"
NAMESPACE = "perf"
SIM_PORT = 8000
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
STOP_TIMEOUT_S = 10.0


def default_venv() -> Path:
    return cache_root() / "inference-perf-venv"


def find_python312() -> Path | None:
    """A Python >= 3.12 interpreter: python3.13/python3.12 on PATH, else pyenv's versions."""
    for name in ("python3.13", "python3.12"):
        found = shutil.which(name)
        if found:
            return Path(found)
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = sorted((pyenv_root / "versions").glob("3.1[2-9]*/bin/python3"), reverse=True)
    return candidates[0] if candidates else None


def ensure_venv(venv: Path, install: bool) -> Path:
    """The ``inference-perf`` executable in ``venv``, creating the venv first if asked."""
    binary = venv / "bin" / "inference-perf"
    if binary.exists():
        return binary
    if not install:
        raise SystemExit(
            f"inference-perf is not installed at {venv}; run again with --install (needs Python >= 3.12"
            " and the package index; about 800 MB, 1-2 minutes), or give --venv"
        )
    python = find_python312()
    if python is None:
        raise SystemExit("inference-perf needs Python >= 3.12 and none was found on PATH or under pyenv")
    print(f"creating {venv} with {python} and installing {PACKAGE} ...", flush=True)
    subprocess.run([str(python), "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", PACKAGE], check=True)
    return binary


def ensure_tokenizer(venv: Path) -> Path:
    """A local Hugging Face tokenizer directory (built once, offline, into the harness cache)."""
    directory = cache_root() / "inference-perf-tokenizer"
    if not (directory / "tokenizer.json").exists():
        print(f"building a local tokenizer in {directory} (offline, once) ...", flush=True)
        env = {**os.environ, **OFFLINE_ENV}
        subprocess.run(
            [str(venv / "bin" / "python"), str(BUILD_TOKENIZER), str(directory)], check=True, env=env
        )
    return directory


def write_config(base_url: str, tokenizer: Path, out: Path) -> Path:
    config: dict[str, Any] = yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))
    config["server"]["base_url"] = base_url
    config["tokenizer"]["pretrained_model_name_or_path"] = str(tokenizer)
    config["storage"]["local_storage"]["path"] = str(out / "reports")
    path = out / "config.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def run_tool(binary: Path, config: Path, out: Path, timeout: float) -> int:
    """Run inference-perf (own process group: it forks workers) with its output in ``out``."""
    log = out / "inference-perf.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [str(binary), "--config_file", str(config)],
            cwd=out,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, **OFFLINE_ENV},
            start_new_session=True,
        )
        try:
            return process.wait(timeout=timeout)
        except BaseException:  # timeout or Ctrl-C: the whole group goes
            _kill_group(process)
            raise


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


def summarize(out: Path) -> tuple[bool, str]:
    """(passed, text) from the summary report: passed means no failure and at least one success."""
    found = sorted((out / "reports").rglob("summary_lifecycle_metrics.json"))
    if not found:
        return False, f"no summary_lifecycle_metrics.json under {out / 'reports'}"
    summary = json.loads(found[0].read_text(encoding="utf-8"))
    successes = summary.get("successes", {})
    failures = summary.get("failures", {})
    ok_count, failed = int(successes.get("count", 0)), int(failures.get("count", 0))
    lines = [f"requests: {ok_count} succeeded, {failed} failed"]
    latency = successes.get("latency", {})
    for key, label in (
        ("request_latency", "request latency"),
        ("time_to_first_token", "time to first token"),
        ("inter_token_latency", "inter-token latency"),
    ):
        values = latency.get(key)
        if isinstance(values, dict):
            lines.append(
                f"  {label:<22} p50 {1000 * values.get('median', 0):7.1f} ms"
                f"   p99 {1000 * values.get('p99', 0):7.1f} ms"
            )
    throughput = successes.get("throughput", {})
    if throughput:
        lines.append(
            f"  throughput: {throughput.get('requests_per_sec', 0):.1f} req/s, "
            f"{throughput.get('output_tokens_per_sec', 0):.0f} output tokens/s"
        )
    return ok_count > 0 and failed == 0, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--venv", type=Path, default=default_venv(), help="inference-perf's own virtualenv")
    parser.add_argument("--install", action="store_true", help="create that virtualenv if it is missing")
    parser.add_argument(
        "--output", type=Path, help="where config, log and reports go (default: a new temp dir)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="cap on the inference-perf run, seconds")
    args = parser.parse_args(argv)

    binary = ensure_venv(args.venv, args.install)
    tokenizer = ensure_tokenizer(args.venv)
    out = args.output or Path(tempfile.mkdtemp(prefix="inference-perf-"))
    out.mkdir(parents=True, exist_ok=True)
    print("starting the control plane and the demo stack (4 simulated pods, EPP, Envoy) ...", flush=True)
    with ControlPlane() as plane, Stack(plane.access, StackOptions(namespace=NAMESPACE)) as stack:
        assert stack.envoy is not None
        assert stack.cluster is not None
        config = write_config(stack.envoy.base_url, tokenizer, out)
        print(f"running inference-perf against {stack.base_url} (config {config}) ...", flush=True)
        began = time.monotonic()
        rc = run_tool(binary, config, out, args.timeout)
        print(f"inference-perf exited {rc} after {time.monotonic() - began:.1f} s", flush=True)
        pods = sorted(stack.cluster.pods.items())
        served = {name: pod.sim(SIM_PORT).requests_by_model() for name, pod in pods}
    passed, text = summarize(out)
    print(text)
    print("requests per pod, as the simulators counted them:")
    for name, by_model in served.items():
        print(f"  {name}: " + ", ".join(f"{model} {count}" for model, count in sorted(by_model.items())))
    print(f"reports, resolved config and the tool's log: {out}")
    if rc != 0 or not passed:
        print(f"FAILED (exit {rc}); last lines of {out / 'inference-perf.log'}:", file=sys.stderr)
        tail = (out / "inference-perf.log").read_text(encoding="utf-8", errors="replace").splitlines()[-30:]
        print("\n".join(tail), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
