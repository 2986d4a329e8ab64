"""HTTP I/O of the prober: GET one pod's /metrics page, nothing else.

All pods share one aiohttp session so connections are kept alive between scrapes (a new TCP
connection 20 times a second per pod would cost more than the parse). The session belongs to
whoever creates it (the server's supervisor, or a test), which also closes it; `MetricsFetcher`
never closes what it did not open. Each request has its own timeout, so one hanging pod only ever
blocks its own refresher.
"""

from __future__ import annotations

import aiohttp

from epp.config import DEFAULT_SCRAPE_TIMEOUT

METRICS_PATH = "/metrics"
# Idle keep-alive connections are dropped after this long; well above the 50 ms scrape period.
KEEPALIVE_TIMEOUT = 30.0


class ScrapeError(Exception):
    """A scrape that produced no page: non-200 status, timeout, or connection failure."""


def new_scrape_session() -> aiohttp.ClientSession:
    """A session suited to probing many pods; call on the event loop, close it with `await .close()`.

    No total connection limit (aiohttp's default of 100 would queue scrapes once a pool has more than
    100 pods); one connection per pod is all a refresher ever uses. No environment proxies, no cookies.
    """
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_TIMEOUT)
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        auto_decompress=True,
    )


class MetricsFetcher:
    def __init__(self, session: aiohttp.ClientSession, timeout: float = DEFAULT_SCRAPE_TIMEOUT) -> None:
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def fetch(self, address: str, port: int) -> str:
        """The page text of `http://address:port/metrics`; raises ScrapeError on any failure."""
        url = metrics_url(address, port)
        try:
            async with self._session.get(url, timeout=self._timeout) as resp:
                if resp.status != 200:
                    raise ScrapeError(f"GET {url}: HTTP {resp.status}")
                body = await resp.read()
        except TimeoutError as exc:
            raise ScrapeError(f"GET {url}: timed out") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise ScrapeError(f"GET {url}: {exc or type(exc).__name__}") from exc
        return body.decode("utf-8", errors="replace")


def metrics_url(address: str, port: int) -> str:
    """IPv6 pod IPs need brackets in a URL."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}{METRICS_PATH}"
