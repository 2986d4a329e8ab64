"""The pipe protocol between `BodyScanner` and its child (`epp.body.worker`).

Request: a 4-byte big-endian length, then that many body bytes. Reply: a header `!cII` (kind, length
of a JSON part, length of a bytes part), then the two parts. Kind `o`: the JSON part is
{"model", "start", "end", "prompt"}, the bytes part the UTF-8 transcoding (empty when the body already was
UTF-8). Kind `e`: the JSON part is {"message"} of a `BadRequest`.
"""

from __future__ import annotations

import struct

REQUEST_HEADER = struct.Struct("!I")
REPLY_HEADER = struct.Struct("!cII")
OK = b"o"
REFUSED = b"e"
