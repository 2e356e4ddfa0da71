"""Prometheus metrics of a node (served by the admin HTTP endpoint at /metrics).

Three sources, each recorded where it is cheapest:

- per request (RPC latency by operation, errors by operation and code): observed by the client
  service as requests complete;
- per log write (append and fdatasync latency, bytes appended, by group): the log reports timings
  through its `LogObserver` hook (eventlog.log), which this module wires to histograms, so the log
  layer knows nothing of Prometheus; syncs are observed on the log's flusher thread too. These and
  the RPC latency are on the path of every call and write: counted without locks, each thread into
  counts of its own (`LocklessHistogram`, `LocklessCounter`), summed when scraped;
- per group state (offsets, term, leadership, follower lag) and the group's own counters (elections
  started, leader changes, proposals committed, events applied; `RaftGroup.counters`): read from the
  node when scraped, so they cost nothing between scrapes.

Families (counters get the `_total` suffix on the wire):

    epochlog_rpc_seconds{op}                 histogram   client request latency (watches excluded)
    epochlog_rpc_errors_total{op,code}       counter     requests answered with an error
    epochlog_log_append_seconds{group}       histogram   one append of a batch to the segmented log
    epochlog_log_fsync_seconds{group}        histogram   one fdatasync of a segment
    epochlog_log_appended_bytes_total{group} counter
    epochlog_commit_offset{group}            gauge       highest committed offset known here
    epochlog_applied_offset{group}           gauge       highest offset applied to the views
    epochlog_last_offset{group}              gauge       last offset in this node's log
    epochlog_log_start_offset{group}         gauge       first offset still in the log
    epochlog_term{group}                     gauge
    epochlog_leader{group}                   gauge       leader's node id (0: none known)
    epochlog_is_leader{group}                gauge       1 if this node leads
    epochlog_follower_lag{group,peer}        gauge       on the leader: last offset - the peer's match
    epochlog_member_lag_offsets{group,member} gauge      on the leader: commit offset - the member's match
    epochlog_member_lag_seconds{group,member} gauge      on the leader: age of the oldest committed offset
                                                         the member lacks (0: it holds the commit offset)
    epochlog_clock_stalls_total{group}       counter     times the tick clock lagged real time (lease voided)
    epochlog_elections_started_total{group}  counter     terms in which this node campaigned
    epochlog_leader_changes_total{group}     counter     leaderships (term, leader) this node saw
    epochlog_leader_balance_transfers_total{group} counter leaderships this node handed over for leader balance
    epochlog_proposals_committed_total{group} counter    proposals this node led to commit
    epochlog_events_applied_total{group}     counter     events applied to this node's views
    epochlog_applies_prepared_total{group,result} counter on the leader: entries whose apply was prepared
                                                         before their commit; result committed (the commit
                                                         only wrote it), abandoned (applied from scratch) or
                                                         failed (preparing raised: left to the apply)
    epochlog_apply_halted{group}             gauge       1 while the group is halted on this node (a record
                                                         it cannot apply; offset and fix in status, /readyz)
    epochlog_history_floor{group}            gauge       the committed history floor (as_of below: compacted)
    epochlog_snapshot_offset{group}          gauge       the latest snapshot's offset (-1: none)
    epochlog_snapshots_total{group}          counter     snapshots this node took
    epochlog_snapshot_failures_total{group}  counter
    epochlog_snapshots_installed_total{group} counter    snapshots this node installed from the leader
    epochlog_segments_deleted_total{group}   counter     log segments retention deleted
    epochlog_history_rows_pruned_total{group} counter    history rows deleted below the floor
    epochlog_disk_full{group}                gauge       1 while this node refuses writes for lack of disk space
    epochlog_clean_end_offset{group}         gauge       end of the key-compacted range of the log
    epochlog_cleaner_passes_total{group}     counter     key-compaction passes that rewrote segments
    epochlog_cleaner_failures_total{group}   counter
    epochlog_cleaner_bytes_reclaimed_total{group} counter log bytes key compaction reclaimed
    epochlog_cleaner_records_dropped_total{group} counter records it dropped (superseded, tombstones, no-ops)
    epochlog_peer_connections_closed_total{reason} counter peer connections the transport closed or refused:
                                                         tls_handshake, identity, hello_timeout, frame_timeout,
                                                         partial_frames, unauthenticated_connections, bad_frame
                                                         (eventlog.raft.runtime.transport)
    epochlog_peer_messages_dropped_total{reason} counter  peer messages the checks dropped before Raft saw them
                                                         (eventlog/raft/peer_check.py names the reasons)
    epochlog_term_exhausted{group}           gauge       1 once the term reached its limit (2^31 - 1): this node
                                                         can never start another election in the group
    epochlog_loop_stall_seconds              histogram   how late the node's event loop ran a timer, measured
                                                         every tick (epochlog/loop_monitor.py): a leader's
                                                         heartbeats are that late too
    epochlog_loop_stall_own_seconds          histogram   of each such stall, the node's own part: the stall less
                                                         the time the loop's thread was runnable but waited for a
                                                         CPU (the kernel's schedstat), which is the machine's
    epochlog_loop_stall_max_seconds          gauge       the longest such stall since the node started
    epochlog_loop_stalls_total               counter     stalls longer than [cluster] loop_stall_warning_ms
                                                         (each logged at WARNING, at a bounded rate)
    epochlog_log_damaged{group}              gauge       1 while this node's log holds a damaged batch or fetches
                                                         a dropped range again (file, offset, state in status)
    epochlog_log_damage_found_total{group}   counter     damaged batches found in this node's log (reads, scrub)
    epochlog_log_repairs_total{group}        counter     times this node dropped damaged entries to fetch them again
    epochlog_scrub_bytes_total               counter     bytes of sealed segments the scrub checked
    epochlog_scrub_passes_total              counter     scrub passes completed over every log
    epochlog_scrub_last_pass_seconds         gauge       duration of the last pass: the scrub period
    epochlog_scrub_cpu_seconds_total         counter     CPU time of the scrub thread
    epochlog_views_digest_checks_total{group} counter    comparisons of views digests this node made as leader
    epochlog_views_digest_mismatch{group,member} gauge   on the leader: 1 while the member's views digest
                                                         differs from its own at the same applied offset
    epochlog_controller_active               gauge       1 while the controller runs on this node (it leads metadata)
    epochlog_controller_brokers{state}       gauge       on the active controller: registered brokers, `active` or
                                                         `fenced`
    epochlog_controller_broker_groups{master} gauge      on the active controller: broker groups with (`yes`) and
                                                         without (`no`) a live master
    epochlog_controller_heartbeats_total     counter     broker heartbeats this node's controller took
    epochlog_controller_heartbeats_rejected_total counter   ... refused (unknown broker, stale epoch)
    epochlog_controller_fenced_total         counter     brokers it fenced (heartbeat timeout)
    epochlog_controller_elections_total      counter     master elections it committed
    epochlog_controller_activations_total    counter     times it became the active controller

    epochlog_kafka_requests_total{api}       counter     Kafka requests by API (epochlog/kafka/counters.py)
    epochlog_kafka_produced_records_total{topic} counter records appended through the Kafka face
    epochlog_kafka_produced_bytes_total{topic} counter   bytes of the batches they came in
    epochlog_kafka_fetched_records_total{topic} counter  records handed to Kafka consumers
    epochlog_kafka_fetched_bytes_total{topic} counter
    epochlog_kafka_errors_total{api,error}   counter     partitions answered with a Kafka error (Produce, Fetch,
                                                         ListOffsets, OffsetForLeaderEpoch), by Kafka's error name

gRPC calls are counted with the native ones (`epochlog_rpc_seconds{op="grpc_<method>"}`).
"""

from __future__ import annotations

import itertools
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from epochlog.kafka.counters import KafkaCounters
    from epochlog.loop_monitor import LoopMonitor
    from epochlog.node import Node

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_STALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_DISK_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                 0.05, 0.1, 0.25, 1.0)


class HistogramCounts:
    """One thread's observations of one label value: `counts[i]` in bucket i (the last: above every bound)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1   # the first bound >= amount (`le`)
        self.sum += amount


class Count:
    """One thread's count of one label value."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


C = TypeVar("C")   # a family's child: HistogramCounts, Count


class _PerThreadFamily(Collector, Generic[C]):
    """A metric family with one label whose every thread counts into children of its own (`labels`
    returns the calling thread's), merged when scraped: see LocklessHistogram."""

    def __init__(self, name: str, documentation: str, label: str, new: Callable[[], C], *,
                 registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.label = label
        self._new = new
        self._children: dict[tuple[str, int], C] = {}   # (label value, thread id) -> that thread's child
        registry.register(self)

    def labels(self, value: str) -> C:
        key = (value, threading.get_ident())
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new()
        return child

    def _by_value(self) -> dict[str, list[C]]:
        """Every thread's children, by label value (the dict copied in one C call: a thread's first
        observation may add a key meanwhile)."""
        merged: dict[str, list[C]] = {}
        for (value, _), child in list(self._children.items()):
            merged.setdefault(value, []).append(child)
        return merged


class LocklessHistogram(_PerThreadFamily[HistogramCounts]):
    """A histogram with one label whose observations take no lock: each thread counts into counts of its
    own (`labels` returns the calling thread's), which a scrape sums.

    prometheus_client's `Histogram` takes a lock twice per observation (its sum and a bucket): a few
    microseconds on the path of every call (the RPC latency) and of every log append and sync
    (bench/RESULTS.md issue-20-lockless-metrics). Here every set of counts has one writer, its thread,
    so a plain `+=` loses nothing; a scrape reads the counts while they may move, as it reads
    prometheus_client's own. Take `labels(...)` on the thread that observes (it is two dict lookups)."""

    def __init__(self, name: str, documentation: str, label: str, buckets: tuple[float, ...], *,
                 registry: CollectorRegistry) -> None:
        super().__init__(name, documentation, label, lambda: HistogramCounts(buckets), registry=registry)
        self._les = [*(floatToGoString(b) for b in buckets), "+Inf"]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, children in sorted(self._by_value().items()):
            buckets = [sum(counts) for counts in zip(*(c.counts for c in children))]
            family.add_metric([value], list(zip(self._les, itertools.accumulate(buckets))),
                              sum(c.sum for c in children))
        yield family


class LocklessCounter(_PerThreadFamily[Count]):
    """A counter with one label that counts without a lock, one count per thread (see LocklessHistogram)."""

    def __init__(self, name: str, documentation: str, label: str, *, registry: CollectorRegistry) -> None:
        super().__init__(name, documentation, label, Count, registry=registry)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, children in sorted(self._by_value().items()):
            family.add_metric([value], sum(c.value for c in children))
        yield family


class Metrics:
    """The registry of one node. Create after `node.start()` (the groups' logs must be open)."""

    def __init__(self, node: Node) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.rpc_seconds = LocklessHistogram("epochlog_rpc_seconds", "Client request latency on this node, by "
                                             "operation.", "op", _LATENCY_BUCKETS, registry=r)
        self.rpc_errors = Counter("epochlog_rpc_errors", "Client requests answered with an error, by "
                                  "operation and error code.", ["op", "code"], registry=r)
        self.log_append_seconds = LocklessHistogram("epochlog_log_append_seconds", "Time to append one batch to "
                                                    "a group's log (lock wait included).", "group", _DISK_BUCKETS,
                                                    registry=r)
        self.log_fsync_seconds = LocklessHistogram("epochlog_log_fsync_seconds", "Time of one fdatasync of a "
                                                   "group's log segment.", "group", _DISK_BUCKETS, registry=r)
        self.log_appended_bytes = LocklessCounter("epochlog_log_appended_bytes", "Bytes appended to a group's "
                                                  "log.", "group", registry=r)
        self.loop_stall_seconds = Histogram("epochlog_loop_stall_seconds", "How much later than due the node's "
                                            "event loop ran a timer (measured every tick): every group's "
                                            "heartbeats were that late.", registry=r, buckets=_STALL_BUCKETS)
        self.loop_stall_own_seconds = Histogram(
            "epochlog_loop_stall_own_seconds", "Of each epochlog_loop_stall_seconds stall, the node's own part: "
            "the stall less the time the loop's thread was runnable but waited for a CPU.", registry=r,
            buckets=_STALL_BUCKETS)
        self.registry.register(_GroupCollector(node))
        self.registry.register(_PeerCollector(node))
        self.registry.register(_ControllerCollector(node))
        for name, group in node.host.groups.items():
            group.storage.log.observer = _LogTimings(self, name)


    def track_kafka(self, counters: KafkaCounters) -> None:
        """Serve the Kafka face's counts (when the node serves Kafka)."""
        self.registry.register(_KafkaCollector(counters))

    def track_loop(self, monitor: LoopMonitor) -> None:
        """Serve the loop monitor's longest stall and its count of stalls past the warning bound."""
        self.registry.register(_LoopCollector(monitor))


class _KafkaCollector(Collector):
    """epochlog_kafka_*, read from the face's counters when scraped."""

    def __init__(self, counters: KafkaCounters) -> None:
        self.counters = counters

    def collect(self) -> Iterator[Metric]:
        c = self.counters
        for name, doc, label, values in (
                ("requests", "Kafka requests by API.", "api", c.requests),
                ("produced_records", "Records appended through the Kafka face.", "topic", c.produced_records),
                ("produced_bytes", "Bytes of the batches produced through the Kafka face.", "topic", c.produced_bytes),
                ("fetched_records", "Records handed to Kafka consumers.", "topic", c.fetched_records),
                ("fetched_bytes", "Bytes handed to Kafka consumers.", "topic", c.fetched_bytes)):
            family = CounterMetricFamily(f"epochlog_kafka_{name}", doc, labels=[label])
            for key, value in sorted(values.items()):
                family.add_metric([key], value)
            yield family
        errors = CounterMetricFamily("epochlog_kafka_errors", "Partitions answered with a Kafka error, by API and "
                                     "Kafka error name.", labels=["api", "error"])
        for (api, error), value in sorted(c.errors.items()):
            errors.add_metric([api, error], value)
        yield errors


class _LoopCollector(Collector):
    def __init__(self, monitor: LoopMonitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        longest = GaugeMetricFamily("epochlog_loop_stall_max_seconds", "The longest stall of the node's event "
                                    "loop since it started (see epochlog_loop_stall_seconds).")
        longest.add_metric([], self.monitor.longest_s)
        stalls = CounterMetricFamily("epochlog_loop_stalls", "Stalls of the node's event loop longer than "
                                     "[cluster] loop_stall_warning_ms (each logged at WARNING, at a bounded "
                                     "rate).")
        stalls.add_metric([], self.monitor.stalls)
        yield from (longest, stalls)


class _LogTimings:
    """A `LogObserver` (eventlog.log) feeding one group's histograms, from whichever thread did the work (the
    loop appends and syncs small writes itself; the flusher thread syncs the rest)."""

    __slots__ = ("_group", "_append", "_fsync", "_bytes")

    def __init__(self, metrics: Metrics, group: str) -> None:
        self._group = group
        self._append = metrics.log_append_seconds
        self._fsync = metrics.log_fsync_seconds
        self._bytes = metrics.log_appended_bytes

    def appended(self, seconds: float, size: int) -> None:
        self._append.labels(self._group).observe(seconds)
        self._bytes.labels(self._group).inc(size)

    def synced(self, seconds: float) -> None:
        self._fsync.labels(self._group).observe(seconds)


class _GroupCollector(Collector):
    """Reads every group's status and counters at scrape time (on the node's loop: the admin server's)."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def _scrub(self) -> Iterator[Metric]:
        scrubber = self.node.host.scrubber
        if scrubber is None:
            return
        stats = scrubber.stats
        checked = CounterMetricFamily("epochlog_scrub_bytes", "Bytes of sealed log segments the scrub checked.")
        checked.add_metric([], stats.bytes_checked)
        passes = CounterMetricFamily("epochlog_scrub_passes", "Scrub passes completed over every log.")
        passes.add_metric([], stats.passes)
        period = GaugeMetricFamily("epochlog_scrub_last_pass_seconds", "Duration of the last scrub pass (the "
                                   "longest a damaged batch nobody reads goes unnoticed).")
        period.add_metric([], round(stats.last_pass_seconds, 3))
        cpu = CounterMetricFamily("epochlog_scrub_cpu_seconds", "CPU time the scrub thread used.")
        cpu.add_metric([], round(stats.cpu_seconds, 3))
        yield from (checked, passes, period, cpu)

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = ("group",)) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=list(labels))

        def counter(name: str, doc: str, labels: tuple[str, ...] = ("group",)) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=list(labels))

        commit = gauge("epochlog_commit_offset", "Highest committed offset known to this node.")
        applied = gauge("epochlog_applied_offset", "Highest offset applied to this node's views.")
        last = gauge("epochlog_last_offset", "Last offset in this node's log.")
        start = gauge("epochlog_log_start_offset", "First offset still in this node's log.")
        term = gauge("epochlog_term", "Current Raft term.")
        leader = gauge("epochlog_leader", "Node id of the group's leader as this node knows it (0: none).")
        is_leader = gauge("epochlog_is_leader", "1 if this node leads the group.")
        lag = gauge("epochlog_follower_lag", "On the leader: offsets a peer's log is behind the leader's last "
                    "offset (last offset - the peer's acknowledged match offset).", ("group", "peer"))
        member_lag = gauge("epochlog_member_lag_offsets", "On the leader: offsets a member is behind the commit "
                           "offset (commit offset - its acknowledged match offset).", ("group", "member"))
        member_lag_s = gauge("epochlog_member_lag_seconds", "On the leader: age in seconds of the oldest "
                             "committed offset a member has not acknowledged (0 when it holds the commit "
                             "offset); above [cluster] lag_warning_ms the leader logs a warning.",
                             ("group", "member"))
        stalls = counter("epochlog_clock_stalls", "Times the group's tick clock lagged real time (a stalled "
                         "loop, a stopped process) and the leader lease was voided.")
        elections = counter("epochlog_elections_started", "Elections this node started (terms it "
                            "campaigned in).")
        changes = counter("epochlog_leader_changes", "Leader changes this node saw (new (term, leader) "
                          "pairs).")
        balance_moves = counter("epochlog_leader_balance_transfers", "Leaderships this node, as the group's leader, "
                                "handed to the member the group prefers ([cluster] leader_balance).")
        proposals = counter("epochlog_proposals_committed", "Proposals this node, as leader, saw committed.")
        events = counter("epochlog_events_applied", "Events (records) applied to this node's views.")
        prepared = counter("epochlog_applies_prepared", "On the leader: entries whose apply this node prepared "
                           "while the followers stored them, by result: committed (their commit only wrote what "
                           "was prepared), abandoned (something else came first: applied from scratch) or failed "
                           "(preparing raised, e.g. a read of the store: left to their apply).",
                           ("group", "result"))
        halted = gauge("epochlog_apply_halted", "1 while the group is halted on this node at a record its code "
                       "cannot apply (status and /readyz name the offset, the reason and the fix).")
        floor = gauge("epochlog_history_floor", "The committed history floor: as_of below it answers compacted.")
        snapshot = gauge("epochlog_snapshot_offset", "Offset of the latest snapshot (-1: none).")
        snapshots = counter("epochlog_snapshots", "Snapshots this node took.")
        snapshot_failures = counter("epochlog_snapshot_failures", "Snapshots that failed (retried later).")
        installed = counter("epochlog_snapshots_installed", "Snapshots this node installed from the leader.")
        segments = counter("epochlog_segments_deleted", "Log segments deleted by retention.")
        pruned = counter("epochlog_history_rows_pruned", "History rows deleted below the history floor.")
        disk_full = gauge("epochlog_disk_full", "1 while this node refuses writes to the group for lack of disk "
                          "space.")
        clean_end = gauge("epochlog_clean_end_offset", "End of the key-compacted range of the group's log (the log "
                          "start when nothing is cleaned).")
        clean_passes = counter("epochlog_cleaner_passes", "Key-compaction passes that rewrote segments.")
        clean_failures = counter("epochlog_cleaner_failures", "Key-compaction passes that failed (retried).")
        clean_reclaimed = counter("epochlog_cleaner_bytes_reclaimed", "Log bytes key compaction reclaimed.")
        clean_dropped = counter("epochlog_cleaner_records_dropped", "Records key compaction dropped "
                                "(superseded, expired tombstones, no-ops).")
        exhausted = gauge("epochlog_term_exhausted", "1 once the group's term reached its limit (2^31 - 1, the "
                          "int32 partitionLeaderEpoch): this node can never start another election in the group.")
        peer_drops = CounterMetricFamily("epochlog_peer_messages_dropped", "Messages from peers dropped by the "
                                         "checks before the Raft core saw them, by reason.", labels=["reason"])
        for reason, count in self.node.host.peer_drops.counts.items():
            peer_drops.add_metric([reason], count)
        damaged = gauge("epochlog_log_damaged", "1 while this node's log of the group holds a damaged batch or "
                        "fetches a dropped range again (status and /readyz name the file, the offset, the state).")
        damage_found = counter("epochlog_log_damage_found", "Damaged batches found in this node's log of the "
                               "group (by reads or the scrub).")
        repairs = counter("epochlog_log_repairs", "Times this node dropped damaged entries of the group to fetch "
                          "them again from the leader.")
        digest_checks = counter("epochlog_views_digest_checks", "Comparisons of views digests with a member this "
                                "node made as the group's leader.")
        mismatch = gauge("epochlog_views_digest_mismatch", "On the leader: 1 while a member's views digest differs "
                         "from the leader's at the same applied offset (the digest alarm).", ("group", "member"))
        groups = self.node.host.groups
        for info in self.node.status().groups:
            g = info.group
            commit.add_metric([g], info.commit_offset)
            applied.add_metric([g], info.applied_offset)
            last.add_metric([g], info.last_offset)
            start.add_metric([g], info.log_start)
            term.add_metric([g], info.term)
            leader.add_metric([g], info.leader)
            is_leader.add_metric([g], 1 if info.role == "leader" else 0)
            halted.add_metric([g], 0 if info.halted is None else 1)
            if info.role == "leader":
                for peer in info.peers:
                    if peer.id != self.node.node_id:
                        lag.add_metric([g, str(peer.id)], max(0, info.last_offset - peer.match_offset))
                for lag_info in groups[g].lag.snapshot().values():
                    member_lag.add_metric([g, str(lag_info.member)], lag_info.offsets)
                    member_lag_s.add_metric([g, str(lag_info.member)], round(lag_info.seconds, 3))
            c = groups[g].counters
            stalls.add_metric([g], c.clock_stalls)
            elections.add_metric([g], c.elections_started)
            changes.add_metric([g], c.leader_changes)
            balance_moves.add_metric([g], c.balance_transfers)
            proposals.add_metric([g], c.proposals_committed)
            events.add_metric([g], c.events_applied)
            group = groups[g]
            views = self.node.views[g]
            prepared.add_metric([g, "committed"], views.speculations.committed)
            prepared.add_metric([g, "abandoned"], views.speculations.abandoned)
            prepared.add_metric([g, "failed"], views.speculations.failed)
            floor.add_metric([g], views.store.history_floor)
            snapshot.add_metric([g], info.snapshot_offset)
            snapshots.add_metric([g], group.snapshots.taken)
            snapshot_failures.add_metric([g], group.snapshots.failed)
            installed.add_metric([g], group.snapshots.installed)
            segments.add_metric([g], group.snapshots.segments_deleted)
            pruned.add_metric([g], views.pruner.counters.rows_deleted)
            disk_full.add_metric([g], 1 if group.disk_full else 0)
            exhausted.add_metric([g], 1 if group.node.term_exhausted else 0)
            cleaning = self.node.compaction.cleaning.state(g)
            clean_end.add_metric([g], group.storage.log.clean_end_offset)
            clean_passes.add_metric([g], cleaning.passes)
            clean_failures.add_metric([g], cleaning.passes_failed)
            clean_reclaimed.add_metric([g], cleaning.bytes_reclaimed)
            clean_dropped.add_metric([g], cleaning.records_dropped)
            repair = group.repair.status()
            damaged.add_metric([g], 1 if repair.active else 0)
            damage_found.add_metric([g], repair.found)
            repairs.add_metric([g], repair.repairs)
            digest_checks.add_metric([g], self.node.digest_check.checks.get(g, 0))
            for alarm in info.digest_alarms:
                mismatch.add_metric([g, str(alarm.member)], 1)
        yield from self._scrub()
        yield from (damaged, damage_found, repairs, digest_checks, mismatch)
        yield from (commit, applied, last, start, term, leader, is_leader, lag, member_lag, member_lag_s,
                    stalls, elections, changes, balance_moves, proposals, events, prepared, halted, floor, snapshot,
                    snapshots, snapshot_failures, installed, segments, pruned, disk_full, clean_end, clean_passes,
                    clean_failures, clean_reclaimed, clean_dropped, exhausted, peer_drops)


class _PeerCollector(Collector):
    """The peer transport's closed connections by reason, read at scrape time."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        closed = CounterMetricFamily("epochlog_peer_connections_closed", "Peer connections this node closed or "
                                     "refused, by reason (a limit of [cluster.peer_limits], a failed TLS "
                                     "handshake, an identity refused, a bad frame).", labels=["reason"])
        transport = self.node.host.transport
        if transport is not None:
            for reason, count in sorted(transport.closes.counts.items()):
                closed.add_metric([reason], count)
        yield closed


class _ControllerCollector(Collector):
    """The controller's state and counters (controller/runtime.py), read at scrape time."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        runtime = self.node.controller
        core = runtime.core
        yield GaugeMetricFamily("epochlog_controller_active", "1 while the controller runs on this node.",
                                value=1 if core is not None else 0)
        brokers = GaugeMetricFamily("epochlog_controller_brokers", "Registered brokers by state (on the active "
                                    "controller).", labels=["state"])
        masters = GaugeMetricFamily("epochlog_controller_broker_groups", "Broker groups with and without a live "
                                    "master (on the active controller).", labels=["master"])
        if core is not None:
            registry = core.registry
            fenced = sum(1 for b in registry.brokers.values() if b.fenced)
            brokers.add_metric(["active"], len(registry.brokers) - fenced)
            brokers.add_metric(["fenced"], fenced)
            live = sum(1 for key, g in registry.groups.items()
                       if any(b.broker_id == g.master and not b.fenced for b in registry.brokers_of(key)))
            masters.add_metric(["yes"], live)
            masters.add_metric(["no"], len(registry.groups) - live)
        yield brokers
        yield masters
        c = runtime.counters
        for name, value, doc in (("heartbeats", c.heartbeats, "Broker heartbeats this node's controller took."),
                                 ("heartbeats_rejected", c.heartbeats_rejected, "Broker heartbeats it refused."),
                                 ("fenced", c.fenced, "Brokers it fenced."),
                                 ("elections", c.elections, "Master elections it committed."),
                                 ("activations", c.activations, "Times it became the active controller.")):
            yield CounterMetricFamily(f"epochlog_controller_{name}", doc, value=value)
