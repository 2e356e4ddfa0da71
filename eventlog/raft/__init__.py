"""Raft consensus: the sans-IO core (`RaftNode`), its storage protocol and value types."""

from eventlog.raft.config import RaftConfig
from eventlog.raft.errors import (
    CompactedError,
    ConfChangeError,
    NotLeaderError,
    ProposalDroppedError,
    RaftError,
    UnavailableError,
)
from eventlog.raft.node import (
    CampaignLost,
    CampaignReason,
    CampaignStarted,
    ElectionEvent,
    RaftNode,
    Ready,
    ReadState,
    Role,
    SnapshotChunk,
    SoftState,
    StepDownReason,
    SteppedDown,
    VoteCast,
)
from eventlog.raft.storage import MemoryStorage, Storage
from eventlog.raft.types import (
    ConfChange,
    ConfChangeKind,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Message,
    SnapshotMeta,
)

__all__ = [
    "CampaignLost", "CampaignReason", "CampaignStarted", "ElectionEvent", "StepDownReason", "SteppedDown", "VoteCast",
    "CompactedError", "ConfChange", "ConfChangeError", "ConfChangeKind", "ConfState", "Entry", "EntryKind",
    "HardState", "MemoryStorage", "Message", "NotLeaderError", "ProposalDroppedError", "RaftConfig", "RaftError",
    "RaftNode", "ReadState", "Ready", "Role", "SnapshotChunk", "SnapshotMeta", "SoftState", "Storage",
    "UnavailableError",
]
