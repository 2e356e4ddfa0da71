"""The client protocol, version 1: its messages (sans-IO; docs/protocol.md is the spec).

The first message each way is a hello (`ClientHello`, `ServerHello`); after it the client sends
`Requests` and the server sends `Replies`, each in frames (epochlog/api/frames.py). Requests carry
ids; replies come back as they complete, in any order, so concurrent calls share one connection.

Every write is an event (statemachines.events) or a list of them; a write's reply is its commit
offset, which is also a read-your-writes token (`min_offset`) for reads on any node.

Ranges are part of the types (`Offset`, `Limit`... below: msgspec constraints), so decoding a frame
checks them (epochlog/api/frames.py answers a request out of range on its own).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from statemachines.events import AnyEvent

PROTOCOL_VERSION = 1

CONSISTENCY = ("linearizable", "lease", "local")
MAX_LIMIT = 10_000                         # items per list/history page, reads per Gets (= statemachines.query's)
MAX_TIMEOUT_MS = 300_000                   # a request's deadline is capped here

# The ranges of the fields (checked when a frame is decoded; shown in docs/protocol.md §12).
MAX_OFFSET = 2**63 - 1                     # offsets are int64 on disk and in keys
RequestId = Annotated[int, msgspec.Meta(ge=1)]
Offset = Annotated[int, msgspec.Meta(ge=0, le=MAX_OFFSET)]          # a position in a group's log
OffsetOrNone = Annotated[int, msgspec.Meta(ge=-1, le=MAX_OFFSET)]   # -1: none (no minimum, from the next...)
Limit = Annotated[int, msgspec.Meta(ge=1, le=MAX_LIMIT)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
TimeoutMs = Annotated[int, msgspec.Meta(ge=0)]              # 0: the server's default; capped at MAX_TIMEOUT_MS
NodeId = Annotated[int, msgspec.Meta(ge=1)]

# --- hello ------------------------------------------------------------------------------------------

class ClientHello(msgspec.Struct, tag="client_hello"):
    version: int
    client: str = ""
    token: str = ""          # a bearer token (`epochlog user add --new-token`): the connection's principal


class ServerHello(msgspec.Struct, tag="server_hello"):
    version: int
    cluster: str
    node: int
    error: str = ""          # non-empty: the server refuses the connection (e.g. an unknown version)
    election_timeout_ms: int = 0   # the cluster's base election timeout (0: not told; the SDK assumes 1000)


# --- requests ---------------------------------------------------------------------------------------
# Not tracked by the cyclic garbage collector (gc=False): decoded from frames, they form no cycles,
# and a frame of 100,000 requests would otherwise have the collector scan them again and again while
# the frame is decoded (five times the decode time, on the loop that sends the heartbeats).

class Write(msgspec.Struct, tag="write", gc=False):
    """Append events; each goes to its group (the reply lists one result per event, in order).

    The events of one group in one Write are committed in one batch, in order.
    """

    events: Annotated[list[AnyEvent], msgspec.Meta(min_length=1)]


class Get(msgspec.Struct, tag="get", gc=False):
    key: str                              # an entity key such as 'kv/app/x' or 'broker/c/g/n'
    consistency: str = "linearizable"
    min_offset: OffsetOrNone = -1
    as_of: Offset | None = None


class Gets(msgspec.Struct, tag="gets", gc=False):
    """Many point reads in one call (each may name a different group)."""

    gets: Annotated[list[Get], msgspec.Meta(max_length=MAX_LIMIT)]


class List(msgspec.Struct, tag="list", gc=False):
    """Entities with keys starting with `prefix`, or in [start, end) when `end` is given."""

    prefix: str = ""
    start: str = ""
    end: str = ""
    limit: Limit = 100
    after: str | None = None              # continuation token: the last key of the previous page
    consistency: str = "linearizable"
    min_offset: OffsetOrNone = -1
    as_of: Offset | None = None


class History(msgspec.Struct, tag="history", gc=False):
    key: str
    limit: Limit = 1000
    after_offset: Annotated[int, msgspec.Meta(ge=-1, le=MAX_OFFSET - 1)] = -1
    consistency: str = "linearizable"
    min_offset: OffsetOrNone = -1


class LeaseGrant(msgspec.Struct, tag="lease_grant", gc=False):
    ttl_ms: int
    lease_id: Count = 0                   # 0: the server picks one
    request_id: str = ""


class LeaseKeepAlive(msgspec.Struct, tag="lease_keepalive", gc=False):
    lease_id: Positive


class Watch(msgspec.Struct, tag="watch", gc=False):
    """Stream committed events whose key starts with `prefix` from `from_offset` (inclusive).

    The reply is `WatchStarted`; then `WatchEvents` frames carry the request's id until the watch
    ends with an error reply (e.g. `compacted`) or the client sends `CancelWatch`. `window` is the
    flow control: the server keeps at most that many unacknowledged events in flight and waits for
    `WatchAck` before sending more.
    """

    prefix: str
    from_offset: OffsetOrNone = -1        # -1: from the next event applied
    group: str = ""                       # "" = the group that owns the prefix
    window: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 4096


class WatchAck(msgspec.Struct, tag="watch_ack", gc=False):
    watch_id: int
    events: Count


class CancelWatch(msgspec.Struct, tag="cancel_watch", gc=False):
    watch_id: int


class ReadEvents(msgspec.Struct, tag="read_events", gc=False):
    """Committed events of one group by offset range (for exporters)."""

    group: str
    from_offset: Offset
    max_events: Positive = 1000
    max_bytes: Positive = 1 << 20


class ReadLog(msgspec.Struct, tag="read_log", gc=False):
    """Committed record batches of one group as its log stores them (for exporters that decode them).

    The reply (`LogBatches`) carries whole batches, each with its CRC, from the one holding
    `from_offset` up to about `max_bytes`, never past what the node has applied: the same bounds and
    refusals as `ReadEvents`, without the node decoding and re-encoding every record (the reader
    decodes them with eventlog/offline.py, as an offline export does)."""

    group: str
    from_offset: Offset
    max_bytes: Annotated[int, msgspec.Meta(ge=1, le=8 << 20)] = 4 << 20


class Status(msgspec.Struct, tag="status", gc=False):
    pass


class Ping(msgspec.Struct, tag="ping", gc=False):
    """Are you there? Answered `done` at once from the node's loop (no Raft, no disk): the SDK sends it
    on a connection that has calls pending and has been silent, to tell a slow call from a stopped node."""


class TransferLeader(msgspec.Struct, tag="transfer_leader", gc=False):
    group: str
    to: Count                             # 0: the most caught-up follower


class Snapshot(msgspec.Struct, tag="snapshot", gc=False):
    group: str


class GroupSkip(msgspec.Struct, tag="group_skip", gc=False):
    """Skip the record `group` halted at on THIS node (`offset`, as its status shows) and apply on.

    Operator recovery from a record no Epochlog version can apply: run it on every member (the CLI's
    `epochlog group skip` checks that every member is halted at that offset first). Refused when the
    group is not halted at exactly `offset` on this node.
    """

    group: str
    offset: Offset


class CompactionStatus(msgspec.Struct, tag="compaction_status", gc=False):
    """This node's retention of every group (compaction/): log, snapshot, horizon, pruning, disk."""


class MemberList(msgspec.Struct, tag="member_list", gc=False):
    pass


class MemberAdd(msgspec.Struct, tag="member_add", gc=False):
    """Add a node as a learner of every group; it is promoted to voter once caught up.

    Membership calls go to the metadata leader, which records the node's addresses and then changes
    every group in turn, each through that group's leader (forwarding the call with `group` set).
    """

    node_id: NodeId
    peer_address: str
    client_address: str = ""
    auto_promote: bool = True
    group: str = ""                       # "": every group; a name: that group only (its leader serves it)


class MemberPromote(msgspec.Struct, tag="member_promote", gc=False):
    node_id: NodeId
    group: str = ""


class MemberRemove(msgspec.Struct, tag="member_remove", gc=False):
    node_id: NodeId
    group: str = ""


# The controller (controller/): served by the metadata group's leader, except the reads (RouteQuery,
# BrokerList), which any node serves at the consistency asked.

class BrokerIdentity(msgspec.Struct, array_like=True, gc=False):
    cluster: str
    group: str                            # broker group (RocketMQ broker name)
    name: str                             # the broker within its group
    address: str                          # host:port where it serves
    incarnation: str                      # this process run; sorts by start time (controller.decisions)


class BrokerRegister(msgspec.Struct, tag="broker_register", gc=False):
    """Register brokers (a fleet registers many in one call); one Registration per broker, in order."""

    brokers: list[BrokerIdentity]


class Heartbeat(msgspec.Struct, array_like=True, gc=False):
    cluster: str
    group: str
    name: str
    broker_epoch: int
    offset: OffsetOrNone = -1             # the broker's replicated offset (-1: not reported)


class BrokerHeartbeats(msgspec.Struct, tag="broker_heartbeats", gc=False):
    """Heartbeats of many brokers in one call; never logged (only a fence or unfence is an event)."""

    heartbeats: list[Heartbeat]


class SyncStateSetReport(msgspec.Struct, tag="sync_state_set_report", gc=False):
    """The master's new SyncStateSet (shrink or expand), under the epochs it was decided in."""

    cluster: str
    group: str
    name: str
    broker_epoch: int
    master_epoch: int
    sync_state_set_epoch: int
    sync_state_set: list[int]


class BrokerShutdown(msgspec.Struct, tag="broker_shutdown", gc=False):
    """Controlled shutdown: a master hands mastership over, then the broker is fenced."""

    cluster: str
    group: str
    name: str
    broker_epoch: int


class RouteQuery(msgspec.Struct, tag="route_query", gc=False):
    """Where a topic lives: the live master and replicas of each of its broker groups."""

    topic: str
    cluster: str = ""                     # "": broker groups of every cluster
    consistency: str = "linearizable"
    min_offset: OffsetOrNone = -1


class BrokerList(msgspec.Struct, tag="broker_list", gc=False):
    """Every registered broker and broker group (of one cluster or group when given)."""

    cluster: str = ""
    group: str = ""
    consistency: str = "linearizable"
    min_offset: OffsetOrNone = -1


Call = (Write | Get | Gets | List | History | LeaseGrant | LeaseKeepAlive | Watch | WatchAck | CancelWatch
        | ReadEvents | ReadLog | Status | Ping | TransferLeader | Snapshot | CompactionStatus | MemberList | MemberAdd
        | MemberPromote | MemberRemove | BrokerRegister | BrokerHeartbeats | SyncStateSetReport | BrokerShutdown
        | RouteQuery | BrokerList | GroupSkip)


class Request(msgspec.Struct, array_like=True, gc=False):
    id: RequestId
    call: Call
    timeout_ms: TimeoutMs = 0             # 0: the server's default deadline (capped at 300000)


# --- replies ----------------------------------------------------------------------------------------

class WriteResult(msgspec.Struct, array_like=True):
    """One event's fate: committed at `offset`; `ok` False when applying it changed nothing
    (`code`: version_mismatch, stale_epoch, not_found, already_exists, condition_failed, ...).
    `duplicate`: a retry of a request id already applied; the result is the first one's."""

    offset: int
    group: str
    ok: bool
    code: str = ""
    message: str = ""
    duplicate: bool = False


class Written(msgspec.Struct, tag="written"):
    results: list[WriteResult]


class Item(msgspec.Struct, array_like=True):
    key: str
    state: bytes                          # msgpack map: the entity's state (statemachines.state)
    version: int                          # offset of the event that last modified it


class Got(msgspec.Struct, tag="got"):
    item: Item | None
    applied: int                          # the applied offset the read was served at


class GotMany(msgspec.Struct, tag="got_many"):
    replies: list[Got]


class Listed(msgspec.Struct, tag="listed"):
    items: list[Item]
    next_after: str | None                # pass as `after` for the next page; None: no more
    applied: int


class HistoryRow(msgspec.Struct, array_like=True):
    offset: int
    event: str
    state: bytes | None                   # None: the event deleted the entity


class HistoryRows(msgspec.Struct, tag="history_rows"):
    rows: list[HistoryRow]
    applied: int
    floor: int = 0                        # the history floor: earlier events are in the export archive only


class Lease(msgspec.Struct, tag="lease"):
    lease_id: int
    ttl_ms: int
    offset: int = -1                      # the grant's commit offset (-1 for a keepalive)


class WatchStarted(msgspec.Struct, tag="watch_started"):
    watch_id: int
    group: str
    from_offset: int


class EventRecord(msgspec.Struct, array_like=True):
    offset: int
    key: str
    value: bytes | None                   # the event, msgpack (statemachines.events.decode_event)
    timestamp: int
    term: int = -1                        # the term of the leader that appended it (-1: not given)
    applied: bool | None = None           # it changed the views (false: rejected, retry, skipped; nil: unknown)


class WatchEvents(msgspec.Struct, tag="watch_events"):
    watch_id: int
    events: list[EventRecord]


class Events(msgspec.Struct, tag="events"):
    events: list[EventRecord]
    next_offset: int
    log_start: int                        # the first offset served record by record (the log start, or the
                                          # end of its key-compacted range): below it, `compacted`
    commit_offset: int


class LogBatches(msgspec.Struct, tag="log_batches"):
    """A `ReadLog` reply. `data` holds whole batches in the log's format (eventlog/records.py, CRC
    included; control batches too), from `start_offset` (the first batch's base offset, at or below
    the offset asked) to `next_offset` (where to read next; the offset asked when the node has not
    applied it yet). Every record in the batches changed the views but those at the offsets of `noops`
    (rejected, a retry, skipped) and of `unknown` (not known: below the views' history floor), both
    within [the offset asked, `next_offset`)."""

    data: bytes
    start_offset: int
    next_offset: int
    log_start: int                        # as in Events: below it, `compacted`
    commit_offset: int
    noops: list[int] = []
    unknown: list[int] = []


class PeerInfo(msgspec.Struct, array_like=True):
    id: int
    role: str                             # voter | learner
    match_offset: int                     # known on the leader only (-1 elsewhere)
    heard_ms: int = -1                    # ms since this node last received a message of the group from it (-1: never)


class HaltInfo(msgspec.Struct, array_like=True):
    """Why a group stopped applying on this node (epochlog/halts.py)."""

    offset: int                           # the record it cannot apply; the views end before its entry
    reason: str                           # e.g. "KvPut version 3 is newer than this Epochlog knows (2)"
    fix: str                              # what to do: upgrade this node, or report a bug


class DamageInfo(msgspec.Struct, array_like=True):
    """A damaged batch in this node's log of a group, and its repair (eventlog/raft/runtime/repair.py)."""

    offset: int                           # the damaged batch's: not served, nor the rest of its segment
    file: str                             # the segment file
    position: int                         # byte position of the batch in the file
    reason: str                           # which check failed (CRC, length, offset, epoch...)
    state: str                            # what the node does: hands leadership over, fetches its log again...


class DigestAt(msgspec.Struct, array_like=True):
    """The views' running digest after applying through `offset` (statemachines/apply.py notes it at the
    same offsets on every member)."""

    offset: int
    digest: str                           # hex


class DigestAlarm(msgspec.Struct, array_like=True):
    """A member whose views digest differs from the leader's at the same applied offset (epochlog/integrity.py)."""

    member: int
    offset: int                           # the applied offset both digests are taken at
    digest: str                           # the member's (hex)
    leader_digest: str                    # the leader's (hex)


class GroupInfo(msgspec.Struct):
    group: str
    node: int
    role: str
    term: int
    leader: int
    commit_offset: int
    applied_offset: int
    last_offset: int
    log_start: int
    snapshot_offset: int
    peers: list[PeerInfo]
    halted: HaltInfo | None = None        # not nil: applying stopped on this node (group_halted)
    skipped: list[int] = []               # offsets the operator skipped on this node (`group_skip`)
    damage: DamageInfo | None = None      # not nil: a damaged batch in this node's log, or its repair
    digests: list[DigestAt] = []          # the latest digests this node's views noted, oldest first
    digest_alarms: list[DigestAlarm] = [] # on the leader: members whose views digest differs from its own
    views_format: int = 0                 # the views format level this node writes the group's views at (0: unknown)


class MemberInfo(msgspec.Struct, array_like=True):
    id: int
    peer_address: str
    client_address: str


class StatusInfo(msgspec.Struct, tag="status_info"):
    cluster: str
    node: int
    groups: list[GroupInfo]
    members: list[MemberInfo]
    instance: str = ""                    # this run of the node: a nonce made at start (a restart changes it)
    pid: int = 0                          # the node's process id on its host
    storage: str = ""                     # the id of its data directory (epochlog.identity.storage_id)


class Members(msgspec.Struct, tag="members"):
    members: list[MemberInfo]
    voters: list[int]
    learners: list[int]


class Done(msgspec.Struct, tag="done"):
    offset: int = -1


class BrokerGroupInfo(msgspec.Struct, array_like=True):
    cluster: str
    group: str
    master: int                           # broker id of the master (-1: none)
    master_epoch: int
    sync_state_set: list[int]
    sync_state_set_epoch: int
    status: str                           # "ok", or why the group has no usable master


class Registration(msgspec.Struct, array_like=True):
    broker_id: int                        # -1 when refused
    broker_epoch: int                     # heartbeats and reports carry it
    group: BrokerGroupInfo | None         # the group after the registration
    code: str = ""                        # non-empty: refused (fenced: an older incarnation; invalid_argument)
    message: str = ""


class Registered(msgspec.Struct, tag="registered"):
    results: list[Registration]
    heartbeat_interval_ms: int            # how often to heartbeat
    heartbeat_timeout_ms: int             # silent this long: fenced
    applied: int                          # the metadata offset the groups are described at (watch from the next)


class HeartbeatRejected(msgspec.Struct, array_like=True):
    index: int                            # position in BrokerHeartbeats.heartbeats
    code: str                             # fenced (another incarnation holds the name: stop) or not_found (register)


class HeartbeatsAck(msgspec.Struct, tag="heartbeats_ack"):
    rejected: list[HeartbeatRejected]     # only the heartbeats not accepted


class BrokerGroup(msgspec.Struct, tag="broker_group"):
    group: BrokerGroupInfo


class RouteBroker(msgspec.Struct, array_like=True):
    id: int
    name: str
    address: str


class GroupRoute(msgspec.Struct, array_like=True):
    cluster: str
    group: str
    master: RouteBroker | None            # None: no live master (writes cannot go to this group)
    master_epoch: int
    replicas: list[RouteBroker]           # live (unfenced) brokers other than the master
    status: str


class TopicRoute(msgspec.Struct, tag="topic_route"):
    topic: str
    read_queues: int
    write_queues: int
    perm: int
    groups: list[GroupRoute]
    version: int                          # offset of the topic's last change
    applied: int


class BrokerInfo(msgspec.Struct, array_like=True):
    cluster: str
    group: str
    name: str
    id: int
    address: str
    role: str                             # master | slave
    broker_epoch: int
    master_epoch: int                     # of its group
    fenced: bool
    incarnation: str
    offset: int = -1                      # last reported replicated offset (the controller's node only, else -1)
    heartbeat_age_ms: int = -1            # since its last heartbeat (the controller's node only, else -1)


class Brokers(msgspec.Struct, tag="brokers"):
    brokers: list[BrokerInfo]
    groups: list[BrokerGroupInfo]
    applied: int
    controller: bool                      # served by the controller: offsets and heartbeat ages are known


class ExportPinInfo(msgspec.Struct, array_like=True):
    table: str                            # the Delta table id of `config/export/table-<id>`
    watermark: int                        # the highest offset of the group it holds
    floor: int                            # the lowest offset it keeps in the log (watermark + 1, or its cap)
    capped_by: str = ""                   # the export_max_pin_* key that capped it ("": not capped)


class CleanPassInfo(msgspec.Struct):
    """The last key-compaction pass of a group on this node."""

    clean_below: int                      # the offset it cleaned below
    cleaned_through: int                  # end of the last segment it rewrote
    seconds: float
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    records_kept: int
    records_dropped: int                  # superseded, tombstones and no-ops together
    tombstones_dropped: int
    noops_dropped: int                    # records that changed nothing when applied
    finished_at: float                    # Unix time
    aborted: str = ""                     # why it stopped early ("": it did not)


class CompactionGroupInfo(msgspec.Struct):
    group: str
    role: str
    log_start: int
    log_end: int
    segments: int
    log_bytes: int                        # on disk (preallocated segments included)
    snapshot_offset: int                  # -1: none
    snapshots_taken: int                  # since the node started
    last_snapshot_ms: float               # how long the last one took (written in a thread)
    last_snapshot_at: float               # Unix time it finished (0: none since start)
    snapshot_error: str                   # why the last one failed ("": it did not)
    history_floor: int                    # committed: as_of below it answers compacted
    horizon: int                          # what the group may forget up to, as this node sees it
    horizon_bound: str                    # what bounds it: "policy (retain_offsets)", "export <table>", ...
    log_floor: int                        # the log keeps from here: min(horizon, snapshot + 1)
    log_bound: str
    pins: list[ExportPinInfo]
    pruned_floor: int                     # every history row this floor hides is deleted
    prune_passes: int
    rows_pruned: int
    views_bytes: int                      # the views' RocksDB on disk
    last_run_at: float                    # Unix time of the last retention check (0: none yet)
    last_run_ms: float                    # how long it took on the event loop
    segments_deleted: int                 # since the node started
    disk_full: str                        # why this node refuses writes to the group ("": it does not)
    cleanup_policy: str = "delete"        # "compact": key-compacted below the horizon; "delete": truncated
    clean_end_offset: int = -1            # the key-compacted range ends here (the log start: none)
    cleaned_segments: int = 0
    clean_below: int = -1                 # the next pass cleans below this offset (-1: not compact)
    clean_waiting: str = ""               # why no pass runs now ("": one runs or is due)
    clean_running: bool = False
    clean_passes: int = 0                 # passes that rewrote segments, since the node started
    clean_failures: int = 0
    clean_error: str = ""                 # why the last pass failed ("": it did not)
    clean_bytes_reclaimed: int = 0        # since the node started
    last_clean: CleanPassInfo | None = None


class CompactionInfo(msgspec.Struct, tag="compaction_info"):
    node: int
    groups: list[CompactionGroupInfo]
    free_disk_bytes: int                  # on the data directory's file system (-1: not measured yet)


Result = (Written | Got | GotMany | Listed | HistoryRows | Lease | WatchStarted | WatchEvents | Events | LogBatches
          | StatusInfo | Members | Done | Registered | HeartbeatsAck | BrokerGroup | TopicRoute | Brokers
          | CompactionInfo)


class WireError(msgspec.Struct, array_like=True):
    code: str                             # the EpochlogError code, e.g. not_leader, invalid_argument
    message: str
    retriable: bool = False
    leader: int = 0                       # not_leader: the leader's node id (0: unknown)
    leader_address: str = ""              # not_leader: the leader's client address


class Reply(msgspec.Struct, array_like=True):
    id: int
    result: Result | None = None
    error: WireError | None = None


class Requests(msgspec.Struct, tag="requests"):
    requests: list[Request]


class Replies(msgspec.Struct, tag="replies"):
    replies: list[Reply]
