"""What the node's services see of the node: its Raft groups and their views, nothing else.

Membership, halts and the digest check are given a `LocalGroups` (and the few callables each needs
besides) by `Node`, as `CompactionService` and the controller are given theirs, so none of them
imports `Node` and none reaches into its host: the node builds on them, not the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from eventlog.raft.runtime.group import RaftGroup
from epochlog.errors import InvalidArgumentError
from statemachines.views import ViewsStateMachine


@dataclass(frozen=True, slots=True)
class LocalGroups:
    """This node's groups (`groups()`: the host's, once started) and their views (`views`: the node's
    live map; a snapshot install replaces a group's store, so read `views[name].store` when used).
    Call from the node's loop."""

    node_id: int
    groups: Callable[[], Mapping[str, RaftGroup]]
    views: Mapping[str, ViewsStateMachine]

    def group(self, name: str) -> RaftGroup:
        """The group `name`; InvalidArgumentError when this node has no such group."""
        groups = self.groups()
        group = groups.get(name)
        if group is None:
            raise InvalidArgumentError(f"no group {name!r} (groups: {', '.join(groups)})")
        return group
