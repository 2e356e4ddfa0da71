"""Client sessions: a write is applied at most once, whatever retries, leader changes and compaction do.

Theory of operation (the Raft dissertation, section 6.3; Kafka's producer ids). A writing client
opens a session in a group with a `ClientSessionOpened` event; the session's id is the offset that
record commits at plus one (`session_id_at`: 0 means "no session"), unique in the group's log whichever
leader committed it. The client numbers its
requests (`seq`, from 1) and says, with each, below which sequence every request of the session was
answered (`answered_below`). Every replica keeps, per live session, the outcome of each request from
the lowest sequence still unanswered on, in the views: snapshots carry them, and neither the history
floor nor log compaction touches them. Applying a request of a session:

- its outcome is kept: it is a retry, answered with the first outcome; it changes nothing;
- the session is unknown or expired, or the request's sequence is below what the session keeps: it
  is refused with `session_expired` (it may have been applied once, and is never applied again);
- otherwise it is applied and its outcome kept.

Time is the committed clock (`Clock`): the leader's append timestamps of the entries, made monotonic
(the highest seen so far), so every replica expires the same sessions at the same offset. A session
lives `timeout_ms` past its latest request. The leader that proposes `ClientSessionOpened` stamps the
timeout and the bounds from its `[views]` config, so replicas never apply their own config: at most
`max_outcomes` outcomes per session (older ones are forgotten as if answered) and `max_sessions` live
sessions in the group (opening one more evicts the session closest to its deadline first). Expired
sessions are dropped by the entries that follow, a few per entry (statemachines/deadlines.py), so a
burst of expiries drains over several entries instead of stalling one apply.

Rows (column families of statemachines/store.py):

    client_sessions    8-byte session id -> ClientSession
    session_outcomes   8-byte session id + 8-byte seq -> the request's Outcome; from views format level 3
                       (statemachines/views_format.py) an ok request extends its session's run row instead:
                       8-byte session id + the run's first seq -> OkRun(first offset, count)
    session_deadlines  8-byte deadline (ms) + 8-byte session id -> b"" (expiry and eviction order)
    meta               b"client_sessions_live": 8-byte count of live sessions;
                       b"client_sessions_checked_ms": when entries last found no more expired sessions;
                       b"committed_ms": the committed clock

Pure functions of the committed records over the applier's pending writes: call from the applier.
Which sequences have an outcome row is read from the applier's in-memory mirror of them
(statemachines/kept_outcomes.py), kept in step with every outcome row written or deleted here.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Final

import msgspec

from eventlog.errors import SESSION_EXPIRED
from statemachines import events as ev
from statemachines import views_format
from statemachines.deadlines import Deadlines
from statemachines.kept_outcomes import KeptOutcomes, RunSet, SeqSet
from statemachines.state import Outcome, decode_outcome, encode
from statemachines.store_keys import META, decode_offset, encode_offset, prefix_upper_bound

if TYPE_CHECKING:
    from statemachines.apply import Overlay

SESSIONS: Final = "client_sessions"
OUTCOMES: Final = "session_outcomes"
DEADLINES: Final = Deadlines("session_deadlines", live=b"client_sessions_live",
                             checked=b"client_sessions_checked_ms", per_entry=4)
"""Expiry order; at most 4 expired sessions dropped per entry (each takes its kept outcomes with it)."""
COMMITTED_MS: Final = b"committed_ms"
DEADLINE_STEP: Final = 8
"""A session's deadline row moves only once the deadline advanced by timeout/DEADLINE_STEP: one write
per request fewer, for a session that may expire up to that much early."""
_FORGET_ONE_BY_ONE: Final = 64


class ClientSession(msgspec.Struct, frozen=True, array_like=True):
    """A live session: its bounds (stamped when it opened), when it expires, and from which sequence
    its outcomes are kept (requests below are refused)."""

    client: str
    timeout_ms: int
    max_outcomes: int
    deadline_ms: int
    kept_from: int = 1


_session_decoder = msgspec.msgpack.Decoder(ClientSession)


class OkRun(msgspec.Struct, frozen=True, array_like=True):
    """At level 3: the outcome row of a run of a session's requests, keyed by its first sequence: the
    `count` requests from that sequence on were ok at offsets `offset`, `offset` + 1, ... in order.

    Its value is a msgpack array of 2; an `Outcome` row's is an array of 5 (`_is_run` tells them apart)."""

    offset: int
    count: int


_run_decoder = msgspec.msgpack.Decoder(OkRun)
_RUN_HEAD: Final = 0x92   # msgpack fixarray of 2 (an Outcome is a fixarray of 5: 0x95)


def _is_run(raw: bytes) -> bool:
    return raw[0] == _RUN_HEAD


def decode_outcome_row(raw: bytes) -> OkRun | Outcome:
    """The value of a `session_outcomes` row: a run (level 3) or one request's outcome."""
    return _run_decoder.decode(raw) if _is_run(raw) else decode_outcome(raw)


def _plain_ok(outcome: Outcome) -> bool:
    """An outcome a run row can stand for: ok, nothing said, at its own offset (what a retry rebuilds)."""
    return outcome.ok and not outcome.code and not outcome.message and not outcome.duplicate


class Clock:
    """The committed clock of a group: the highest leader timestamp of the entries applied so far."""

    @staticmethod
    def advance(ov: Overlay, entry_max_timestamp: int) -> int:
        raw = ov.get(META, COMMITTED_MS)
        now = decode_offset(raw) if raw is not None else 0
        if entry_max_timestamp > now:
            now = entry_max_timestamp
            ov.put(META, COMMITTED_MS, encode_offset(now))
        return now

    @staticmethod
    def now(ov: Overlay) -> int:
        raw = ov.get(META, COMMITTED_MS)
        return decode_offset(raw) if raw is not None else 0


def session_id_at(offset: int) -> int:
    """The id of the session opened by the record at `offset` (0 is no session; offsets start at 0)."""
    return offset + 1


def _id(session_id: int) -> bytes:
    return encode_offset(session_id)


def _outcome_key(session_id: int, seq: int) -> bytes:
    return _TWO_OFFSETS(session_id, seq)


_TWO_OFFSETS: Final = struct.Struct(">qq").pack


def _refused(offset: int, message: str) -> Outcome:
    return Outcome(False, offset, SESSION_EXPIRED, message)


def open_session(ov: Overlay, kept: KeptOutcomes, e: ev.ClientSessionOpened, offset: int,
                 now_ms: int) -> Outcome:
    """Apply `ClientSessionOpened` at `offset`: that session is live until now + timeout."""
    while DEADLINES.count(ov) >= e.max_sessions:   # evict the one closest to its deadline (LRU for equal timeouts)
        first = DEADLINES.first(ov)
        if first is None:
            break
        _evict(ov, kept, *first)
    deadline = now_ms + e.timeout_ms
    sid = session_id_at(offset)
    ov.put(SESSIONS, _id(sid), encode(ClientSession(e.client, e.timeout_ms, e.max_outcomes, deadline)))
    DEADLINES.add(ov, deadline, _id(sid))
    return Outcome(True, offset)


def close_session(ov: Overlay, kept: KeptOutcomes, e: ev.ClientSessionClosed, offset: int) -> Outcome:
    """Apply `ClientSessionClosed` (admitted as a request of its session): the session goes."""
    if ov.get(SESSIONS, _id(e.session_id)) is None:
        return _refused(offset, f"session {e.session_id} is not open")
    _drop(ov, kept, e.session_id)
    return Outcome(True, offset)


class Admission(msgspec.Struct, frozen=True):
    """What `admit` decided: `outcome` is the answer when the request must not be applied (a retry's
    first outcome, or a refusal); else None and `session` is the state to `record` the outcome in, `seqs`
    its kept sequences."""

    outcome: Outcome | None
    session: ClientSession | None
    seqs: SeqSet | RunSet | None = None


def admit(ov: Overlay, kept: KeptOutcomes, e: ev.Event, offset: int, now_ms: int, level: int) -> Admission:
    """Decide whether the request `e` of a session (at `offset`) is applied (see the module docstring);
    `level`: the views format level (statemachines/views_format.py), which says how outcomes are kept."""
    sid = e.session_id
    raw = ov.get(SESSIONS, _id(sid))
    if raw is None:
        return Admission(_refused(offset, f"session {sid} of group is unknown or expired: the request may have "
                                          f"been applied before, and is not applied again"), None)
    session = _session_decoder.decode(raw)
    if now_ms >= session.deadline_ms:
        _drop(ov, kept, sid)
        return Admission(_refused(offset, f"session {sid} expired (no request for {session.timeout_ms} ms): the "
                                          f"request may have been applied before, and is not applied again"), None)
    kept_from = session.kept_from
    seqs = _kept_seqs(ov, kept, sid, level)
    if e.answered_below > kept_from:
        _forget(ov, seqs, sid, kept_from, e.answered_below)
        kept_from = e.answered_below
    session = _touch(ov, sid, session, kept_from, now_ms)
    if e.seq < kept_from:
        return Admission(_refused(offset, f"request {e.seq} of session {sid} was answered and forgotten (the "
                                          f"session keeps requests from {kept_from} on): not applied again"), None)
    if e.seq not in seqs:   # no outcome row (the mirror says so without a lookup of the absent key)
        return Admission(None, session, seqs)
    start = seqs.row_start(e.seq) if isinstance(seqs, RunSet) else e.seq
    first = ov.get(OUTCOMES, _outcome_key(sid, start))
    assert first is not None, f"the kept outcomes of session {sid} lost sequence {e.seq}"
    o = decode_outcome_row(first)
    if isinstance(o, OkRun):   # a run row: request `start` + i was ok at the run's offset + i
        assert start <= e.seq < start + o.count, f"session {sid}'s run at {start} does not hold {e.seq}"
        return Admission(Outcome(True, o.offset + e.seq - start, duplicate=True), None)
    return Admission(Outcome(o.ok, o.offset, o.code, o.message, duplicate=True), None)


def record(ov: Overlay, admitted: Admission, e: ev.Event, outcome: Outcome) -> None:
    """Keep the outcome of an admitted request (if its session is still live: a close ends it)."""
    sid = e.session_id
    if ov.get(SESSIONS, _id(sid)) is None:
        return
    session, seqs = admitted.session, admitted.seqs
    assert session is not None and seqs is not None, "record only what admit let through"
    if isinstance(seqs, SeqSet):   # levels 1 and 2: a row per request
        ov.put(OUTCOMES, _outcome_key(sid, e.seq), encode(outcome))
        seqs.add(e.seq)
    elif _plain_ok(outcome):   # level 3: the run this request extends, or a new one
        start, first_offset, count = seqs.add_ok(e.seq, outcome.offset)
        ov.put(OUTCOMES, _outcome_key(sid, start), encode(OkRun(first_offset, count)))
    else:
        ov.put(OUTCOMES, _outcome_key(sid, e.seq), encode(outcome))
        seqs.add_outcome(e.seq)
    if e.seq >= session.kept_from + session.max_outcomes:   # keep at most max_outcomes: forget the oldest
        kept_from = e.seq - session.max_outcomes + 1
        _forget(ov, seqs, sid, session.kept_from, kept_from)
        ov.put(SESSIONS, _id(sid), encode(msgspec.structs.replace(session, kept_from=kept_from)))


class RunExtension:
    """The next requests of a session that extend its run row, admitted and kept without `admit` and
    `record` (level 3): what those two would decide and write, for the requests an entry holds in a row.

    A write of n requests of one session commits as n consecutive records: request seq + i at offset
    o + i, each saying the same `answered_below`. After the first is admitted and recorded (an ok run
    ending at it), the next one's admission decides the same as the first's and changes nothing (same
    committed time, so the deadline stays where the first moved it; the same or a lower `answered_below`,
    so nothing is forgotten; a sequence above every kept one, so no retry), and its record extends the
    same run (the next sequence, ok at the next offset): `admits` checks exactly these conditions, and
    `extend` keeps the mirror in step. The run row, which `record` would rewrite per request, is written
    once, by `close`, with the bytes the last `record` would have written; the caller closes the
    extension before anything else of the entry runs (another record, the entry's expiries), so nothing
    reads the row meanwhile. Holds state of one entry's apply only; from the applier's loop."""

    __slots__ = ("sid", "session", "seqs", "next_seq", "next_offset", "seq_limit", "extended")

    def __init__(self, sid: int, session: ClientSession, seqs: RunSet, next_seq: int, next_offset: int) -> None:
        self.sid = sid
        self.session = session
        self.seqs = seqs
        self.next_seq = next_seq
        self.next_offset = next_offset
        self.seq_limit = session.kept_from + session.max_outcomes   # `record` forgets from there on
        self.extended = False

    @staticmethod
    def start(ov: Overlay, admitted: Admission, e: ev.Event, outcome: Outcome, level: int,
              following: ev.Event, offset: int) -> RunExtension | None:
        """The extension that admits `following` (at `offset`), the record after request `e`, which was
        admitted and `record`ed with `outcome`: None unless `e` is a plain ok request now ending an ok run
        row of its live session, at level 3, which `record` left the session row alone for (below
        `max_outcomes`), and `following` is the run's next (`admits`)."""
        session, seqs = admitted.session, admitted.seqs
        if (following.session_id != e.session_id or following.seq != e.seq + 1 or offset != outcome.offset + 1
                or session is None or following.answered_below > session.kept_from):
            return None   # first what the records say (single puts: each request answers the one before)
        if (level < views_format.OUTCOME_RUNS or not isinstance(seqs, RunSet) or not _plain_ok(outcome)
                or e.seq + 1 >= session.kept_from + session.max_outcomes):
            return None
        if not seqs.ends or seqs.ends[-1] != e.seq + 1 or seqs.offsets[-1] < 0 \
                or seqs.offsets[-1] + (e.seq - seqs.starts[-1]) != outcome.offset:
            return None
        if ov.get(SESSIONS, _id(e.session_id)) is None:
            return None
        return RunExtension(e.session_id, session, seqs, e.seq + 1, outcome.offset + 1)

    def admits(self, e: ev.Event, offset: int) -> bool:
        """Whether request `e` at `offset` is the run's next: `admit` would let it through with this
        session and mirror (the admission of the one before, unchanged)."""
        return (e.session_id == self.sid and e.seq == self.next_seq and offset == self.next_offset
                and e.seq < self.seq_limit and e.answered_below <= self.session.kept_from)

    def admission(self) -> Admission:
        """What `admit` gives the next request (for `record` when it did not end plain ok)."""
        return Admission(None, self.session, self.seqs)

    def extend(self) -> None:
        """The next request was ok at the next offset (a plain ok outcome): the run holds it."""
        self.seqs.ends[-1] = self.next_seq + 1
        self.next_seq += 1
        self.next_offset += 1
        self.extended = True

    def close(self, ov: Overlay) -> None:
        """Write the run row as the last `record` would have (if any request extended it)."""
        if self.extended:
            seqs = self.seqs
            start = seqs.starts[-1]
            ov.put(OUTCOMES, _outcome_key(self.sid, start), encode(OkRun(seqs.offsets[-1], seqs.ends[-1] - start)))
            self.extended = False


def expire(ov: Overlay, kept: KeptOutcomes, now_ms: int) -> None:
    """Drop sessions whose deadline passed (a few per entry: statemachines/deadlines.py); call once per entry."""
    for deadline, key in DEADLINES.due(ov, now_ms):
        _evict(ov, kept, deadline, key)


def _touch(ov: Overlay, sid: int, s: ClientSession, kept_from: int, now_ms: int) -> ClientSession:
    """The session after a request at `now_ms`: its deadline pushed on (in steps), `kept_from` raised."""
    deadline = s.deadline_ms
    if now_ms + s.timeout_ms - deadline >= max(1, s.timeout_ms // DEADLINE_STEP):
        DEADLINES.move(ov, deadline, now_ms + s.timeout_ms, _id(sid))
        deadline = now_ms + s.timeout_ms
    if deadline == s.deadline_ms and kept_from == s.kept_from:
        return s
    s = msgspec.structs.replace(s, deadline_ms=deadline, kept_from=kept_from)
    ov.put(SESSIONS, _id(sid), encode(s))
    return s


def _kept_seqs(ov: Overlay, kept: KeptOutcomes, sid: int, level: int) -> SeqSet | RunSet:
    """The sequences of `sid` with an outcome row (from level 3, the rows): from the mirror, or read
    from the views into it. The mirror holds what is of the views' level (it is cleared at a raise)."""
    seqs = kept.held(sid)
    if seqs is None:
        prefix = _id(sid)
        rows = ov.scan(OUTCOMES, prefix, prefix_upper_bound(prefix))
        if level < views_format.OUTCOME_RUNS:
            return kept.hold(sid, [decode_offset(key[8:]) for key, _ in rows])
        return kept.hold_rows(sid, [_row_bounds(key, value) for key, value in rows])
    assert isinstance(seqs, RunSet) == (level >= views_format.OUTCOME_RUNS), f"the mirror holds session {sid} of another level"
    return seqs


def _row_bounds(key: bytes, value: bytes) -> tuple[int, int, int]:
    """(first sequence, count, offset of a run or -1) of an outcome row at level 3."""
    start = decode_offset(key[8:])
    if _is_run(value):
        run = _run_decoder.decode(value)
        return start, run.count, run.offset
    return start, 1, -1


def _forget(ov: Overlay, seqs: SeqSet | RunSet, sid: int, lo: int, hi: int) -> None:
    """Delete the kept outcomes of sequences [lo, hi). Levels 1 and 2: one by one when few (a tombstone
    for each, kept or not: the writes, hence the digest, views written before the mirror have), else
    those kept. Level 3: each row wholly in the range, and a run it cuts rewritten (what is left of it
    from `hi` on is keyed at `hi`)."""
    if isinstance(seqs, RunSet):
        deleted, written = seqs.remove_range(lo, hi)
        for start in deleted:
            ov.delete(OUTCOMES, _outcome_key(sid, start))
        for start, offset, count in written:
            ov.put(OUTCOMES, _outcome_key(sid, start), encode(OkRun(offset, count)))
        return
    forgotten = seqs.remove_range(lo, hi)
    for seq in range(lo, hi) if hi - lo <= _FORGET_ONE_BY_ONE else forgotten:
        ov.delete(OUTCOMES, _outcome_key(sid, seq))


def _drop(ov: Overlay, kept: KeptOutcomes, sid: int) -> None:
    """Remove a live session (its outcomes and deadline row too)."""
    raw = ov.get(SESSIONS, _id(sid))
    if raw is not None:
        _evict(ov, kept, _session_decoder.decode(raw).deadline_ms, _id(sid))


def _evict(ov: Overlay, kept: KeptOutcomes, deadline_ms: int, key: bytes) -> None:
    """Remove the session whose deadline row is (deadline_ms, key), with its outcomes."""
    kept.let_go(decode_offset(key))
    raw = ov.get(SESSIONS, key)
    if raw is not None:
        max_outcomes = _session_decoder.decode(raw).max_outcomes
        for outcome_key, _ in ov.scan(OUTCOMES, key, prefix_upper_bound(key), max_outcomes + 1):
            ov.delete(OUTCOMES, outcome_key)
        ov.delete(SESSIONS, key)
    DEADLINES.remove(ov, deadline_ms, key)
