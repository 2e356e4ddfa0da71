"""Configuration of one Raft group (`[raft]` in the node's TOML file). Time is counted in ticks."""

from __future__ import annotations

from dataclasses import dataclass, field

from eventlog.configuration import doc
from eventlog.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Timing, flow control and feature switches of the consensus core.

    The node runtime turns ticks into time (`tick_interval_ms` in the node's config). Election
    timeouts are drawn uniformly from [election_timeout_ticks, 2 * election_timeout_ticks).
    """

    election_timeout_ticks: int = field(default=10, metadata=doc(
        "Base election timeout; a follower that hears no leader for a random timeout in [E, 2E) campaigns.",
        min=2, max=100_000))
    heartbeat_interval_ticks: int = field(default=2, metadata=doc(
        "A leader sends heartbeats this often; must be below election_timeout_ticks. Each heartbeat and its "
        "answer is a message of every group a node leads or follows, idle or not (2: etcd's 100 ms with "
        "50 ms ticks, half the idle messages of 1).", min=1, max=100_000))
    pre_vote: bool = field(default=True, metadata=doc(
        "Ask for votes without raising the term first (thesis §9.6): a partitioned node cannot disrupt."))
    check_quorum: bool = field(default=True, metadata=doc(
        "A leader that has not heard from a majority within an election timeout steps down; followers "
        "that heard from a leader within the timeout refuse to vote for others."))
    max_inflight_appends: int = field(default=64, metadata=doc(
        "Append messages in flight to one follower before waiting for acknowledgements.", min=1, max=1_000_000))
    max_inflight_bytes: int = field(default=8 << 20, metadata=doc(
        "Entry bytes in flight to one follower before waiting for acknowledgements.", min=1))
    max_append_bytes: int = field(default=1 << 20, metadata=doc(
        "Entry bytes per append message (at least one entry is always sent).", min=1))
    max_uncommitted_bytes: int = field(default=64 << 20, metadata=doc(
        "Bytes of proposals a leader holds uncommitted before refusing new ones (back pressure).", min=1))
    snapshot_chunk_bytes: int = field(default=1 << 20, metadata=doc(
        "Bytes per InstallSnapshot chunk.", min=1))
    lease_drift_ticks: int = field(default=1, metadata=doc(
        "Clock-drift allowance for lease reads: a lease lasts election_timeout_ticks minus this many "
        "ticks from the moment the heartbeat that confirmed it was sent.", min=0, max=100_000))
    commit_broadcast: bool = field(default=False, metadata=doc(
        "true: a leader tells followers a new commit index at once, in appends of their own. false: with "
        "the next append or heartbeat (at most heartbeat_interval_ticks later): half the messages per write "
        "when writes come one at a time, and less CPU per write; followers apply, and serve `local` reads, "
        "that much later (log reads at a follower ask the leader for the commit index: docs/raft.md)."))
    learner_catch_up_entries: int = field(default=0, metadata=doc(
        "An auto-promoted learner is promoted once it is within this many indexes of the leader's commit.",
        min=0))

    def validate(self, section: str = "raft") -> None:
        if self.heartbeat_interval_ticks >= self.election_timeout_ticks:
            raise ConfigError(f"{section}.heartbeat_interval_ticks", self.heartbeat_interval_ticks,
                              f"must be below election_timeout_ticks ({self.election_timeout_ticks})")
        if self.lease_drift_ticks >= self.election_timeout_ticks:
            raise ConfigError(f"{section}.lease_drift_ticks", self.lease_drift_ticks,
                              f"must be below election_timeout_ticks ({self.election_timeout_ticks})")
