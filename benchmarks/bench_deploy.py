"""`harness up --deploy` to the first request routed through Envoy: the EPP pods as processes (the
Containerfile's ENTRYPOINT from this virtualenv) vs as containers of the image we ship (`--containers`).

Each round runs the real command as a user does, `harness up --deploy [--containers]`, in a child
process, and times from its start: every line it prints (the engine, the EPP image, the plane, the
chart), then requests to the `OPENAI_BASE_URL` it prints until one is answered 200 (the first routed
request); then Ctrl-C (SIGINT) and the time until it has stopped everything. The modes alternate,
so the machine's load falls on both alike. The container mode is measured warm (the images already
built: run `benchmarks/bench_images.py` or the container tier once first); its first lines say
whether the image was present, loaded or built.

    .venv/bin/python benchmarks/bench_deploy.py [--rounds 2] [--modes process,container]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import requests

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TIMEOUT_S = 900.0
HARNESS = Path(sys.executable).parent / "harness"
_MARKS = {
    "engine": "container engine:",
    "image": "EPP image:  ",
    "chart": "installing deploy/chart",
    "printed": "export OPENAI_BASE_URL=",
}


def _lines(stream: IO[str], began: float, seen: dict[str, float], out: list[str]) -> None:
    for line in stream:
        out.append(line.rstrip())
        for mark, prefix in _MARKS.items():
            if line.startswith(prefix) and mark not in seen:
                seen[mark] = time.monotonic() - began


def one_round(mode: str) -> dict[str, float]:
    command = [str(HARNESS), "up", "--deploy", *(["--containers"] if mode == "container" else [])]
    env = {k: v for k, v in os.environ.items() if k != "EPP_HARNESS_CONTAINERS"}
    began = time.monotonic()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen: dict[str, float] = {}
    output: list[str] = []
    assert child.stdout is not None
    reader = threading.Thread(target=_lines, args=(child.stdout, began, seen, output), daemon=True)
    reader.start()
    try:
        deadline = began + TIMEOUT_S
        while "printed" not in seen:
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"harness up --deploy ({mode}) did not come up:\n" + "\n".join(output[-40:])
                )
            time.sleep(0.05)
        base_url = next(
            m[1] for line in output if (m := re.search(r"OPENAI_BASE_URL=(\S+)", line)) is not None
        )
        body = {"model": MODEL, "prompt": "first", "max_tokens": 1}
        while True:
            try:
                if requests.post(f"{base_url}/completions", json=body, timeout=30).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no request routed ({mode})")
            time.sleep(0.02)
        seen["routed"] = time.monotonic() - began
        image = next((line for line in output if line.startswith(_MARKS["image"])), "")
        if image:
            print(f"  {image.strip()}")
    finally:
        stopping = time.monotonic()
        if child.poll() is None:
            child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=300)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        seen["stop"] = time.monotonic() - stopping
        reader.join(timeout=10)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="process,container")
    args = parser.parse_args()
    modes = args.modes.split(",")
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    for index in range(args.rounds):
        for mode in modes:
            figures = one_round(mode)
            results[mode].append(figures)
            steps = ", ".join(f"{k} {v:.1f} s" for k, v in figures.items() if k not in ("routed", "stop"))
            print(f"round {index + 1} {mode:9}: first routed request {figures['routed']:.1f} s "
                  f"after `harness up --deploy` started ({steps}); Ctrl-C to stopped {figures['stop']:.1f} s",
                  flush=True)  # fmt: skip
    print()
    for mode, rounds in results.items():
        routed = [r["routed"] for r in rounds]
        stops = [r["stop"] for r in rounds]
        each = " / ".join(f"{v:.1f}" for v in routed)
        print(f"{mode:9}: up --deploy -> first routed request median {statistics.median(routed):.1f} s "
              f"({each}); stop median {statistics.median(stops):.1f} s")  # fmt: skip
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
