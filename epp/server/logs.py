"""Log output for the entry point: zap-like JSON lines (`--zap-encoder json`) or readable console lines.

Upstream's manifests ask for `--zap-encoder json`, so log pipelines that parse the Go EPP's lines get
the same keys here: `level` (lower case), `ts` (epoch seconds), `logger`, `msg`, plus `error` with
the traceback when one is attached.
"""

from __future__ import annotations

import json
import logging
from typing import TextIO

CONSOLE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "level": record.levelname.lower(),
            "ts": record.created,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: int, encoder: str, stream: TextIO) -> None:
    """Root logging for the process: one handler on `stream`, in the chosen encoding."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if encoder == "json" else logging.Formatter(CONSOLE_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
