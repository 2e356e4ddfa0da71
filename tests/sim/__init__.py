"""A deterministic cluster simulator for the Raft core, and its invariant checkers.

Theory of operation (after TigerBeetle's simulator). One simulation runs real `RaftNode` cores --
never a mock -- as replicas of a small KV service, over fakes of everything the core does not own:

- `network.py`: message loss, duplication, delay and reordering, symmetric and one-way partitions;
- `disk.py`: per node, a durable MemoryStorage plus one write in flight that takes ticks; a crash
  loses the write or tears it (a prefix of its steps, never the hard state after them);
- the clock: everything is ticks (`cluster.py` runs them), and one `random.Random(seed)` is the
  only source of randomness; every node incarnation, disk, network and client gets its own Random
  derived from it, so a seed replays exactly;
- `replica.py`: the application side of the Ready contract (send, persist, send after, apply,
  advance), crash and restart from durable storage, KV snapshots (`kv.py`) taken and compacted so
  that followers catch up through chunked InstallSnapshot;
- `workload.py`: clients issuing put / cas / get through the log, ReadIndex and lease reads to the
  node they believe leads, recording a history (`history.py`);
- `faults.py`: crashes, partitions, membership changes and leadership transfers.
- `views_shadow.py` (optional: `--views`): every replica also keeps real RocksDB materialized views
  fed the same entries, and a checker holds replicas at equal offsets to equal views digests.

Invariant checkers (`checkers.py`, `linearizability.py`) are separate objects hooked to replica
events; the first violation stops the run. `swarm.py` draws each seed's own parameters and fault
rates and runs a safety phase with faults, then a liveness phase that must converge. `campaign.py`
runs many seeds in worker processes; `python -m tests.sim --seeds N [--start S] [--jobs J] [-v]` is
the command, and `test_sim.py` runs 600 seeds from a random start under pytest.
"""
