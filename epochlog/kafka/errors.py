"""The Kafka face's errors: Kafka's error codes, and `kafka_code`, which answers any failure with one.

The Kafka face answers every failure with a Kafka error code in the response (never a closed
connection, except where Kafka itself closes one: an unparsable request, an oversize frame, an API
or version it does not serve; and past the node's limits on a request's entries, memory, frame
time and connections, for which Kafka has no code: docs/kafka.md, "Limits"). Errors raised below
the adapter keep their Epochlog type; `kafka_code` reads their row of the one error table
(eventlog/errors.py), so the adapter decides nothing itself. What only Kafka has a code for (an
unknown topic, a fenced leader epoch...) is a `KafkaError` carrying that code.
"""

from __future__ import annotations

from eventlog.errors import KafkaError, UnsupportedRequestError, as_error
from eventlog.kafka_codes import *  # noqa: F403 - the codes, as the face's modules name them (ke.NAME)

__all__ = ["KafkaError", "UnsupportedRequestError", "kafka_code"]


def kafka_code(exc: BaseException) -> int:
    """The Kafka error code that answers `exc` (its row of the error table)."""
    return as_error(exc).kafka_error
