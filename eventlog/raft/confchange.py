"""Single-server membership changes (Raft thesis §4.1), as a pure function over ConfState.

Only one node is added, promoted or removed at a time, so any two consecutive configurations
have overlapping majorities and no joint consensus is needed. The node takes care of the rest of
the protocol: a change takes effect when its entry is appended (not committed), a leader accepts a
change only after committing an entry in its own term (the fix for the single-server change bug
Ongaro described in 2015) and only when no other change is uncommitted.
"""

from __future__ import annotations

import msgspec

from eventlog.raft.errors import ConfChangeError
from eventlog.raft.types import ConfChange, ConfChangeKind, ConfState

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ConfChange)


def encode_conf_change(cc: ConfChange) -> bytes:
    return _encoder.encode(cc)


def decode_conf_change(data: bytes) -> ConfChange:
    return _decoder.decode(data)


def apply_conf_change(conf: ConfState, cc: ConfChange) -> ConfState:
    """The configuration after `cc`; ConfChangeError when `cc` does not apply to `conf`."""
    voters, learners, auto = set(conf.voters), set(conf.learners), set(conf.auto_promote)
    node = cc.node
    if node <= 0:
        raise ConfChangeError(f"node ids are positive integers, got {node}")
    if cc.kind is ConfChangeKind.ADD_VOTER:
        if node in voters:
            raise ConfChangeError(f"node {node} is already a voter")
        if node in learners:
            raise ConfChangeError(f"node {node} is a learner: promote it instead")
        voters.add(node)
    elif cc.kind is ConfChangeKind.ADD_LEARNER:
        if node in voters or node in learners:
            raise ConfChangeError(f"node {node} is already a member")
        learners.add(node)
        if cc.auto_promote:
            auto.add(node)
    elif cc.kind is ConfChangeKind.PROMOTE:
        if node not in learners:
            raise ConfChangeError(f"node {node} is not a learner")
        learners.discard(node)
        auto.discard(node)
        voters.add(node)
    elif cc.kind is ConfChangeKind.REMOVE:
        if node not in voters and node not in learners:
            raise ConfChangeError(f"node {node} is not a member")
        if voters == {node}:
            raise ConfChangeError(f"node {node} is the last voter")
        voters.discard(node)
        learners.discard(node)
        auto.discard(node)
    else:
        raise ConfChangeError(f"unknown change {cc.kind!r}")
    return ConfState(voters=tuple(sorted(voters)), learners=tuple(sorted(learners)),
                     auto_promote=tuple(sorted(auto)))
