"""A Faust app over Epochlog's Kafka face: a table of the live brokers of every broker group.

The agent reads the metadata group's log as the Kafka topic `__metadata` (every controller decision
is a typed event there) and keeps, per broker group `<cluster>/<group>`, the sorted names of its
brokers that are registered and not fenced. The table lives in RocksDB (Faust's rocksdb store, over
rocksdict) and its changelog is a topic Faust creates through the Kafka face (CreateTopics: hosted
in the kv group), so a restarted worker recovers it.

    EPOCHLOG_KAFKA=127.0.0.1:7401,127.0.0.1:7402,127.0.0.1:7403 EPOCHLOG_FAUST_DIR=data/faust \\
        .venv/bin/python3 -m examples.live_brokers worker -l info     (configs/local-3.toml's Kafka addresses)

Against a cluster whose client faces speak TLS (the default), the worker connects over SSL with the
admin certificate `epochlog up` made (found by its Kafka addresses), or with EPOCHLOG_TLS_CA,
EPOCHLOG_TLS_CERT and EPOCHLOG_TLS_KEY when they are set. With EPOCHLOG_KAFKA_USER set it is that user
instead, over SASL_SSL: EPOCHLOG_KAFKA_PASSWORD, EPOCHLOG_KAFKA_MECHANISM (default SCRAM-SHA-256), the
same CA. The user needs: auditor (it reads `__metadata`), writer topic:epochlog-live-brokers-* (its
changelog and leader topics, which it creates), reader group:epochlog-live-brokers (its consumer group).

Read the table with `live_brokers(...)` below (the worker must be stopped: RocksDB is locked while it
runs), or tail its changelog topic `epochlog-live-brokers-live_brokers-changelog`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import faust

from epochlog.client.credentials import kafka_tls
from epochlog.client.tls import ClientTls
from statemachines import events as ev

APP_ID = "epochlog-live-brokers"
TABLE = "live_brokers"
CHANGELOG = f"{APP_ID}-{TABLE}-changelog"
LIVE = (ev.BrokerRegistered, ev.BrokerUnfenced)
GONE = (ev.BrokerFenced, ev.BrokerUnregistered)


USER_ENV, PASSWORD_ENV, MECHANISM_ENV = "EPOCHLOG_KAFKA_USER", "EPOCHLOG_KAFKA_PASSWORD", "EPOCHLOG_KAFKA_MECHANISM"


def broker_credentials(bootstrap: list[str], env: Mapping[str, str] = os.environ) -> Any:
    """A secured cluster's listener speaks SSL: SASL_SSL as EPOCHLOG_KAFKA_USER when it is set, else SSL with
    the credential of the environment (EPOCHLOG_TLS_*) or the admin certificate `epochlog up` made for the
    cluster of these Kafka addresses (docs/security.md); None for a plaintext listener."""
    tls = kafka_tls(bootstrap)
    user = env.get(USER_ENV)
    if not user:
        return None if tls is None else faust.SSLCredentials(tls.context())
    if tls is None:
        raise SystemExit(f"{USER_ENV} is set but no cluster CA is known: set EPOCHLOG_TLS_CA")
    # The CA alone: the connection is the user's, not a certificate's. Brokers are dialed by the addresses
    # Metadata lists; the certificates name nodes (node-<id>): the chain is checked, the name is not.
    return faust.SASLCredentials(username=user, password=env[PASSWORD_ENV],
                                 ssl_context=ClientTls(tls.ca_file).context(),
                                 mechanism=env.get(MECHANISM_ENV, "SCRAM-SHA-256"))


def make_app(bootstrap: list[str], datadir: str | Path) -> faust.App:
    app = faust.App(
        APP_ID,
        broker=[f"kafka://{address}" for address in bootstrap],
        broker_credentials=broker_credentials(bootstrap),
        store="rocksdb://",
        datadir=str(datadir),
        topic_partitions=1,              # __metadata has one partition; the table is co-partitioned with it
        topic_replication_factor=1,      # replication is the Raft group's
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
    )
    metadata = app.topic("__metadata", key_serializer="raw", value_serializer="raw")
    live = app.Table(TABLE, default=list, partitions=1)

    @app.agent(metadata)
    async def track(stream: Any) -> None:
        async for value in stream:
            try:
                event = ev.decode_event(value)
            except (ev.EventError, ev.SchemaVersionError):
                continue   # written by a newer Epochlog: not ours to guess
            if not isinstance(event, LIVE + GONE):
                continue
            group = f"{event.cluster}/{event.group}"
            names = set(live[group])
            if isinstance(event, LIVE):
                names.add(event.name)
            else:
                names.discard(event.name)
            live[group] = sorted(names)

    return app


def live_brokers(datadir: str | Path) -> dict[str, list[str]]:
    """The table as the (stopped) worker left it in RocksDB."""
    import rocksdict

    found: dict[str, list[str]] = {}
    for path in sorted(Path(datadir).glob(f"**/tables/{TABLE}-*.db")):
        db = rocksdict.Rdict(str(path), options=rocksdict.Options(raw_mode=True),
                             access_type=rocksdict.AccessType.read_only())
        try:
            for key, value in db.items():
                if bytes(key).startswith(b"__faust"):
                    continue   # Faust's own bookkeeping (the changelog offset it persisted)
                found[json.loads(bytes(key))] = json.loads(bytes(value))
        finally:
            db.close()
    return found


def main() -> None:
    bootstrap = os.environ.get("EPOCHLOG_KAFKA", "127.0.0.1:7401,127.0.0.1:7402,127.0.0.1:7403").split(",")
    app = make_app(bootstrap, os.environ.get("EPOCHLOG_FAUST_DIR", "data/faust"))
    app.main()


if __name__ == "__main__":
    main()
