"""``harness up --with-epp``: the demo's environment stays up, is reachable as printed, stops on Ctrl-C."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from typing import IO

import openai
import pytest

from .test_demo import MARKER_VAR, processes_with_marker

pytestmark = pytest.mark.e2e

START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0
BASE_URL_PREFIX = "export OPENAI_BASE_URL="


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def test_up_with_epp_serves_the_printed_base_url_until_sigint() -> None:
    marker = uuid.uuid4().hex
    process = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "up", "--with-epp"],
        env={**os.environ, MARKER_VAR: marker},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        base_url = None
        while base_url is None:
            line = lines.get(timeout=START_TIMEOUT_S)
            assert line is not None, "harness up exited before printing the base URL:\n" + "".join(seen)
            seen.append(line)
            if line.startswith(BASE_URL_PREFIX):
                base_url = line.removeprefix(BASE_URL_PREFIX).strip()

        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60) as client:
            completion = client.completions.create(model="food-review", prompt="Review: fine.", max_tokens=4)
        assert completion.model in {"food-review-1", "food-review-2"}
        assert completion.choices[0].text

        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=STOP_TIMEOUT_S) == 0
    finally:
        if process.poll() is None:  # only when an assertion above failed: stop it the polite way first
            process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        reader.join(timeout=10)
        process.stdout.close()
    rest = []
    while (line := lines.get_nowait()) is not None:
        rest.append(line)
    output = "".join(seen + rest)
    assert "kubeconfig:" in output
    assert "kubectl:" in output
    assert "summaries-batch" in output
    assert processes_with_marker(marker) == [], output
