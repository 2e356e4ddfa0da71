"""The suite's pytest-xdist workers draw test ports from disjoint shares of PORT_RANGE."""

from __future__ import annotations

import pytest

from tests.support.ports import PORT_RANGE, free_ports, port_range


def test_workers_draw_from_disjoint_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    shares = []
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        lo, hi = port_range()
        assert all(lo <= port < hi for port in free_ports(20)), (worker, lo, hi)
        shares.append((lo, hi))
    assert shares == [(PORT_RANGE[0], shares[1][0]), (shares[0][1], PORT_RANGE[1])] and shares[0][1] > shares[0][0]
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")
    assert port_range() == PORT_RANGE
