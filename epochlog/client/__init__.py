"""The Epochlog client SDK: `Client` (blocking) and `AsyncClient` (asyncio) over the native protocol."""

from epochlog.client.aio import AsyncClient, Change, Entity, History, KeyValue, Page, WatchedEvent
from epochlog.client.errors import (ClientError, CompactedError, DeadlineExceededError, DiskFullError,
                                    InvalidArgumentError, NoAnswerError, NotFoundError, NotLeaderError,
                                    OutcomeUnknownError, RejectedError, UnavailableError)
from epochlog.client.sync import Client

__all__ = ["AsyncClient", "Change", "Client", "ClientError", "CompactedError", "DeadlineExceededError",
           "DiskFullError", "Entity", "History", "InvalidArgumentError", "KeyValue", "NoAnswerError",
           "NotFoundError", "NotLeaderError", "OutcomeUnknownError", "Page", "RejectedError",
           "UnavailableError", "WatchedEvent"]
