"""Request bodies: one scan for validity and `model`, a splice for the rewrite, big ones off the loop.

`scan_body` and `with_model` are pure (table-testable); `BodyScanner` decides where a scan runs. The
package imports nothing heavy, because `epp.body.worker` runs it in a child process.
"""

from epp.body.offload import DEFAULT_OFFLOAD_BYTES, BodyScanner
from epp.body.scan import ScannedBody, scan_body, with_model

__all__ = ["DEFAULT_OFFLOAD_BYTES", "BodyScanner", "ScannedBody", "scan_body", "with_model"]
