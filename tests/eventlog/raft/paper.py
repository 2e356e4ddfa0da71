"""Helpers for the paper tests: build a `RaftNode` over a `MemoryStorage`, handle its Readys as the
application would, and hand-craft the messages of its peers.

The paper tests drive one node at a time and play its peers by hand (etcd raft's paper tests do
the same), so each test shows exactly which messages go in and which come out.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import TypeVar

from eventlog.raft import (
    ConfState,
    Entry,
    EntryKind,
    HardState,
    MemoryStorage,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
)
from eventlog.raft.types import Append, AppendResp, Message, PreVoteResp, VoteResp

Msgs = list[Message]
M = TypeVar("M")


def config(**kw: object) -> RaftConfig:
    """The basic algorithm of the paper unless a test turns an extension on: no pre-vote, no
    check-quorum, election timeout 10 ticks, heartbeat every tick; the commit broadcast on, as the
    tests' message counts were written with it."""
    base: dict[str, object] = {"election_timeout_ticks": 10, "heartbeat_interval_ticks": 1,
                               "pre_vote": False, "check_quorum": False, "commit_broadcast": True}
    base.update(kw)
    return RaftConfig(**base)  # type: ignore[arg-type]


def log_of(spec: Sequence[int | tuple[int, int]]) -> list[Entry]:
    """Entries from a list of terms (one index each) or (term, count) batches, from index 0."""
    out: list[Entry] = []
    index = 0
    for item in spec:
        term, count = (item, 1) if isinstance(item, int) else item
        out.append(Entry(index=index, term=term, count=count, data=f"{term}@{index}".encode()))
        index += count
    return out


def storage(voters: Iterable[int] = (1, 2, 3), learners: Iterable[int] = (), *, entries: Sequence[Entry] = (),
            term: int = 0, vote: int = 0, commit: int = -1) -> MemoryStorage:
    st = MemoryStorage(ConfState(voters=tuple(voters), learners=tuple(learners)))
    st.append(list(entries))
    st.set_hard_state(HardState(term=term, vote=vote, commit=commit))
    return st


def node(nid: int = 1, st: MemoryStorage | None = None, *, seed: int | None = None, **cfg: object) -> RaftNode:
    return RaftNode(nid, st if st is not None else storage(), config(**cfg),
                    random.Random(nid if seed is None else seed))


def handle(n: RaftNode) -> Ready | None:
    """Handle one Ready of `n` as the application must (persist, then advance); None if none."""
    if not n.has_ready():
        return None
    rd = n.ready()
    st = n.log.storage
    assert isinstance(st, MemoryStorage)
    for c in rd.snapshot_chunks:
        st.stage_snapshot_chunk(c.meta, c.offset, c.data)
    if rd.snapshot is not None:
        st.install_snapshot(rd.snapshot)
    if rd.entries:
        st.append(rd.entries)
    if rd.hard_state is not None:
        st.set_hard_state(rd.hard_state)
    n.advance()
    return rd


def drain(n: RaftNode) -> Msgs:
    """Handle every pending Ready of `n`; the messages it sent, in order."""
    out: Msgs = []
    while (rd := handle(n)) is not None:
        out += [*rd.send_now, *rd.send_after]
    return out


def committed_entries(n: RaftNode) -> list[Entry]:
    """Handle every pending Ready of `n`; the entries it handed out for applying."""
    out: list[Entry] = []
    while (rd := handle(n)) is not None:
        out += rd.committed
    return out


def of(msgs: Iterable[Message], kind: type[M], dst: int | None = None) -> list[M]:
    """The messages of type `kind` (to `dst`, if given), in order."""
    return [m for m in msgs if isinstance(m, kind) and (dst is None or m.dst == dst)]


def user_entries(entries: Iterable[Entry]) -> list[Entry]:
    return [e for e in entries if e.kind is EntryKind.NORMAL]


def elect(n: RaftNode) -> Msgs:
    """Make `n` win an election with the (granted) votes of its fellow voters; returns what the new
    leader sent (its no-op appends)."""
    n.campaign()
    drain(n)
    others = [v for v in n.conf.voters if v != n.id]
    if n.role is Role.PRE_CANDIDATE:
        for v in others:
            if n.role is not Role.PRE_CANDIDATE:
                break
            n.step(PreVoteResp(term=n.term + 1, src=v, dst=n.id, granted=True))
        drain(n)
    for v in others:
        if n.role is Role.LEADER:
            break
        n.step(VoteResp(term=n.term, src=v, dst=n.id, granted=True))
    assert n.role is Role.LEADER, n
    return drain(n)


def ack(n: RaftNode, msgs: Msgs, frm: Iterable[int], *, handle_readies: bool = True) -> Msgs:
    """Followers `frm` accept the appends in `msgs` addressed to them; returns what `n` sends then
    (with `handle_readies=False`, leaves the Readys pending and returns nothing)."""
    frm = set(frm)
    for m in msgs:
        if isinstance(m, Append) and m.dst in frm:
            last = m.entries[-1].last_index if m.entries else m.prev_index
            n.step(AppendResp(term=m.term, src=m.dst, dst=m.src, index=last))
    return drain(n) if handle_readies else []
