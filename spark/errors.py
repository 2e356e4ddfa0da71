"""Errors of the export and audit pipeline (all under EpochlogError)."""

from __future__ import annotations

from eventlog.errors import EpochlogError, InvalidArgumentError


class ExportError(EpochlogError):
    """An export run cannot go on as asked (nothing was committed to the table by it)."""

    code = "export"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = EpochlogError.kafka_error   # no Kafka request reaches an export


class ExportConflictError(ExportError):
    """Another export committed offsets this run was about to commit: this run's files were deleted.
    Run the export again: it starts after what the other run exported."""

    code = "export_conflict"
    retriable = True
    grpc_status = "ABORTED"
    kafka_error = EpochlogError.kafka_error   # no Kafka request reaches an export


class AuditError(InvalidArgumentError):
    """An audit question that cannot be answered as asked (unknown table version, a time before the
    table existed, a malformed key...)."""


class MaintenanceError(InvalidArgumentError):
    """A table maintenance operation refused as asked (not an events table, a retention below the
    table's minimum without --force...); the table is unchanged."""
