"""Membership of a node's cluster: the address book and membership changes.

The configured members are every group's initial voters. The address book (peer and
client address of every member) is that list overlaid by the `member/<id>` records of the metadata
group's views (MemberAdded / MemberRemoved), so every node learns a member added at runtime as it
applies the record, durably, and keeps it across restarts and snapshots; the node follows the
metadata group and tells its peer transport (add_peer / remove_peer). A node outside the configured
list starts with its own addresses (`epochlog serve --peer-address ...`) and the configured initial
voters, so it never campaigns: it waits to be added.

Membership calls are served by the metadata leader, one node and one group at a time:

- list: the leader's address book and the metadata group's voters and learners (not_leader on any
  other node: its book can lag, and a node not yet added would list itself);
- add: refuse a node whose peer hello says it cannot apply the views format level of this node's groups
  (statemachines/views_format.py: it would read a snapshot of them as another level; one that has not
  connected within JOINER_HELLO_S is let in, with a WARNING, as before levels: it halts on the raise
  when it replays the log); record the node's addresses, then add it as a learner (auto-promoted to voter once caught up
  unless told otherwise) to the metadata group, then to every other group;
- promote: make the learner a voter in every group;
- remove: take it out of every group, the metadata group last, then record its removal (nodes stop
  dialing it and refuse it). The metadata leader removing itself first hands leadership over and
  answers not_leader, so the client retries at the new leader. Refused if the node is the last
  voter of a group; a removed group leader steps down once its removal commits.

Each group's change is made by that group's leader: the metadata leader makes the ones it leads and
forwards the others through the SDK with the call's `group` set (the SDK follows the group's
leader). A step already done is skipped, so retrying a call that failed half way finishes it.

Membership sees the node through its `LocalGroups`, the configured members, its own addresses and
the host's peer transport (None until the host starts).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from eventlog.cancellation import cancel_and_wait
from eventlog.errors import ConfigError, EpochlogError
from eventlog.raft.errors import ConfChangeError, NotFoundError, NotLeaderError
from eventlog.raft.node import Role
from eventlog.raft.runtime.config import MemberConfig, parse_address
from eventlog.raft.runtime.group import RaftGroup
from eventlog.raft.runtime.transport import PeerTransport
from eventlog.raft.types import ConfChange, ConfChangeKind, ConfState
from epochlog.api import messages as p
from epochlog.errors import InvalidArgumentError, RejectedError
from epochlog.local_groups import LocalGroups
from statemachines import events as ev
from statemachines import views_format
from statemachines.state import MemberState, Outcome, decode_state

if TYPE_CHECKING:
    from epochlog.client.tls import ClientTls

logger = logging.getLogger(__name__)

JOINER_HELLO_S = 3.0    # how long `add` waits for the new node's hello to learn its views format level
MEMBERSHIP_TIMEOUT_S = 60.0   # a whole membership call (the client's deadline usually ends it first)
MEMBERS_REFRESH_S = 0.05      # the address book is re-read at most this often under metadata writes


class Membership:
    """The address book of this node and the membership calls it serves (on its loop)."""

    def __init__(self, local: LocalGroups, configured: Sequence[MemberConfig], me: MemberConfig,
                 transport: Callable[[], PeerTransport | None],
                 client_tls: Callable[[], ClientTls | None] = lambda: None) -> None:
        self.local = local
        self._client_tls = client_tls   # what forwarded calls present (the member certificate)
        self._configured_members = tuple(configured)
        self._me = me
        self._transport = transport
        self.members: dict[int, p.MemberInfo] = self._configured()   # the address book
        self.removed: set[int] = set()   # nodes removed at runtime (tombstones in the metadata views)
        self._task: asyncio.Task[None] | None = None
        self._membership_lock: asyncio.Lock | None = None

    def start(self) -> None:
        self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._follow(), name="members")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    def list(self) -> p.Members:
        """The address book, and the voters and learners of the metadata group as this node sees them."""
        conf = self.local.group("metadata").node.conf
        return p.Members(self.sorted(), list(conf.voters), list(conf.learners))

    def leader_list(self) -> p.Members:
        """What `member_list` answers: the metadata leader's `list`, NotLeaderError on any other node.

        Another node's book can lag a change, and a node not yet added lists itself (it knows its own
        addresses): asked there, a client would take that for the cluster's membership.
        """
        self._require_leader("metadata")
        return self.list()

    def sorted(self) -> list[p.MemberInfo]:
        return [self.members[i] for i in sorted(self.members)]

    def _configured(self) -> dict[int, p.MemberInfo]:
        book = {m.id: p.MemberInfo(m.id, m.peer_address, m.client_address) for m in self._configured_members}
        me = self._me
        book[me.id] = p.MemberInfo(me.id, me.peer_address, me.client_address)
        return book

    def refresh(self) -> None:
        """Rebuild the address book from the config and the metadata views; sync the peer transport."""
        book = self._configured()
        removed: set[int] = set()
        for key, raw in self.local.views["metadata"].store.scan_prefix("members", b"member/"):
            state = decode_state(key, raw)
            assert isinstance(state, MemberState)
            if state.removed:
                book.pop(state.node_id, None)
                removed.add(state.node_id)
            elif state.node_id != self.local.node_id:   # this node's own addresses are those it was started with
                book[state.node_id] = p.MemberInfo(state.node_id, state.peer_address, state.client_address)
        self.members = book
        self.removed = removed
        transport = self._transport()
        if transport is None:
            return
        for node_id, info in book.items():
            if node_id != self.local.node_id:
                try:
                    transport.add_peer(node_id, parse_address(info.peer_address, f"member/{node_id}.peer_address"))
                except ConfigError as exc:
                    logger.error("cannot dial node %s: %s", node_id, exc)
        for node_id in removed:
            transport.remove_peer(node_id)

    async def _follow(self) -> None:
        group = self.local.group("metadata")
        while True:
            seen = group.sm.applied_index
            try:
                await group.wait_applied(seen + 1)
            except EpochlogError:
                return   # the group stopped
            self.refresh()
            await asyncio.sleep(MEMBERS_REFRESH_S)

    def _group_order(self, *, metadata_last: bool = False) -> tuple[str, ...]:
        others = tuple(g for g in self.local.groups() if g != "metadata")
        return (*others, "metadata") if metadata_last else ("metadata", *others)

    def _require_leader(self, name: str) -> RaftGroup:
        group = self.local.group(name)
        if group.node.role is not Role.LEADER:
            raise NotLeaderError(self.local.node_id, group.node.leader, group.node.term)
        return group

    async def _change_group(self, name: str, cc: ConfChange, timeout: float) -> ConfState:
        """One group's change, on its leader; a change already made is not an error (retries are safe)."""
        group = self._require_leader(name)
        if _done(group.node.conf, cc):
            return group.node.conf
        try:
            return await group.change_membership(cc, timeout)
        except ConfChangeError:
            if _done(group.node.conf, cc):   # e.g. an automatic promotion got there first
                return group.node.conf
            raise

    async def _change_everywhere(self, cc: ConfChange, call: p.MemberAdd | p.MemberPromote | p.MemberRemove,
                                 names: Sequence[str], deadline: float) -> None:
        """`cc` in each group of `names` in turn: here if this node leads it, else forwarded to its leader."""
        loop = asyncio.get_running_loop()
        client = None
        try:
            for name in names:
                group = self.local.group(name)
                if group.node.role is Role.LEADER:
                    try:
                        await self._change_group(name, cc, max(0.1, deadline - loop.time()))
                        continue
                    except NotLeaderError:
                        pass   # lost the leadership meanwhile: ask the new leader
                if client is None:
                    from epochlog.client.aio import AsyncClient

                    endpoints = [m.client_address for m in self.members.values() if m.client_address]
                    if not endpoints:
                        raise InvalidArgumentError(f"group {name} is led by another node and no client address is known")
                    client = AsyncClient(endpoints, timeout=max(1.0, deadline - loop.time()),
                                         name=f"epochlog-node-{self.local.node_id}", tls=self._client_tls())
                if isinstance(call, p.MemberAdd):
                    await client.member_add(call.node_id, call.peer_address, call.client_address,
                                            auto_promote=call.auto_promote, group=name)
                elif isinstance(call, p.MemberPromote):
                    await client.member_promote(call.node_id, group=name)
                else:
                    await client.member_remove(call.node_id, group=name)
        finally:
            if client is not None:
                await client.close()

    async def _record(self, event: ev.Event) -> None:
        """Commit a member record in the metadata group (this node leads it) and use it at once."""
        done = await self.local.group("metadata").submit([ev.event_record(event)])
        outcome = done.outcomes[0] if done.outcomes else None
        if isinstance(outcome, Outcome) and not outcome.ok:
            raise RejectedError(p.WriteResult(done.offset, "metadata", False, outcome.code, outcome.message))
        self.refresh()

    def _lock(self) -> asyncio.Lock:
        if self._membership_lock is None:
            self._membership_lock = asyncio.Lock()
        return self._membership_lock

    async def add(self, call: p.MemberAdd) -> p.Members:
        _check_node_id(call.node_id)
        cc = ConfChange(ConfChangeKind.ADD_LEARNER, call.node_id, call.auto_promote)
        if call.group:
            await self._change_group(call.group, cc, MEMBERSHIP_TIMEOUT_S)
            return self.list()
        parse_address(call.peer_address, "peer_address")
        if call.client_address:
            parse_address(call.client_address, "client_address")
        self._require_leader("metadata")
        deadline = asyncio.get_running_loop().time() + MEMBERSHIP_TIMEOUT_S
        if not any(g.node.conf.contains(call.node_id) for g in self.local.groups().values()):
            await self._check_views_format(call.node_id)
        async with self._lock():
            known = self.members.get(call.node_id)
            wanted = p.MemberInfo(call.node_id, call.peer_address, call.client_address)
            if known != wanted:
                if known is not None and any(g.node.conf.contains(call.node_id) for g in self.local.groups().values()):
                    raise InvalidArgumentError(f"node {call.node_id} is a member at {known.peer_address}: remove it before "
                                    f"adding it with other addresses")
                taken = {a: m.id for m in self.members.values() if m.id != call.node_id
                         for a in (m.peer_address, m.client_address) if a}
                for address in (call.peer_address, call.client_address):
                    if address in taken:
                        raise InvalidArgumentError(f"{address} is an address of node {taken[address]}")
                await self._record(ev.MemberAdded(node_id=call.node_id, peer_address=call.peer_address,
                                                  client_address=call.client_address, actor="epochlog/membership"))
            await self._change_everywhere(cc, call, self._group_order(), deadline)
        return self.list()

    async def _check_views_format(self, node_id: int) -> None:
        """ConfChangeError when `node_id`'s hello says it applies a lower views format level than this
        node's groups are at; waits JOINER_HELLO_S for its hello (a node added at runtime dials this one)."""
        level = max((v.views_format for v in self.local.views.values()), default=views_format.BASE)
        if level <= views_format.BASE:
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + JOINER_HELLO_S
        while True:
            transport = self._transport()
            features = None if transport is None else transport.peer_features(node_id)
            if features is not None or loop.time() >= until:
                break
            await asyncio.sleep(0.1)
        if features is None:
            logger.warning("member add: node %s has not connected to this node, so whether it applies views format "
                           "level %s is not known; a node that cannot halts its groups at the level's raise",
                           node_id, level)
            return
        supported = features.get(views_format.FEATURE, 0)
        if supported < level:
            raise ConfChangeError(f"node {node_id} applies views format level {supported or 1} at most, and this "
                                  f"cluster's groups are at level {level}: upgrade it before adding it "
                                  f"(docs/views.md, views format levels)")

    async def promote(self, call: p.MemberPromote) -> p.Members:
        _check_node_id(call.node_id)
        cc = ConfChange(ConfChangeKind.PROMOTE, call.node_id)
        if call.group:
            await self._change_group(call.group, cc, MEMBERSHIP_TIMEOUT_S)
            return self.list()
        self._require_leader("metadata")
        deadline = asyncio.get_running_loop().time() + MEMBERSHIP_TIMEOUT_S
        async with self._lock():
            await self._change_everywhere(cc, call, self._group_order(), deadline)
        return self.list()

    async def remove(self, call: p.MemberRemove) -> p.Members:
        _check_node_id(call.node_id)
        cc = ConfChange(ConfChangeKind.REMOVE, call.node_id)
        if call.group:
            await self._change_group(call.group, cc, MEMBERSHIP_TIMEOUT_S)
            return self.list()
        metadata = self._require_leader("metadata")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MEMBERSHIP_TIMEOUT_S
        if call.node_id not in self.members and not any(g.node.conf.contains(call.node_id)
                                                         for g in self.local.groups().values()):
            if call.node_id in self.removed:
                return self.list()   # a retry of a removal that completed
            raise NotFoundError(f"node {call.node_id} is not a member")
        for name, group in self.local.groups().items():
            if group.node.conf.voters == (call.node_id,):
                raise InvalidArgumentError(f"node {call.node_id} is the last voter of group {name}: add another first")
        if call.node_id == self.local.node_id:
            # Removing the metadata group's leader while it coordinates would cut it off from the rest of
            # the work: hand the leadership over first; the client retries at the new leader.
            await self._hand_off(metadata, deadline)
        async with self._lock():
            await self._change_everywhere(cc, call, self._group_order(metadata_last=True), deadline)
            await self._record(ev.MemberRemoved(node_id=call.node_id, actor="epochlog/membership"))
        return self.list()

    async def _hand_off(self, group: RaftGroup, deadline: float) -> None:
        """Transfer `group`'s leadership to its most caught-up other voter, then raise NotLeaderError."""
        n = group.node
        others = [v for v in n.conf.voters if v != self.local.node_id]
        if not others:
            raise InvalidArgumentError(f"node {self.local.node_id} is the last voter of group {group.name}")
        target = max(others, key=lambda v: n.progress[v].match if v in n.progress else -1)
        group.transfer_leadership(target)
        loop = asyncio.get_running_loop()
        give_up = min(deadline, loop.time() + 5.0)
        while group.node.role is Role.LEADER and loop.time() < give_up:
            await asyncio.sleep(group.tick_interval)
        raise NotLeaderError(self.local.node_id, group.node.leader or target, group.node.term)


def _done(conf: ConfState, cc: ConfChange) -> bool:
    """Whether `conf` already has what `cc` asks for."""
    if cc.kind in (ConfChangeKind.ADD_LEARNER, ConfChangeKind.ADD_VOTER):
        return conf.contains(cc.node)
    if cc.kind is ConfChangeKind.PROMOTE:
        return cc.node in conf.voters
    return not conf.contains(cc.node)


def _check_node_id(node_id: int) -> None:
    if node_id <= 0:
        raise InvalidArgumentError(f"node ids are positive integers, got {node_id}")
