"""The service-account token file: re-read when it changes, a read error retried and never fatal.

Bound ServiceAccount tokens are rotated by the kubelet (an atomic swap of the projected volume's
`..data` link); a read that fails meanwhile must not take the informer, and with it the EPP, down
(DESIGN.md §6).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from epp.api import PodObject
from epp.k8s.backoff import BackoffPolicy
from epp.k8s.client import PODS, KubeClient
from epp.k8s.config import KubeConfig, TokenFile
from epp.k8s.errors import KubeConnectionError
from epp.k8s.informer import Informer
from harness.base.eventually import eventually_async
from harness.cluster.builders import PodBuilder

from .fake_apiserver import POD_PATH, FakeApiServer
from .support import WAIT, RecordingSleep, run

NO_JITTER = BackoffPolicy(initial=0.5, maximum=4.0, factor=2.0, jitter=0.0)


def swap_in(token_dir: Path, token: str) -> None:
    """What the kubelet does: write a new file, then rename it over the old one (a new inode)."""
    fresh = token_dir / ".token.new"
    fresh.write_text(token + "\n")
    os.replace(fresh, token_dir / "token")


def test_a_token_read_error_is_retried_and_never_kills_the_informer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The list is retried with backoff like any unreachable API server, and the warning says why."""
    token = tmp_path / "token"  # not there yet: every request fails to read it

    async def main() -> None:
        async with FakeApiServer() as server:
            server.upsert(POD_PATH, PodBuilder("p1").namespace("ns1").ready("10.0.0.1").build())
            config = KubeConfig(server=server.url, ssl_context=None, token_file=str(token))
            async with KubeClient(config) as client:
                sleep = RecordingSleep()
                informer = Informer(client, PODS, "ns1", PodObject.from_api, backoff=NO_JITTER, sleep=sleep)
                task = asyncio.create_task(informer.run(), name="test-informer")
                try:

                    async def backing_off() -> None:
                        assert not task.done(), "the informer died on a token read error"
                        assert len(sleep.delays) >= 3, sleep.delays

                    await eventually_async(backing_off, timeout=WAIT)
                    assert server.requests == []  # nothing was sent without a token
                    swap_in(tmp_path, "t1")
                    await asyncio.wait_for(informer.wait_synced(), WAIT)
                    assert [p.key.name for p in informer.objects()] == ["p1"]
                    assert server.requests[-1].headers["Authorization"] == "Bearer t1"
                finally:
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task

    with caplog.at_level(logging.WARNING, logger="epp.k8s.informer"):
        run(main)
    gone = f"[Errno 2] No such file or directory: '{token}'"
    first = next(r.getMessage() for r in caplog.records if r.name == "epp.k8s.informer")
    assert first == (
        f"pods/ns1: list failed: cannot read the bearer token file {token}: {gone}; "
        "retrying in 0.50s (failure 1)"
    )


def test_a_rotated_token_is_used_for_the_next_request(tmp_path: Path) -> None:
    swap_in(tmp_path, "t1")
    source = TokenFile(str(tmp_path / "token"))
    assert source.read() == "t1"
    swap_in(tmp_path, "t2")
    assert source.read() == "t2"


def test_an_unreadable_token_keeps_the_last_one_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A read that fails mid-rotation (the file briefly gone) keeps the still-valid previous token."""
    swap_in(tmp_path, "t1")
    source = TokenFile(str(tmp_path / "token"))
    assert source.read() == "t1"
    (tmp_path / "token").unlink()
    with caplog.at_level(logging.INFO, logger="epp.k8s.config"):
        assert source.read() == "t1"
        assert caplog.records, "the first failed read warns at once"
        assert source.read() == "t1"
        swap_in(tmp_path, "t3")
        assert source.read() == "t3"
        (tmp_path / "token").unlink()
        assert source.read() == "t3"  # a second streak warns again
    gone = f"[Errno 2] No such file or directory: '{tmp_path / 'token'}'"
    warning = f"cannot re-read the bearer token file {tmp_path / 'token'} ({gone}); using the last token read"
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", warning),  # once per failure streak, not per request
        ("INFO", f"bearer token file {tmp_path / 'token'} readable again"),
        ("WARNING", warning),
    ]


def test_an_unchanged_file_is_not_read_again(tmp_path: Path) -> None:
    """One stat per request, a read only when the file's inode, size or time changed: the content of
    a file whose stamp is unchanged is the token already held."""
    swap_in(tmp_path, "t1")
    token = tmp_path / "token"
    source = TokenFile(str(token))
    assert source.read() == "t1"
    stamp = token.stat()
    with token.open("r+") as f:  # same inode, same size
        f.write("t9")
    os.utime(token, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert source.read() == "t1"
    os.utime(token, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1))
    assert source.read() == "t9"


def test_a_token_never_read_is_a_retryable_error(tmp_path: Path) -> None:
    source = TokenFile(str(tmp_path / "missing"))
    with pytest.raises(KubeConnectionError, match="missing"):
        source.read()


def test_the_first_read_says_nothing_and_the_first_failure_after_it_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A token file not there yet (the kubelet has not written it) is an error for the caller, not a
    failure streak: its first good read logs no "readable again", and the first read to fail after
    a good one warns."""
    token = tmp_path / "token"
    with caplog.at_level(logging.INFO, logger="epp.k8s.config"):
        source = TokenFile(str(token))
        with pytest.raises(KubeConnectionError):
            source.read()
        swap_in(tmp_path, "t1")
        assert source.read() == "t1"
        assert caplog.records == [], "a first good read is nothing to report"
        token.unlink()
        assert source.read() == "t1"
    gone = f"[Errno 2] No such file or directory: '{token}'"
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"cannot re-read the bearer token file {token} ({gone}); using the last token read")
    ]
