"""Commands, entries and checks shared by the views' model-based tests.

Hypothesis draws *symbolic* commands (`Cmd`): which family, which key from a small pool (so events
collide), and selectors such as "the current version" or "a stale epoch". A command is resolved
into a real event against the model just before the model applies it, so a compare-and-set or an
epoch can be right or wrong on purpose, and a failing example prints as a short list of commands
that replays exactly.

The checks compare every read of `statemachines.query.Query` with the model, and the internal
column families (lease attachments, remembered request ids) with what the model derives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec
from hypothesis import strategies as st

from eventlog.raft.types import Entry, EntryKind
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines.query import Item, Page, Query
from statemachines.state import Outcome, decode_outcome, decode_state
from statemachines.store import ALL_CFS, ENTITY_CFS, ViewStore, decode_offset
from tests.statemachines.model import EVENT, INVALID, MALFORMED, WRONG_KEY, Expected, Model

# A passing test takes seconds; a failing one is shrunk for up to 300 s (Hypothesis' own limit)
# before it is printed, which the suite's default 300 s timeout would cut short.
SHRINK_TIMEOUT_S = 900

# --- key pools: small, so events meet on the same keys -------------------------------------------

KV_NAMES = ("a", "a/b", "a/c", "ab", "b")
LEASES = (1, 2, 3)
CLUSTER = "c1"
GROUPS = ("g1", "g2")
BROKERS = ("b0", "b1")
TOPICS = ("t1", "t10", "t2")           # "topic/t1" is a prefix of "topic/t10"
CONSUMERS = ("cg1", "cg2")
OFFSET_TOPICS = ("t1", "t2")
SESSIONS = ("s1", "s2")
CONFIGS = ("x", "y")
ACTORS = ("", "alice")
REQUEST_IDS = ("r1", "r2", "r3")


def _broker(i: int) -> tuple[str, str]:
    return GROUPS[i // len(BROKERS) % len(GROUPS)], BROKERS[i % len(BROKERS)]


UNIVERSE: tuple[str, ...] = (
    *(f"kv/{n}" for n in KV_NAMES),
    *(f"lease/{i:020d}" for i in LEASES),
    *(f"broker/{CLUSTER}/{g}/{b}" for g in GROUPS for b in BROKERS),
    *(f"group/{CLUSTER}/{g}" for g in GROUPS),
    *(f"topic/{t}" for t in TOPICS),
    *(f"offset/{c}/{t}/{q}" for c in CONSUMERS for t in OFFSET_TOPICS for q in (0, 1)),
    *(f"session/{s}" for s in SESSIONS),
    *(f"config/cluster/{n}" for n in CONFIGS),
)
PREFIXES = ("kv/", "kv/a", "kv/a/", "kv/b", "lease/", "broker/", f"broker/{CLUSTER}/g1/", "group/", "topic/",
            "topic/t1", "offset/", "offset/cg1/", "session/", "config/")
RANGES = (("kv/a", "kv/b"), ("kv/a/c", "kv/b"), ("topic/t1", "topic/t2"),
          ("offset/cg1/t2/", "offset/cg2/t2/"))


# --- symbolic commands ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Cmd:
    """One record to append, in terms of the key pools and the model's state (see `resolve`)."""

    op: str
    target: int = 0
    arg: int = 0
    arg2: int = 0
    cas: str | None = None                 # None, "absent", "current", "wrong"
    actor: str = ""
    request_id: str = ""
    ops: tuple[Cmd, ...] = ()              # Txn operations
    conds: tuple[tuple[int, str], ...] = ()  # Txn conditions: (index into UNIVERSE, selector)


# Op names, repeated to weight the mix: enough grants for leases to matter, enough creations for
# updates and deletions to find something.
TXN_OPS = ("kv_put", "kv_put", "kv_put", "kv_delete", "offset", "config", "topic_create", "topic_create",
           "topic_update", "topic_delete")
PLAIN_OPS = ("kv_put", "kv_put", "kv_put", "kv_put", "kv_delete", "kv_delete", "offset", "config", "config",
             "topic_create", "topic_create", "topic_update", "topic_update", "topic_delete",
             "lease_grant", "lease_grant", "lease_grant", "lease_revoke", "lease_revoke", "lease_expire",
             "lease_expire", "session_open", "session_open", "session_close",
             "broker_register", "broker_register", "broker_fence", "broker_unfence", "broker_unregister",
             "master_elected", "master_elected", "sync_state_set", "sync_state_set")

_small = st.integers(0, 7)
_cas = st.sampled_from((None, None, "absent", "current", "current", "wrong"))


def _plain(ops: Sequence[str]) -> st.SearchStrategy[Cmd]:
    return st.builds(Cmd, op=st.sampled_from(ops), target=_small, arg=_small, arg2=_small, cas=_cas)


def _with_request(cmd: st.SearchStrategy[Cmd]) -> st.SearchStrategy[Cmd]:
    return st.builds(lambda c, actor, rid: dataclasses.replace(c, actor=actor, request_id=rid),
                     cmd, st.sampled_from(ACTORS), st.sampled_from(("", "", "", *REQUEST_IDS)))


_txn = st.builds(lambda ops, conds: Cmd("txn", ops=ops, conds=conds),
                 st.lists(_plain(TXN_OPS), min_size=1, max_size=3).map(tuple),
                 st.lists(st.tuples(st.integers(0, len(UNIVERSE) - 1),
                                    st.sampled_from(("absent", "current", "current", "wrong"))),
                          max_size=2).map(tuple))
_plain_cmd = _with_request(_plain(PLAIN_OPS))
_txn_cmd = _with_request(_txn)
_retry = st.builds(Cmd, op=st.just("retry"), target=_small)
_bad = st.builds(Cmd, op=st.sampled_from(("invalid", "malformed", "wrong_key")), target=_small,
                 actor=st.sampled_from(ACTORS), request_id=st.sampled_from(("", *REQUEST_IDS)))
# In 10 records: 6 plain events, 2 transactions, 1 retry, 1 bad record (one_of would merge repeated
# branches, so the weights are a sampled index).
_WEIGHTED = (*[_plain_cmd] * 6, _txn_cmd, _txn_cmd, _retry, _bad)
commands: st.SearchStrategy[Cmd] = st.integers(0, len(_WEIGHTED) - 1).flatmap(lambda i: _WEIGHTED[i])
NOOP = "noop"
# An entry is NOOP (no records: a new leader's entry) or 1-4 records; an apply call gets 1-4 entries.
_records = st.lists(commands, min_size=1, max_size=4).map(tuple)
entry_cmds = st.integers(0, 7).flatmap(lambda i: st.just(NOOP) if i == 0 else _records)
apply_calls = st.lists(entry_cmds, min_size=1, max_size=4).map(tuple)
programs = st.lists(entry_cmds, min_size=1, max_size=40).map(tuple)


# --- resolving commands against the model ---------------------------------------------------------

@dataclass(frozen=True)
class Record:
    key: bytes
    value: bytes
    kind: str
    event: ev.Event | None


def _version(model: Model, key: str, selector: str | None) -> int | None:
    current = model.version(key)
    return {None: None, "absent": 0, "current": current, "wrong": current - 1 if current > 0 else 7}[selector]


def _lease(m: Model, a: int) -> int:
    """0-2: no lease; 3-4: a pooled id (which may not exist); 5-7: a live lease if there is one."""
    if a < 3:
        return 0
    live = [i for i in LEASES if f"lease/{i:020d}" in m.entities]
    return live[a % len(live)] if a >= 5 and live else LEASES[a % len(LEASES)]


def _event(c: Cmd, m: Model) -> ev.Event:
    """The event `c` stands for, given the model's current state."""
    common = dict(actor=c.actor, request_id=c.request_id)
    t, a, a2 = c.target, c.arg, c.arg2
    match c.op:
        case "kv_put":
            name = KV_NAMES[t % len(KV_NAMES)]
            return ev.KvPut(name=name, value=bytes([a2]) * (a2 % 3), lease=_lease(m, a),
                            expected_version=_version(m, f"kv/{name}", c.cas), **common)
        case "kv_delete":
            name = KV_NAMES[t % len(KV_NAMES)]
            return ev.KvDeleted(name=name, expected_version=_version(m, f"kv/{name}", c.cas), **common)
        case "offset":
            return ev.OffsetCommitted(consumer_group=CONSUMERS[t % 2], topic=OFFSET_TOPICS[a % 2],
                                      queue_id=a2 % 2, offset=t * 10 + a2, **common)
        case "config":
            return ev.ConfigChanged(scope="cluster", name=CONFIGS[t % 2], value=None if a < 3 else f"v{a2}",
                                    **common)
        case "topic_create":
            return ev.TopicCreated(name=TOPICS[t % 3], read_queues=a, write_queues=a2, perm=(a + a2) % 8,
                                   broker_groups=GROUPS[: a % 3],
                                   config={"retention": str(a2)} if a2 % 2 else {}, **common)
        case "topic_update":
            name = TOPICS[t % 3]
            return ev.TopicUpdated(name=name, read_queues=a if a % 2 else None,
                                   perm=a2 % 8 if a2 % 2 else None,
                                   broker_groups=GROUPS[: a2 % 3] if a2 > 3 else None,
                                   config={"k": str(a)} if a > 4 else None,
                                   expected_version=_version(m, f"topic/{name}", c.cas), **common)
        case "topic_delete":
            name = TOPICS[t % 3]
            return ev.TopicDeleted(name=name, expected_version=_version(m, f"topic/{name}", c.cas), **common)
        case "lease_grant":
            return ev.LeaseGranted(lease_id=LEASES[t % 3], ttl_ms=1000 * (a + 1), **common)
        case "lease_revoke":
            return ev.LeaseRevoked(lease_id=_lease(m, 3 + t % 5), **common)
        case "lease_expire":
            lease_id = _lease(m, 3 + t % 5)
            return ev.LeaseExpired(lease_id=lease_id, actor=c.actor,
                                   request_id=c.request_id or f"expire/{lease_id}/{a}")
        case "session_open":
            return ev.SessionOpened(client_id=SESSIONS[t % 2], node=f"n{a2 % 3}", clean=a2 % 2 == 1,
                                    lease=_lease(m, a), **common)
        case "session_close":
            return ev.SessionClosed(client_id=SESSIONS[t % 2], **common)
        case "broker_register" | "broker_fence" | "broker_unfence" | "broker_unregister":
            group, name = _broker(t)
            live = [_broker(i) for i in range(len(GROUPS) * len(BROKERS))
                    if f"broker/{CLUSTER}/{_broker(i)[0]}/{_broker(i)[1]}" in m.entities]
            if c.op != "broker_register" and live and (t + a2) % 4:     # mostly a registered broker
                group, name = live[t % len(live)]
            state = m.entities.get(f"broker/{CLUSTER}/{group}/{name}")
            current = state["broker_epoch"] if state else 0
            if c.op == "broker_register":
                epoch = max(1, current + (0, 1, 1, -1, 2)[a % 5])        # equal or lower: stale
                return ev.BrokerRegistered(cluster=CLUSTER, group=group, name=name,
                                           address=f"10.0.0.{t}:10911", incarnation=f"i{a2}", broker_id=t % 4,
                                           broker_epoch=epoch, **common)
            epoch = current + (0, 0, 0, 1, -1)[a % 5] if current else a % 2 + 1
            kind = {"broker_fence": ev.BrokerFenced, "broker_unfence": ev.BrokerUnfenced,
                    "broker_unregister": ev.BrokerUnregistered}[c.op]
            return kind(cluster=CLUSTER, group=group, name=name, broker_epoch=epoch, **common)
        case "master_elected" | "sync_state_set":
            group = GROUPS[t % 2]
            state = m.entities.get(f"group/{CLUSTER}/{group}")
            master_epoch = state["master_epoch"] if state else 0
            sss_epoch = state["sync_state_set_epoch"] if state else 0
            master = state["master"] if state else -1
            if a % 4 == 2:
                master_epoch += 1                                             # stale (from the future)
            if c.op == "master_elected":
                new_master = t % 3 - 1
                sync = ((), (new_master,), (0, 1), (1, 0, 1))[a2 % 4] if new_master >= 0 else ()
                return ev.MasterElected(cluster=CLUSTER, group=group, master=new_master,
                                        master_epoch=master_epoch, sync_state_set=sync, **common)
            if a % 4 == 3:
                sss_epoch = max(0, sss_epoch - 1)
            sync = ((master,), (master, 1 - master), (1 - master,), (0, 1))[a2 % 4]
            return ev.SyncStateSetChanged(cluster=CLUSTER, group=group, sync_state_set=sync,
                                          master_epoch=master_epoch, sync_state_set_epoch=sss_epoch, **common)
        case "txn":
            conds = tuple(ev.Condition(UNIVERSE[i], _version(m, UNIVERSE[i], sel) or 0) for i, sel in c.conds)
            ops, keys = [], set()
            for op in c.ops:
                e = _event(op, m)
                if e.key() not in keys:          # a transaction touches each key once
                    keys.add(e.key())
                    ops.append(e)
            return ev.Txn(conditions=conds, ops=tuple(ops), **common)  # type: ignore[arg-type]
    raise AssertionError(c.op)


def resolve(c: Cmd, m: Model, sent: list[Record]) -> Record:
    if c.op == "retry":
        if sent:
            return sent[-1 - c.target % len(sent)]         # the very same bytes, sent again
        c = Cmd("offset", target=c.target)                 # nothing to retry yet
    if c.op == "malformed":
        return Record(b"kv/a", b"\x93garbage", MALFORMED, None)
    if c.op == "wrong_key":
        e = ev.KvPut(name="a", value=b"w", actor=c.actor, request_id=c.request_id)
        return Record(b"kv/not-a", ev.encode_event(e), WRONG_KEY, e)
    if c.op == "invalid":
        who = dict(actor=c.actor, request_id=c.request_id)
        e = (ev.TopicCreated(name="t1", read_queues=5000, **who) if c.target % 2
             else ev.KvPut(name="a", value=b"x", lease=-1, **who))
        return Record(e.key().encode(), ev.encode_event(e), INVALID, e)
    e = _event(c, m)
    key, value = ev.event_record(e)
    return Record(key, value, EVENT, e)


def build(calls: Sequence[Sequence[str | tuple[Cmd, ...]]], model: Model, sent: list[Record]
          ) -> tuple[list[list[Entry]], dict[int, Expected]]:
    """Turn apply calls (lists of entry commands) into raft entries, applying them to the model."""
    out: list[list[Entry]] = []
    expected: dict[int, Expected] = {}
    for call in calls:
        entries = []
        for cmds in call:
            index = model.applied + 1
            if cmds == NOOP:
                model.skip(index)
                entries.append(Entry(index, 1, 1, EntryKind.NOOP))
                continue
            records = []
            for i, c in enumerate(cmds):
                record = resolve(c, model, sent)   # type: ignore[arg-type]
                expected[index + i] = model.apply(index + i, record.kind, record.event)
                if record.event is not None and record.event.request_id and record.kind != WRONG_KEY:
                    sent.append(record)
                records.append((record.key, record.value))
            data = bytearray(encode_batch(records, timestamp_ms=1_700_000_000_000))
            stamp(data, index, 1)
            entries.append(Entry(index, 1, len(records), EntryKind.NORMAL, bytes(data)))
        out.append(entries)
    return out, expected


def check_outcomes(got: dict[int, Outcome], expected: dict[int, Expected]) -> None:
    assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
    for offset, want in expected.items():
        o = got[offset]
        assert (o.ok, o.offset, o.code, o.duplicate) == (want.ok, want.offset, want.code, want.duplicate), \
            f"offset {offset}: got {o}, model says {want}"
        assert bool(o.message) == (not o.ok), o


# --- reads against the model ----------------------------------------------------------------------

def _same(item: Item | None, key: str, state: dict | None) -> None:
    if state is None:
        assert item is None, f"{key}: views have {item}, model has nothing"
        return
    assert item is not None, f"{key}: views have nothing, model has {state}"
    assert (item.key, msgspec.structs.asdict(item.state), item.version) == (key, state, state["version"]), \
        f"{key}: views {item}, model {state}"


def _pages(fetch: Callable[[str | None], Page], limit: int) -> list[Item]:
    """Follow continuation tokens to the end; every page but the last is full."""
    items: list[Item] = []
    after = None
    while True:
        page = fetch(after)
        assert len(page.items) <= limit
        items += page.items
        if page.next is None:
            return items
        assert len(page.items) == limit and page.next == page.items[-1].key, page
        after = page.next
        assert len(items) <= len(UNIVERSE), "pagination does not end"


def _same_list(items: Sequence[Item], want: Sequence[tuple[str, dict]], what: str) -> None:
    assert [i.key for i in items] == [k for k, _ in want], what
    for item, (key, state) in zip(items, want, strict=True):
        _same(item, key, state)


def check_reads(q: Query, model: Model, *, as_of: int | None, limit: int, after_pick: int = 0) -> None:
    """get every key, list every prefix and range page by page, at the head or at a past offset."""
    entities = model.entities if as_of is None else model.at(as_of)
    for key in UNIVERSE:
        _same(q.get(key, as_of=as_of), key, entities.get(key))
    for prefix in PREFIXES:
        items = _pages(lambda after: q.list(prefix, limit=limit, after=after, as_of=as_of), limit)
        _same_list(items, model.listing(prefix, as_of=as_of), f"list {prefix!r} limit {limit} as_of {as_of}")
        after = UNIVERSE[after_pick % len(UNIVERSE)]   # any key (present or not) as the token
        page = q.list(prefix, limit=len(UNIVERSE), after=after, as_of=as_of)
        _same_list(page.items, model.listing(prefix, after=after, as_of=as_of),
                   f"list {prefix!r} after {after!r} as_of {as_of}")
        assert page.next is None
    for start, end in RANGES:
        items = _pages(lambda after: q.range(start, end, limit=limit, after=after, as_of=as_of), limit)
        _same_list(items, model.listing(start, end=end, as_of=as_of),
                   f"range [{start!r}, {end!r}) as_of {as_of}")


def check_history(q: Query, model: Model, *, after_pick: int = 0) -> None:
    for key in UNIVERSE:
        want = model.history.get(key, [])
        rows = [(r.offset, r.event, None if r.state is None else msgspec.structs.asdict(r.state))
                for r in q.history(key)]
        assert rows == want, f"history of {key}"
        if want:
            cut = want[after_pick % len(want)][0]
            assert [r.offset for r in q.history(key, after_offset=cut)] == [o for o, _, _ in want if o > cut]
            assert [r.offset for r in q.history(key, limit=1)] == [want[0][0]]


def check_internals(store: ViewStore, model: Model) -> None:
    """Column families the queries do not show: they must hold exactly what the model derives."""
    assert store.applied == model.applied
    for kind, cf in ENTITY_CFS.items():
        rows = {k.decode(): msgspec.structs.asdict(decode_state(k, v)) for k, v in store.scan(cf, b"")}
        assert rows == {k: s for k, s in model.entities.items() if k.split("/", 1)[0] == kind}, cf
    versions = {(k[:-9].decode(), decode_offset(k[-8:])) for k, _ in store.scan("versions", b"")}
    assert versions == {(k, o) for k, rows in model.history.items() for o, _, _ in rows}
    assert {k for k, _ in store.scan("lease_keys", b"")} == model.lease_attachments()
    first, expiry = model.remembered_requests()
    dedupe = {tuple(k.decode().split("\x00")): decode_outcome(v) for k, v in store.scan("dedupe", b"")}
    assert {r: (o.ok, o.offset, o.code) for r, o in dedupe.items()} == \
           {r: (o.ok, o.offset, o.code) for r, o in first.items()}, "remembered request ids"
    rows = {(decode_offset(k[:8]), tuple(k[8:].decode().split("\x00")))
            for k, _ in store.scan("dedupe_expiry", b"")}
    assert rows == expiry, "request id expiry index"


# --- whole-database comparisons ------------------------------------------------------------------

def dump(store: ViewStore) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every key and value of every column family, the default (meta) one included."""
    out = {cf: list(store.scan(cf, b"")) for cf in ALL_CFS}
    it = store.db.iter()
    it.seek_to_first()
    meta = []
    while it.valid():
        meta.append((it.key(), it.value()))
        it.next()
    out["default"] = meta
    return out


def read_everything(q: Query, applied: int) -> list[object]:
    """Every read a client could make of the pooled keys, at the head and at every past offset."""
    out: list[object] = []
    for as_of in (None, *range(-1, applied + 1)):
        out += [q.get(k, as_of=as_of) for k in UNIVERSE]
        out += [q.list(p, limit=3, as_of=as_of) for p in PREFIXES]
    out += [q.history(k) for k in UNIVERSE]
    return out

