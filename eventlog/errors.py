"""The one error table of Epochlog.

Every error Epochlog raises on purpose is an `EpochlogError`, and every code a node, a face or the
SDK answers with is named by exactly one class here, which also says how each face reports it:

    code          the stable name: on the native wire, in gRPC's details, in logs and metrics
    retriable     whether the same request may succeed if simply tried again later (elsewhere, or
                  after a backoff)
    grpc_status   the gRPC status, by its name in the gRPC spec (`grpc.StatusCode[name]`: a name,
                  so that nothing below the gRPC face imports grpc)
    kafka_error   the Kafka error code (eventlog/kafka_codes.py)
    exit_code     what the `epochlog` command exits with when it ends on this error

Every face maps through these attributes and nothing else: the call runner's `wire_error` (native
protocol, epochlog/calls.py), gRPC's `failure` (epochlog/grpc/convert.py), Kafka's `kafka_code`
(epochlog/kafka/errors.py) and the CLI (epochlog/cli.py). The SDK raises the same classes: a reply's
error is made again from its code (`from_code`). Low layers raise them too (the log, Raft, the views), which is why
the table sits here, at the bottom.

A class that names a `code` states its face mappings itself (ROW_FIELDS; a test checks it), and no
two classes name the same code (checked when the class is made). A subclass without a code of its own narrows where an error
comes from (EventError, HistoryCompactedError) and keeps its parent's row. Errors of offline tools
that never cross a wire (certificates, `up`, the Delta export, the cleaner) are rows declared next to
their tool, the same way. To add an error: a class here (or next to such a tool), with its row;
tests/epochlog/test_errors.py checks every face maps it, docs/protocol.md lists it (generated).

A committed command that changed nothing is not an error but an outcome with a reason (the
rejection reasons at the end); `RejectedError` carries one to a caller that wants an exception, and
the faces report it by its reason's row of `REJECTIONS`.

A broken internal invariant is an `AssertionError`, never one of these: it must not be caught and
hidden as if it were bad input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from eventlog import kafka_codes as kc

EXIT_ERROR: Final = 3   # the exit code of a command that ends on an Epochlog error (all of them, today)

_BY_CODE: dict[str, type[EpochlogError]] = {}
ROW_FIELDS: Final = ("retriable", "grpc_status", "kafka_error")
"""What a class that names a code states itself (tests/epochlog/test_errors.py checks it); `exit_code`
is EXIT_ERROR unless the class says otherwise."""


class EpochlogError(Exception):
    """Root of every error Epochlog raises on purpose; its own row is `internal`: an unexpected
    failure (a bug), whose message names the exception."""

    code: str = "internal"
    retriable: bool = False
    grpc_status: str = "INTERNAL"
    kafka_error: int = kc.UNKNOWN_SERVER_ERROR
    exit_code: int = EXIT_ERROR
    # Where to send the request instead (`not_leader`): every face's error carries these fields.
    leader_hint: int = 0
    leader_address: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            return
        first = _BY_CODE.get(cls.code)
        if first is not None and (first.__module__, first.__qualname__) != (cls.__module__, cls.__qualname__):
            if cls.__module__ == "__main__":
                return   # a module run as a script, also imported under its name: the same row
            raise TypeError(f"code {cls.code!r} is named by {first.__module__}.{first.__qualname__} already: "
                            f"one class per code")
        _BY_CODE[cls.code] = cls


_BY_CODE[EpochlogError.code] = EpochlogError


def error_class(code: str) -> type[EpochlogError]:
    """The class that names `code` (the root's, `internal`, for a code no class names)."""
    return _BY_CODE.get(code, EpochlogError)


def error_classes() -> dict[str, type[EpochlogError]]:
    """Every row of the table known to this process: code -> class (the tools' rows once imported)."""
    return dict(_BY_CODE)


def as_error(exc: BaseException) -> EpochlogError:
    """`exc` as a row of the table: itself when it is one, `deadline_exceeded` for a timeout, else
    `internal`, naming the exception (a bug, or a failure nothing here expected)."""
    if isinstance(exc, EpochlogError):
        return exc
    if isinstance(exc, TimeoutError):
        return DeadlineExceededError("the request's deadline passed before it completed")
    return EpochlogError(f"{type(exc).__name__}: {exc}")


def from_code(code: str, message: str, *, retriable: bool | None = None, leader_hint: int = 0,
              leader_address: str = "") -> EpochlogError:
    """The error of `code` with `message`: what a reply says another process raised (the SDK's
    errors), or a rejection's reason that is also an error code (the controller's refusals).

    The instance is of the class that names `code`, made without the class's constructor: the fields
    a class adds beyond the message, the retriable flag and the leader are not on the wire. A code
    this build does not name (a newer node's) is kept on a root instance, as is a retriable flag that
    differs from the class's."""
    cls = error_class(code)
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    if cls.code != code:
        exc.code = code
    if retriable is not None and retriable != cls.retriable:
        exc.retriable = retriable
    if leader_hint:
        exc.leader_hint = leader_hint
    if leader_address:
        exc.leader_address = leader_address
    return exc


# --- the node's configuration ---------------------------------------------------------------------

class ConfigError(EpochlogError):
    """A configuration key or value is wrong; the message names the key and the value."""

    code = "config"
    retriable = False
    grpc_status = "INVALID_ARGUMENT"
    kafka_error = kc.UNKNOWN_SERVER_ERROR

    def __init__(self, key: str, value: object, problem: str) -> None:
        self.key = key
        self.value = value
        self.problem = problem
        # No value (a whole file is wrong: not found, invalid TOML): the key is the file, and no "= None".
        super().__init__(f"config {key}: {problem}" if value is None else f"config {key} = {value!r}: {problem}")


# --- the segmented event log (eventlog) ---------------------------------------------------------------

class LogError(EpochlogError):
    """Base of errors raised by the segmented event log."""

    code = "log"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


class InvalidBatchError(LogError):
    """Bytes that are not a well-formed Kafka RecordBatch v2 (bad CRC, magic, length, varint...)."""

    code = "invalid_batch"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.CORRUPT_MESSAGE


class UnsupportedCompressionError(InvalidBatchError):
    """A batch uses a compression codec Epochlog does not decode."""

    code = "unsupported_compression"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.UNSUPPORTED_COMPRESSION_TYPE


class BatchTooLargeError(LogError):
    """A batch is larger than `max_batch_bytes` (or than a segment): split it."""

    code = "batch_too_large"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.MESSAGE_TOO_LARGE


class OffsetOutOfRangeError(LogError):
    """An offset outside [log start, log end] was asked for."""

    code = "offset_out_of_range"
    retriable = False
    grpc_status = "OUT_OF_RANGE"
    kafka_error = kc.OFFSET_OUT_OF_RANGE

    def __init__(self, offset: int, start_offset: int, end_offset: int) -> None:
        self.offset = offset
        self.start_offset = start_offset
        self.end_offset = end_offset
        super().__init__(f"offset {offset} is outside the log [{start_offset}, {end_offset})")


class StaleEpochError(LogError):
    """An epoch older than the current one: an append carrying a leader epoch lower than one already
    in the log, or (the controller) a master or sync-state-set epoch that is not the broker group's
    current one, so a deposed master (or a report that crossed an election) changes nothing."""

    code = "stale_epoch"
    retriable = False
    grpc_status = "FAILED_PRECONDITION"
    kafka_error = kc.UNKNOWN_SERVER_ERROR

    def __init__(self, epoch: int, latest_epoch: int, message: str = "") -> None:
        self.epoch = epoch
        self.latest_epoch = latest_epoch
        super().__init__(message or f"epoch {epoch} is older than the log's latest epoch {latest_epoch}")


class OffsetMismatchError(LogError):
    """A replicated batch does not start at the log end offset."""

    code = "offset_mismatch"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


class LogCorruptionError(LogError):
    """Stored data is damaged where it cannot be a torn tail; names the file and byte position.

    Raised on open instead of dropping data in the middle of the log. Open with `repair=True` to
    cut the log at `position` explicitly (everything after it is lost).
    """

    code = "log_corruption"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.UNKNOWN_SERVER_ERROR

    def __init__(self, path: str, position: int, reason: str) -> None:
        self.path = path
        self.position = position
        self.reason = reason
        super().__init__(f"{path}: corrupt data at byte {position}: {reason}")


class CorruptBatchError(LogCorruptionError):
    """A batch of this node's log failed its checks (CRC, length, magic, offsets, epoch) when it was read or
    scrubbed: the node never serves it, nor anything after it in its segment (`eventlog.damage`).

    Retriable: another member holds a good copy, and this one drops the damaged part of its log and
    fetches it again from the leader (eventlog/raft/runtime/repair.py)."""

    code = "corrupt_batch"
    retriable = True
    grpc_status = "UNAVAILABLE"
    kafka_error = kc.KAFKA_STORAGE_ERROR

    def __init__(self, path: str, position: int, offset: int, reason: str) -> None:
        self.offset = offset
        super().__init__(path, position, f"damaged batch at offset {offset}: {reason}")


class LogClosedError(LogError):
    """The log was closed."""

    code = "log_closed"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.NOT_LEADER_OR_FOLLOWER


class LogFailedError(LogError):
    """A write or fsync failed; the log refuses all further writes until it is reopened.

    A failed fsync is never retried as if it had succeeded: after one, the kernel may have dropped
    the dirty pages, so nothing written since the last good sync can be trusted to be on disk.
    """

    code = "log_failed"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.KAFKA_STORAGE_ERROR


class DiskFullError(LogError):
    """The disk is full: the write was refused before touching the log, which stays consistent.

    Retriable once space is freed: the node retries by itself and resumes, and the SDK retries the
    write with a backoff until the call's timeout. (Appends into a preallocated segment cannot hit a
    full disk; this surfaces when the next segment cannot be prepared, or the data directory has less
    free space than `[compaction] min_free_disk_bytes`.)
    """

    code = "disk_full"
    retriable = True
    grpc_status = "RESOURCE_EXHAUSTED"
    kafka_error = kc.KAFKA_STORAGE_ERROR


# --- Raft (eventlog.raft) -----------------------------------------------------------------------------

class RaftError(EpochlogError):
    """Base of the Raft group's errors; as itself: the group cannot serve (it failed, e.g. its disk, or
    was stopped), the message says why."""

    code = "raft"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.KAFKA_STORAGE_ERROR


class NotLeaderError(RaftError):
    """This node is not the leader; `leader_hint` is the leader it knows of (0 = unknown) and, on a
    reply, `leader_address` where it serves this face's clients ("" = unknown)."""

    code = "not_leader"
    retriable = True
    grpc_status = "UNAVAILABLE"
    kafka_error = kc.NOT_LEADER_OR_FOLLOWER
    node = 0
    term = 0

    def __init__(self, node: int, leader_hint: int, term: int) -> None:
        self.node = node
        self.leader_hint = leader_hint
        self.term = term
        hint = f"try node {leader_hint}" if leader_hint else "no leader known"
        super().__init__(f"node {node} is not the leader in term {term} ({hint})")


class ProposalDroppedError(RaftError):
    """The leader cannot take the proposal now (a leadership transfer is in progress, ...)."""

    code = "proposal_dropped"
    retriable = True
    grpc_status = "UNAVAILABLE"
    kafka_error = kc.NOT_LEADER_OR_FOLLOWER   # leadership changed: the client retries at the new leader


class NotCaughtUpError(RaftError):
    """This replica has not applied far enough yet (a `local` read with `min_offset`): retry, or ask
    another replica."""

    code = "not_caught_up"
    retriable = True
    grpc_status = "UNAVAILABLE"
    kafka_error = kc.REQUEST_TIMED_OUT


class NotFoundError(RaftError):
    """The named entity (lease, key, member, broker, topic...) does not exist."""

    code = "not_found"
    retriable = False
    grpc_status = "NOT_FOUND"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


class ConfChangeError(RaftError):
    """A membership change that is not allowed now or at all; the message says why."""

    code = "conf_change"
    retriable = False
    grpc_status = "FAILED_PRECONDITION"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


class CompactedError(RaftError):
    """The offset asked for is no longer in the log record by record (compacted into a snapshot, or
    key-compacted): resync from the snapshot the message names."""

    code = "compacted"
    retriable = False
    grpc_status = "OUT_OF_RANGE"
    kafka_error = kc.OFFSET_OUT_OF_RANGE


class UnavailableError(RaftError):
    """What was asked for cannot be reached now: no node answered (all unreachable, or no leader) before
    the deadline (the SDK), or, in Raft's storage, an index beyond the log's last one."""

    code = "unavailable"
    retriable = True
    grpc_status = "UNAVAILABLE"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


class LogRefetchingError(RaftError):
    """This node dropped part of its log (a damaged batch, eventlog/raft/runtime/repair.py) and is
    fetching it again from the leader: another member serves those offsets meanwhile."""

    code = "log_refetching"
    retriable = True
    grpc_status = "UNAVAILABLE"
    kafka_error = kc.KAFKA_STORAGE_ERROR


# --- requests, events and their views ---------------------------------------------------------------

class InvalidArgumentError(EpochlogError):
    """A request that can never succeed as given (an invalid event, an unknown group, a bad
    consistency, a value out of range...); nothing was appended."""

    code = "invalid_argument"
    retriable = False
    grpc_status = "INVALID_ARGUMENT"
    kafka_error = kc.INVALID_RECORD


class SchemaVersionError(EpochlogError):
    """An event was written by a newer Epochlog than this reader understands."""

    code = "schema_version"
    retriable = False
    grpc_status = "FAILED_PRECONDITION"
    kafka_error = kc.INVALID_RECORD


class GroupHaltedError(EpochlogError):
    """The group halted on this node at a record its code cannot apply (the message names the offset, why,
    and the fix: upgrade the node, or `epochlog group skip`); another member may serve the call."""

    code = "group_halted"
    retriable = True
    grpc_status = "UNAVAILABLE"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


class RejectedError(EpochlogError):
    """The command was committed but changed nothing: `reason` says why (one of the rejection reasons
    below), `offset` is where it was committed. The faces report it by the reason's row of REJECTIONS."""

    code = "rejected"
    retriable = False
    grpc_status = "FAILED_PRECONDITION"
    kafka_error = kc.UNKNOWN_SERVER_ERROR
    reason = ""      # unknown on an error a reply made again (the native wire carries only the message)
    offset = -1
    result: Any = None

    def __init__(self, result: Any) -> None:
        """`result`: the write's result (epochlog.api.messages.WriteResult: its `code`, `message`, `offset`)."""
        super().__init__(f"{result.code}: {result.message} (committed at offset {result.offset}, changed nothing)")
        self.result = result
        self.reason = result.code
        self.offset = result.offset
        row = rejection(self.reason)
        self.grpc_status = row.grpc_status
        if row.kafka_error is not None:
            self.kafka_error = row.kafka_error


# --- calls and connections (the faces and the SDK) -----------------------------------------------------

class DeadlineExceededError(EpochlogError):
    """The request's deadline (`timeout_ms`) passed before it completed; a write may or may not have
    been committed."""

    code = "deadline_exceeded"
    retriable = True
    grpc_status = "DEADLINE_EXCEEDED"
    kafka_error = kc.REQUEST_TIMED_OUT


class ConnectionLimitError(EpochlogError):
    """The connection broke a limit of the node (memory for partly received frames, time to complete a
    frame) and is closed; connect again (with less in flight)."""

    code = "connection_limit"
    retriable = True
    grpc_status = "UNAVAILABLE"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


class BadFrameError(EpochlogError):
    """The connection sent something that is not a frame of this protocol (or a request before the
    hello); the reply has id 0 and the server closes the connection."""

    code = "bad_frame"
    retriable = False
    grpc_status = "INVALID_ARGUMENT"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


class ProtocolError(EpochlogError):
    """The node refused the connection's hello (a protocol version it does not speak), or answered it
    with something else than a hello."""

    code = "protocol"
    retriable = False
    grpc_status = "FAILED_PRECONDITION"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


class WatchCancelledError(EpochlogError):
    """Ends a watch after the client's CancelWatch."""

    code = "cancelled"
    retriable = False
    grpc_status = "CANCELLED"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


class OutcomeUnknownError(EpochlogError):
    """A write may or may not have been applied: an attempt's fate was unknown (a timeout, a lost
    connection, a leader change after proposing it), and its session expired before a retry could
    learn it. Read the state to find out; the SDK never re-sends it under a new session."""

    code = "outcome_unknown"
    retriable = False
    grpc_status = "UNKNOWN"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


# --- access (statemachines/access.py: who may do what) ------------------------------------------------

class AuthenticationError(EpochlogError):
    """No credentials, or credentials that do not prove who the client says it is (or are revoked, expired)."""

    code = "unauthenticated"
    retriable = False
    grpc_status = "UNAUTHENTICATED"
    kafka_error = kc.SASL_AUTHENTICATION_FAILED


class PermissionDeniedError(EpochlogError):
    """The authenticated principal may not do this; nothing of the request was done."""

    code = "permission_denied"
    retriable = False
    grpc_status = "PERMISSION_DENIED"
    kafka_error = kc.TOPIC_AUTHORIZATION_FAILED   # what the Kafka face's requests act on: topics


# --- the controller (brokers, their groups, topic routes) ---------------------------------------------

class ControllerStartingError(EpochlogError):
    """This node leads the metadata group but its controller is still loading the registry: retry."""

    code = "controller_starting"
    retriable = True
    grpc_status = "UNAVAILABLE"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


class FencedError(EpochlogError):
    """The broker's epoch is not its current one: another incarnation registered since (or it is an
    older incarnation trying to come back). This process must stop acting as that broker."""

    code = "fenced"
    retriable = False
    grpc_status = "FAILED_PRECONDITION"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


# --- the Kafka face's own answers ----------------------------------------------------------------------

class KafkaError(EpochlogError):
    """An answer only the Kafka protocol has (an unknown topic, a fenced leader epoch, not the group
    coordinator...), with the Kafka error code it is answered with."""

    code = "kafka"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.UNKNOWN_SERVER_ERROR

    def __init__(self, kafka_code: int, message: str) -> None:
        super().__init__(message)
        self.kafka_error = kafka_code

    @property
    def kafka_code(self) -> int:
        """The Kafka error code it is answered with (its `kafka_error`)."""
        return self.kafka_error


class UnsupportedRequestError(EpochlogError):
    """A Kafka API or version this node does not serve, or a request it cannot parse: the connection is
    closed (what a Kafka broker does), except for ApiVersions, which answers error 35."""

    code = "kafka_unsupported"
    retriable = False
    grpc_status = "UNIMPLEMENTED"
    kafka_error = kc.UNSUPPORTED_VERSION


# --- rejection reasons -------------------------------------------------------------------------------
# A committed command that changed nothing has one of these as its outcome's code (statemachines'
# Outcome.code, a reply's WriteResult.code); they are stored in the views, so their values never change.

VERSION_MISMATCH: Final = "version_mismatch"     # compare-and-set: the entity is at another version
CONDITION_FAILED: Final = "condition_failed"     # a condition of a transaction did not hold
ALREADY_EXISTS: Final = "already_exists"         # made once: it exists
NOT_FOUND: Final = NotFoundError.code            # it does not exist
INVALID_ARGUMENT: Final = InvalidArgumentError.code   # invalid once applied (or as the event decoded)
STALE_EPOCH: Final = StaleEpochError.code        # a broker's or broker group's epoch that is not current
FENCED: Final = FencedError.code                 # the broker's incarnation is not the registered one
SESSION_EXPIRED: Final = "session_expired"       # a request of a client session it no longer knows
REQUEST_EXPIRED: Final = "request_expired"       # a request id past its dedupe window (statemachines/request_ids.py)
HALTED: Final = GroupHaltedError.code            # not applied: this node halted before it (never a result)
SKIPPED: Final = "skipped"                       # the operator skipped the record (`epochlog group skip`)
OUT_OF_ORDER_SEQUENCE: Final = "out_of_order_sequence"   # an idempotent producer's batch after a gap
INVALID_PRODUCER_EPOCH: Final = "invalid_producer_epoch"  # ... of an older producer epoch
UNKNOWN_PRODUCER: Final = "unknown_producer_id"  # ... of a producer with no state, not at sequence 0


@dataclass(frozen=True, slots=True)
class Rejection:
    """How the faces report a rejection reason. `kafka_error` None: the Kafka face answers the batch's
    offset (the record is in the log; Kafka has no rejected produce)."""

    grpc_status: str = "FAILED_PRECONDITION"
    kafka_error: int | None = None


REJECTIONS: Final[Mapping[str, Rejection]] = {
    VERSION_MISMATCH: Rejection(),
    CONDITION_FAILED: Rejection(),
    ALREADY_EXISTS: Rejection("ALREADY_EXISTS"),
    NOT_FOUND: Rejection("NOT_FOUND"),
    INVALID_ARGUMENT: Rejection("INVALID_ARGUMENT"),
    STALE_EPOCH: Rejection(),
    FENCED: Rejection(),
    SESSION_EXPIRED: Rejection(),
    REQUEST_EXPIRED: Rejection(),
    HALTED: Rejection(),
    SKIPPED: Rejection(),
    OUT_OF_ORDER_SEQUENCE: Rejection(kafka_error=kc.OUT_OF_ORDER_SEQUENCE_NUMBER),
    INVALID_PRODUCER_EPOCH: Rejection(kafka_error=kc.INVALID_PRODUCER_EPOCH),
    UNKNOWN_PRODUCER: Rejection(kafka_error=kc.UNKNOWN_PRODUCER_ID),
}
_ANY_REJECTION: Final = Rejection()


def rejection(reason: str) -> Rejection:
    """The row of a rejection reason (a reason not listed is FAILED_PRECONDITION, as a failed check)."""
    return REJECTIONS.get(reason, _ANY_REJECTION)
