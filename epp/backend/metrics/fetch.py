"""HTTP I/O of the prober: GET one pod's /metrics page, nothing else.

All pods share one aiohttp session so connections are kept alive between scrapes (a new TCP
connection 20 times a second per pod would cost more than the parse). The session belongs to
whoever creates it (the server's supervisor, or a test), which also closes it; `MetricsFetcher`
never closes what it did not open. Each request has its own timeout, so one hanging pod only ever
blocks its own refresher.
"""

from __future__ import annotations

import aiohttp

from epp.config import DEFAULT_METRICS_PATH, DEFAULT_METRICS_SCHEME, DEFAULT_SCRAPE_TIMEOUT

METRICS_PATH = DEFAULT_METRICS_PATH
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
    """GET `scheme://address:port/path` (`--model-server-metrics-*` or the config file's
    `metrics-data-source`); with https, `insecure_skip_verify` (upstream's default) skips
    certificate checks, as model servers mostly serve self-signed ones."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        timeout: float = DEFAULT_SCRAPE_TIMEOUT,
        *,
        scheme: str = DEFAULT_METRICS_SCHEME,
        path: str = METRICS_PATH,
        insecure_skip_verify: bool = True,
    ) -> None:
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._scheme = scheme
        self._path = path
        # aiohttp: False skips verification, True verifies with the default context.
        self._ssl = not (scheme == "https" and insecure_skip_verify)

    async def fetch(self, address: str, port: int) -> str:
        """The page text of `scheme://address:port/path`; raises ScrapeError on any failure."""
        url = metrics_url(address, port, scheme=self._scheme, path=self._path)
        try:
            async with self._session.get(url, timeout=self._timeout, ssl=self._ssl) as resp:
                if resp.status != 200:
                    raise ScrapeError(f"GET {url}: HTTP {resp.status}")
                body = await resp.read()
        except TimeoutError as exc:
            raise ScrapeError(f"GET {url}: timed out") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise ScrapeError(f"GET {url}: {exc or type(exc).__name__}") from exc
        return body.decode("utf-8", errors="replace")


def metrics_url(
    address: str, port: int, *, scheme: str = DEFAULT_METRICS_SCHEME, path: str = METRICS_PATH
) -> str:
    """IPv6 pod IPs need brackets in a URL."""
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}{path}"
