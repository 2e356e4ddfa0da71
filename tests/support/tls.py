"""Certificates for test clusters: a CA per cluster (cheap: P-256 keys) and each member's files in its
data directory (`<data dir>/tls/`, where [cluster.tls] looks by default), so test configs need no TLS
keys. A harness that must run plaintext peers says so with `[cluster.tls] insecure = true`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from epochlog.certs import ClusterCA


def provision(ca_dir: Path, cluster: str, nodes: Mapping[int, Path]) -> ClusterCA:
    """The CA in `ca_dir` (made for `cluster` if absent) and a member certificate in `<data dir>/tls`
    of each node lacking one."""
    ca = ClusterCA.load_or_create(ca_dir, cluster)
    for node_id, data_dir in nodes.items():
        if not (Path(data_dir) / "tls" / "node.crt").exists():
            ca.issue_member(node_id, Path(data_dir) / "tls")
    return ca
