"""``python -m harness.sim --host 127.0.0.5 --port 8000 --model base --lora a,b`` (``harness.sim._cli``)."""

from __future__ import annotations

import sys

from harness.sim._cli import main

if __name__ == "__main__":
    sys.exit(main())
