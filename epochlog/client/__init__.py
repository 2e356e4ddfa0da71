"""The Epochlog client SDK: `Client` (blocking) and `AsyncClient` (asyncio) over the native protocol."""

from epochlog.client.aio import AsyncClient, Change, Entity, KeyValue, Page, WatchedEvent
from epochlog.client.errors import (ClientError, CompactedError, DeadlineExceededError, InvalidArgumentError,
                                    NotFoundError, NotLeaderError, RejectedError, UnavailableError)
from epochlog.client.sync import Client

__all__ = ["AsyncClient", "Change", "Client", "ClientError", "CompactedError", "DeadlineExceededError", "Entity",
           "InvalidArgumentError", "KeyValue", "NotFoundError", "NotLeaderError", "Page", "RejectedError",
           "UnavailableError", "WatchedEvent"]
