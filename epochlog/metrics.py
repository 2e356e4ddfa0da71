"""Prometheus metrics of a node (served by the admin HTTP endpoint at /metrics).

Per-request figures (RPC latency and errors) are recorded as they happen; per-group figures
(offsets, term, leadership, follower lag) are read from the node when scraped, so they cost nothing
between scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from epochlog.node import Node

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """The registry of one node."""

    def __init__(self, node: Node) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.rpc_seconds = Histogram("epochlog_rpc_seconds", "Client request latency on this node, by operation.",
                                     ["op"], registry=self.registry, buckets=_LATENCY_BUCKETS)
        self.rpc_errors = Counter("epochlog_rpc_errors", "Client requests answered with an error, by error code.",
                                  ["code"], registry=self.registry)
        self.registry.register(_GroupCollector(node))


class _GroupCollector(Collector):
    def __init__(self, node: Node) -> None:
        self.node = node
        self.leader_changes: dict[str, int] = {}
        self.last_leader: dict[str, int] = {}
        self.last_term: dict[str, int] = {}
        self.elections: dict[str, int] = {}

    def collect(self) -> Iterator[Metric]:
        labels = ["group"]
        commit = GaugeMetricFamily("epochlog_commit_offset", "Highest committed offset known to this node.",
                                   labels=labels)
        applied = GaugeMetricFamily("epochlog_applied_offset", "Highest offset applied to this node's views.",
                                    labels=labels)
        last = GaugeMetricFamily("epochlog_last_offset", "Last offset in this node's log.", labels=labels)
        term = GaugeMetricFamily("epochlog_term", "Current Raft term.", labels=labels)
        leader = GaugeMetricFamily("epochlog_is_leader", "1 if this node leads the group.", labels=labels)
        lag = GaugeMetricFamily("epochlog_follower_lag", "On the leader: offsets a follower's log is behind.",
                                labels=["group", "peer"])
        changes = CounterMetricFamily("epochlog_leader_changes", "Leader changes seen by this node.", labels=labels)
        elections = CounterMetricFamily("epochlog_terms_started", "New terms seen by this node (elections).",
                                        labels=labels)
        for info in self.node.status().groups:
            g = info.group
            commit.add_metric([g], info.commit_offset)
            applied.add_metric([g], info.applied_offset)
            last.add_metric([g], info.last_offset)
            term.add_metric([g], info.term)
            leader.add_metric([g], 1 if info.role == "leader" else 0)
            if self.last_leader.get(g, info.leader) != info.leader:
                self.leader_changes[g] = self.leader_changes.get(g, 0) + 1
            self.last_leader[g] = info.leader
            if self.last_term.get(g, info.term) != info.term:
                self.elections[g] = self.elections.get(g, 0) + info.term - self.last_term[g]
            self.last_term[g] = info.term
            changes.add_metric([g], self.leader_changes.get(g, 0))
            elections.add_metric([g], self.elections.get(g, 0))
            for peer in info.peers:
                if info.role == "leader" and peer.id != self.node.node_id:
                    lag.add_metric([g, str(peer.id)], max(0, info.last_offset - peer.match_offset))
        yield from (commit, applied, last, term, leader, lag, changes, elections)
