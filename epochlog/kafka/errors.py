"""Kafka error codes, and the one table that maps Epochlog errors to them.

The Kafka face answers every failure with a Kafka error code in the response (never a closed
connection, except where Kafka itself closes one: an unparsable request, an oversize frame, an API
or version it does not serve; and past the node's limits on a request's entries, memory, frame
time and connections, for which Kafka has no code: docs/kafka.md, "Limits"). Errors raised below the adapter keep their Epochlog type; `kafka_code`
maps them through `CODE_OF` (by `EpochlogError.code`), so the adapter has one place that decides.
"""

from __future__ import annotations

import asyncio
from typing import Final

from eventlog.errors import EpochlogError

NONE: Final = 0
UNKNOWN_SERVER_ERROR: Final = -1
OFFSET_OUT_OF_RANGE: Final = 1
CORRUPT_MESSAGE: Final = 2
UNKNOWN_TOPIC_OR_PARTITION: Final = 3
LEADER_NOT_AVAILABLE: Final = 5
NOT_LEADER_OR_FOLLOWER: Final = 6
REQUEST_TIMED_OUT: Final = 7
MESSAGE_TOO_LARGE: Final = 10
COORDINATOR_LOAD_IN_PROGRESS: Final = 14
COORDINATOR_NOT_AVAILABLE: Final = 15
NOT_COORDINATOR: Final = 16
INVALID_TOPIC_EXCEPTION: Final = 17
NOT_ENOUGH_REPLICAS: Final = 19
ILLEGAL_GENERATION: Final = 22
INCONSISTENT_GROUP_PROTOCOL: Final = 23
INVALID_GROUP_ID: Final = 24
UNKNOWN_MEMBER_ID: Final = 25
INVALID_SESSION_TIMEOUT: Final = 26
REBALANCE_IN_PROGRESS: Final = 27
INVALID_COMMIT_OFFSET_SIZE: Final = 28
UNSUPPORTED_VERSION: Final = 35
TOPIC_ALREADY_EXISTS: Final = 36
INVALID_PARTITIONS: Final = 37
INVALID_REPLICATION_FACTOR: Final = 38
NOT_CONTROLLER: Final = 41
INVALID_REQUEST: Final = 42
UNSUPPORTED_FOR_MESSAGE_FORMAT: Final = 43
POLICY_VIOLATION: Final = 44
OUT_OF_ORDER_SEQUENCE_NUMBER: Final = 45
INVALID_PRODUCER_EPOCH: Final = 47
TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Final = 53
KAFKA_STORAGE_ERROR: Final = 56
UNKNOWN_PRODUCER_ID: Final = 59
GROUP_ID_NOT_FOUND: Final = 69
FENCED_LEADER_EPOCH: Final = 74
UNKNOWN_LEADER_EPOCH: Final = 75
UNSUPPORTED_COMPRESSION_TYPE: Final = 76
MEMBER_ID_REQUIRED: Final = 79
GROUP_MAX_SIZE_REACHED: Final = 81
INVALID_RECORD: Final = 87

CODE_OF: Final[dict[str, int]] = {
    # raft / node
    "not_leader": NOT_LEADER_OR_FOLLOWER,
    "proposal_dropped": NOT_LEADER_OR_FOLLOWER,   # leadership changed: the client retries at the new leader
    "not_caught_up": REQUEST_TIMED_OUT,
    "deadline_exceeded": REQUEST_TIMED_OUT,
    "compacted": OFFSET_OUT_OF_RANGE,
    "raft": KAFKA_STORAGE_ERROR,                  # a failed group (its disk): this replica cannot serve
    # log
    "offset_out_of_range": OFFSET_OUT_OF_RANGE,
    "invalid_batch": CORRUPT_MESSAGE,
    "unsupported_compression": UNSUPPORTED_COMPRESSION_TYPE,
    "batch_too_large": MESSAGE_TOO_LARGE,
    "log_failed": KAFKA_STORAGE_ERROR,
    "log_closed": NOT_LEADER_OR_FOLLOWER,
    "disk_full": KAFKA_STORAGE_ERROR,
    "corrupt_batch": KAFKA_STORAGE_ERROR,         # a damaged batch on this replica: never served (retriable)
    "log_refetching": KAFKA_STORAGE_ERROR,        # this replica fetches a dropped range again
    # events
    "invalid_argument": INVALID_RECORD,
    "schema_version": INVALID_RECORD,
}


class KafkaError(EpochlogError):
    """An error the Kafka face decides itself, with the Kafka code it answers."""

    code = "kafka"

    def __init__(self, kafka_code: int, message: str) -> None:
        super().__init__(message)
        self.kafka_code = kafka_code


class UnsupportedRequest(EpochlogError):
    """An API or version this node does not serve, or a request it cannot parse: the connection is
    closed (what a Kafka broker does), except for ApiVersions, which answers error 35."""

    code = "kafka_unsupported"


def kafka_code(exc: BaseException) -> int:
    """The Kafka error code that answers `exc`."""
    if isinstance(exc, KafkaError):
        return exc.kafka_code
    if isinstance(exc, EpochlogError):
        return CODE_OF.get(exc.code, UNKNOWN_SERVER_ERROR)
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return REQUEST_TIMED_OUT
    return UNKNOWN_SERVER_ERROR
