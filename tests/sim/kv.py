"""The test state machine: a KV register per key, plus the membership it has applied.

Client operations travel in NORMAL entries as `encode_op(...)` bytes. Applying an entry changes
the map and returns the operation's output (put -> None, cas -> bool, get -> current value), which
the client sees once its proposal is applied. CONF_CHANGE entries change `conf`, so that a snapshot
taken at `applied` carries the membership in force at that index (what `create_snapshot` needs).
NOOP entries change nothing.

`digest()` identifies the whole state (map and membership): every replica that applied through the
same index must report the same digest (checked by `checkers.StateDigest`).

Not thread-safe; owned by one `Replica`.
"""

from __future__ import annotations

import hashlib

import msgspec

from eventlog.raft.confchange import apply_conf_change, decode_conf_change
from eventlog.raft.types import ConfState, Entry, EntryKind, SnapshotMeta

# An operation on the wire: [op_id, kind, key, a, b]; put: a = value; cas: a = expected, b = new.
_OpTuple = tuple[int, str, str, int | None, int | None]
_op_encoder = msgspec.msgpack.Encoder()
_op_decoder = msgspec.msgpack.Decoder(_OpTuple)
_snap_decoder = msgspec.msgpack.Decoder(tuple[list[tuple[str, int]], bytes])


def encode_op(op_id: int, kind: str, key: str, a: int | None = None, b: int | None = None) -> bytes:
    return _op_encoder.encode((op_id, kind, key, a, b))


def decode_op(data: bytes) -> _OpTuple:
    return _op_decoder.decode(data)


class KVStateMachine:
    def __init__(self, conf: ConfState, applied: int = -1, data: dict[str, int] | None = None) -> None:
        self.data: dict[str, int] = dict(data or {})
        self.conf = conf
        self.applied = applied

    @classmethod
    def from_snapshot(cls, meta: SnapshotMeta, blob: bytes) -> KVStateMachine:
        if meta.index < 0:
            return cls(meta.conf)
        items, _padding = _snap_decoder.decode(blob)
        return cls(meta.conf, meta.index, dict(items))

    def snapshot_bytes(self, padding: int) -> bytes:
        """The state as snapshot content; `padding` extra bytes make it span more chunks."""
        return _op_encoder.encode((sorted(self.data.items()), b"\x00" * padding))

    def apply(self, entry: Entry) -> int | bool | None:
        assert entry.index == self.applied + 1, f"applying {entry.index} after {self.applied}"
        self.applied = entry.last_index
        if entry.kind is EntryKind.CONF_CHANGE:
            self.conf = apply_conf_change(self.conf, decode_conf_change(entry.data))
            return None
        if entry.kind is EntryKind.NOOP:
            return None
        _op_id, kind, key, a, b = decode_op(entry.data)
        current = self.data.get(key)
        if kind == "put":
            assert a is not None
            self.data[key] = a
            return None
        if kind == "cas":
            assert b is not None
            if current == a:
                self.data[key] = b
                return True
            return False
        assert kind == "get", kind
        return current

    def get(self, key: str) -> int | None:
        return self.data.get(key)

    def digest(self) -> bytes:
        blob = _op_encoder.encode((sorted(self.data.items()), self.conf))
        return hashlib.blake2b(blob, digest_size=12).digest()
