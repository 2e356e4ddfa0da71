"""A started cluster with client TLS and access enforcement, the harness acting as its admin.

The access tests of every face (tests/epochlog/node/test_access*.py, tests/epochlog/kafka/test_sasl.py)
need the same start: a cluster CA in `root/ca`, an `admin` client certificate in `root/admin` named as
the one super user, the SDK's environment (EPOCHLOG_TLS_*) set to it so that the harness's own clients
are the admin, and every group led. Each test module then adds the users and grants it needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from epochlog.certs import ClusterCA
from epochlog.client.tls import CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV
from tests.support.nodes import NodeCluster


@contextmanager
def secured_cluster(root: Path, name: str, *, clients: tuple[str, ...] = (), require_client_cert: bool = False,
                    **kwargs: Any) -> Iterator[NodeCluster]:
    """The started cluster (NodeCluster `kwargs`: size, seed, grpc, kafka, ...); `clients` are more
    client certificates to issue, each in `root/<name>`; `require_client_cert`: every face refuses a
    client without one at the handshake. Closed (and described) on exit."""
    ca = ClusterCA.create(root / "ca", name)
    admin = ca.issue_client("admin", root / "admin")
    for other in clients:
        ca.issue_client(other, root / other)
    cluster = NodeCluster(root, name=name, clients={"tls": {"enabled": True,
                                                            "require_client_cert": require_client_cert},
                                                    "access": {"enforce": True, "super_users": ["admin"]}},
                          **kwargs)
    mp = pytest.MonkeyPatch()
    for key, value in ((CA_ENV, admin.ca), (CERT_ENV, admin.cert), (KEY_ENV, admin.key)):
        mp.setenv(key, str(value))
    mp.delenv(TOKEN_ENV, raising=False)
    try:
        cluster.start()
        for group in cluster.groups:
            cluster.leader(group)
        yield cluster
    finally:
        mp.undo()
        cluster.close()
        print(cluster.describe())
