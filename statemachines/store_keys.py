"""The byte layout of the views' keys that code without a database shares with the store: 8-byte
big-endian offsets (and times), the meta column family, the upper bound of a prefix scan.

Apart from statemachines/store.py so that what only encodes keys (the deadline index, session and
request ids, which the SDK uses too) loads no RocksDB: every CLI call and client process imports it.
"""

from __future__ import annotations

import struct

META = ""  # the default column family: meta keys
_OFFSET = struct.Struct(">q")


def encode_offset(offset: int) -> bytes:
    return _OFFSET.pack(offset)


def decode_offset(data: bytes) -> int:
    return int(_OFFSET.unpack(data)[0])


def prefix_upper_bound(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with `prefix` (None: no bound)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)
