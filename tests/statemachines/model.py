"""A plain-Python model of the views: what applying events means, written to be obviously right.

The real views (`statemachines/apply.py`, `query.py`) are RocksDB column families, overlays,
savepoints, an MVCC `versions` keyspace and an eviction index for request ids. The model is none of
that: entities are a dict from entity key to a state dict (the fields of the `*State` structs),
every offset keeps a copy of that dict (so `as_of` is a lookup), every key keeps the list of events
that changed it, and a request id remembers its first outcome. Transactions run on a copy of the
entity dict that is kept or dropped as a whole.

State dicts are never mutated once stored (a change builds a new dict), so the per-offset copies
can share them.

Semantics taken from the module docstrings, README and the handlers' error codes:

- every state carries `version` (offset of the event that last changed it) and `created`;
- compare-and-set: `expected_version` must equal the entity's version, 0 meaning "must not exist";
- a rejected event changes nothing; a transaction is all or nothing; its conditions are checked
  first (`condition_failed`), then its operations in order, each seeing the earlier ones;
- a request id (per actor) seen at most `window` offsets ago returns the first outcome, marked
  `duplicate`, and changes nothing; older than that it is a new request;
- a lease's end (revoked or expired) deletes every key and session attached to it;
- broker registration needs a higher broker epoch than the registered one; fencing, unfencing and
  unregistering need the current one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from statemachines import events as ev


@dataclass(frozen=True)
class Expected:
    """The outcome the model predicts for one record (the message is not modelled)."""

    ok: bool
    offset: int
    code: str = ""
    duplicate: bool = False


class Rejected(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


# What the test asks the model to apply at one offset.
EVENT, INVALID, MALFORMED, WRONG_KEY = "event", "invalid", "malformed", "wrong_key"


def tag(event: ev.Event) -> str:
    return type(event).__struct_config__.tag  # type: ignore[return-value]


@dataclass
class Model:
    window: int
    entities: dict[str, dict] = field(default_factory=dict)
    snapshots: list[dict[str, dict]] = field(default_factory=list)   # index = offset
    history: dict[str, list[tuple[int, str, dict | None]]] = field(default_factory=dict)
    first: dict[tuple[str, str], Expected] = field(default_factory=dict)   # (actor, request id)
    requests: list[tuple[int, tuple[str, str]]] = field(default_factory=list)  # every first application

    @property
    def applied(self) -> int:
        return len(self.snapshots) - 1

    def at(self, offset: int) -> dict[str, dict]:
        return {} if offset < 0 else self.snapshots[offset]

    def version(self, key: str) -> int:
        state = self.entities.get(key)
        return 0 if state is None else state["version"]

    # --- one offset ------------------------------------------------------------------------------

    def skip(self, offset: int) -> None:
        """An offset without an event (a NOOP entry)."""
        assert offset == len(self.snapshots)
        self.snapshots.append(self.entities)

    def apply(self, offset: int, kind: str, event: ev.Event | None) -> Expected:
        assert offset == len(self.snapshots), (offset, len(self.snapshots))
        outcome = self._apply(offset, kind, event)
        self.snapshots.append(dict(self.entities))
        return outcome

    def _apply(self, offset: int, kind: str, event: ev.Event | None) -> Expected:
        if kind in (MALFORMED, WRONG_KEY):
            return Expected(False, offset, "invalid_argument")   # unreadable: not even deduplicated
        assert event is not None
        request = (event.actor, event.request_id) if event.request_id else None
        if request is not None:
            seen = self.first.get(request)
            if seen is not None and offset - seen.offset <= self.window:
                return Expected(seen.ok, seen.offset, seen.code, duplicate=True)
        if kind == INVALID:
            outcome = Expected(False, offset, "invalid_argument")
        else:
            work = dict(self.entities)
            rows: list[tuple[str, int, str, dict | None]] = []
            try:
                self._event(work, rows, event, offset)
            except Rejected as r:
                outcome = Expected(False, offset, r.code)
            else:
                outcome = Expected(True, offset)
                self.entities = work
                for key, at, name, state in rows:
                    self.history.setdefault(key, []).append((at, name, state))
        if request is not None:
            self.first[request] = outcome
            self.requests.append((offset, request))
        return outcome

    # --- handlers: `w` is the working copy, `rows` the history rows to keep on success ------------

    def _event(self, w: dict[str, dict], rows: list, e: ev.Event, o: int) -> None:
        def put(key: str, state: dict, by: ev.Event = e) -> None:
            assert state["version"] == o
            w[key] = state
            rows.append((key, o, tag(by), state))

        def remove(key: str, by: ev.Event = e) -> None:
            del w[key]
            rows.append((key, o, tag(by), None))

        def cas(key: str, expected: int | None) -> None:
            if expected is not None and (w[key]["version"] if key in w else 0) != expected:
                raise Rejected("version_mismatch")

        def lease_exists(lease: int) -> None:
            if lease and f"lease/{lease:020d}" not in w:
                raise Rejected("not_found")

        k = e.key()
        old = w.get(k)
        created = old["created"] if old else o
        match e:
            case ev.KvPut():
                cas(k, e.expected_version)
                lease_exists(e.lease)
                put(k, dict(name=e.name, value=e.value, lease=e.lease, version=o, created=created))
            case ev.KvDeleted():
                if old is None:
                    raise Rejected("not_found")
                cas(k, e.expected_version)
                remove(k)
            case ev.LeaseGranted():
                if old is not None:
                    raise Rejected("already_exists")
                put(k, dict(lease_id=e.lease_id, ttl_ms=e.ttl_ms, version=o, created=o))
            case ev.LeaseRevoked() | ev.LeaseExpired():
                if old is None:
                    raise Rejected("not_found")
                for key in sorted(w):
                    if key.split("/", 1)[0] in ("kv", "session") and w[key]["lease"] == e.lease_id:
                        remove(key)
                remove(k)
            case ev.SessionOpened():
                lease_exists(e.lease)
                kept = old["created"] if old and not e.clean else o
                put(k, dict(client_id=e.client_id, node=e.node, clean=e.clean, lease=e.lease, version=o,
                            created=kept))
            case ev.SessionClosed():
                if old is None:
                    raise Rejected("not_found")
                remove(k)
            case ev.ConfigChanged():
                if e.value is None:
                    if old is None:
                        raise Rejected("not_found")
                    remove(k)
                else:
                    put(k, dict(scope=e.scope, name=e.name, value=e.value, version=o, created=created))
            case ev.TopicCreated():
                if old is not None:
                    raise Rejected("already_exists")
                put(k, dict(name=e.name, read_queues=e.read_queues, write_queues=e.write_queues, perm=e.perm,
                            broker_groups=tuple(e.broker_groups), config=dict(e.config),
                            version=o, created=o))
            case ev.TopicUpdated():
                if old is None:
                    raise Rejected("not_found")
                cas(k, e.expected_version)
                new = dict(old, version=o)
                for name in ("read_queues", "write_queues", "perm", "broker_groups", "config"):
                    if getattr(e, name) is not None:
                        new[name] = getattr(e, name)
                put(k, new)
            case ev.TopicDeleted():
                if old is None:
                    raise Rejected("not_found")
                cas(k, e.expected_version)
                remove(k)
            case ev.OffsetCommitted():
                put(k, dict(consumer_group=e.consumer_group, topic=e.topic, queue_id=e.queue_id,
                            offset=e.offset, version=o, created=created))
            case ev.BrokerRegistered():
                if old is not None and old["broker_epoch"] >= e.broker_epoch:
                    raise Rejected("stale_epoch")
                put(k, dict(cluster=e.cluster, group=e.group, name=e.name, address=e.address,
                            incarnation=e.incarnation, broker_id=e.broker_id, broker_epoch=e.broker_epoch,
                            fenced=False, version=o, created=created))
                g = w.get(e.group_key())
                if g is None:
                    g = _new_group(e.cluster, e.group, o)
                put(e.group_key(), dict(g, brokers={**g["brokers"], e.name: e.broker_id}, version=o))
            case ev.BrokerFenced() | ev.BrokerUnfenced() | ev.BrokerUnregistered():
                if old is None:
                    raise Rejected("not_found")
                if old["broker_epoch"] != e.broker_epoch:
                    raise Rejected("stale_epoch")
                if isinstance(e, ev.BrokerUnregistered):
                    remove(k)
                    g = w.get(e.group_key())
                    if g is not None:
                        brokers = {n: i for n, i in g["brokers"].items() if n != e.name}
                        put(e.group_key(), dict(g, brokers=brokers, version=o))
                else:
                    put(k, dict(old, fenced=isinstance(e, ev.BrokerFenced), version=o))
            case ev.MasterElected():
                g = old if old is not None else _new_group(e.cluster, e.group, o)
                if g["master_epoch"] != e.master_epoch:
                    raise Rejected("stale_epoch")
                if e.sync_state_set:
                    sync = tuple(sorted(set(e.sync_state_set)))
                else:
                    sync = (e.master,) if e.master >= 0 else ()
                put(k, dict(g, master=e.master, master_epoch=g["master_epoch"] + 1, sync_state_set=sync,
                            sync_state_set_epoch=g["sync_state_set_epoch"] + 1, version=o))
            case ev.SyncStateSetChanged():
                if old is None:
                    raise Rejected("not_found")
                epochs = (old["master_epoch"], old["sync_state_set_epoch"])
                if epochs != (e.master_epoch, e.sync_state_set_epoch):
                    raise Rejected("stale_epoch")
                if old["master"] not in e.sync_state_set:
                    raise Rejected("invalid_argument")
                put(k, dict(old, sync_state_set=tuple(sorted(set(e.sync_state_set))),
                            sync_state_set_epoch=old["sync_state_set_epoch"] + 1, version=o))
            case ev.Txn():
                for cond in e.conditions:
                    if (w[cond.key]["version"] if cond.key in w else 0) != cond.version:
                        raise Rejected("condition_failed")
                for op in e.ops:
                    self._event(w, rows, op, o)   # a failing op raises: the caller drops `w` and `rows`
            case _:
                raise AssertionError(f"the model does not know {type(e).__name__}")

    # --- derived views ---------------------------------------------------------------------------

    def listing(self, prefix: str, *, after: str | None = None, end: str | None = None,
                as_of: int | None = None) -> list[tuple[str, dict]]:
        """(key, state) of the entities under `prefix` (or in [prefix, end)), in key byte order."""
        entities = self.entities if as_of is None else self.at(as_of)
        keys = sorted((k for k in entities
                       if (k.startswith(prefix) if end is None else prefix <= k < end)
                       and (after is None or k.encode() > after.encode())), key=str.encode)
        return [(k, entities[k]) for k in keys]

    def lease_attachments(self) -> set[bytes]:
        """lease_keys rows: every key and session with a lease, under that lease."""
        return {f"{s['lease']:020d}/{k}".encode() for k, s in self.entities.items()
                if k.split("/", 1)[0] in ("kv", "session") and s["lease"]}

    def remembered_requests(self) -> tuple[dict[tuple[str, str], Expected], set[tuple[int, tuple[str, str]]]]:
        """Request ids still within the window after the last offset, and their expiry rows."""
        horizon = self.applied - self.window
        first = {r: o for r, o in self.first.items() if o.offset >= horizon}
        expiry = {(at, r) for at, r in self.requests if at >= horizon}
        return first, expiry


def _new_group(cluster: str, group: str, o: int) -> dict:
    return dict(cluster=cluster, group=group, master=-1, master_epoch=0, sync_state_set=(),
                sync_state_set_epoch=0, brokers={}, version=o, created=o)
