"""Chaos runs against real processes: `python -m tests.chaos --seconds N --seed S`.

Theory of operation. A run starts three `epochlog serve` processes on 127.0.0.1 (tests/support/nodes.py's
`NodeCluster`) and, for N seconds, drives two things at once:

- clients (asyncio, one SDK `AsyncClient` each): put, compare-and-set and get (linearizable, a
  quarter at `lease` consistency) on a small keyspace in the kv group, one operation at a time per
  client, every value unique. Each operation is recorded in a history (tests/sim/history.py) at its
  invocation and at its completion: ok (with its output), or unknown when it timed out or failed in
  a way that does not say whether it took effect (a write then may or may not have happened, at any
  time after its invocation; an unknown read is dropped);
- a nemesis (a thread, tests/chaos/nemesis.py), drawn from the seed: kill -9 and restart, SIGSTOP /
  SIGCONT pauses and, with `--partitions`, isolation from its peers and one-way cuts (through the
  frame-aware proxies of tests/support/proxy.py: no iptables, no root), of group leaders (mostly
  kv's) and followers, one node at a time so a majority stays.

Meanwhile a log tail reads the committed kv records (tests/chaos/observers.py) and, with `--watch`, a
consumer applies the SDK's watch of the keys to its own copy. `--compaction` and `--short-retention`
make the nodes snapshot, truncate, key-compact and prune under the faults (see run.py; short
retention keeps 150 offsets, so members back from a fault catch up by snapshot).

Then it heals (every link passes, everything resumes and restarts), waits for every member of every
group to converge (each applied the leader's commit offset, and the leader's match for each reached
it), and checks:

1. linearizability of the history per key (tests/sim/linearizability.py: Wing & Gong's search on a
   register). The SDK's compare-and-set is on a key's version, the offset of the write that last
   changed it; since values are unique, "version == V" is "value == the value written at V", so a
   CAS is a register CAS on the value the client saw with that version (`cas_expected`);
2. versions (tests/chaos/versions.py): every value sits at one offset, whoever saw it (the write's
   acknowledgement, every read's version, the log's applied record); a value seen at two offsets is
   reported as applied twice, and a read's version must hold that value in the log;
3. every acknowledged write is on every replica: each node's kv log (`read_events` from that node)
   holds it at its offset with its value, applied; each node's history of the key (local
   consistency, at the final commit offset) lists it; and all nodes' logs are identical up to the
   commit offset;
4. replays: the log tail's replay (when it read the whole log) and the watch consumer's must equal
   every node's views (value and version of every key) at the commit offset.

It prints the seed, the nemesis log and a summary. Exit code: 0 no violation, 1 a violation (the
first ones are printed), 2 none found but the linearizability search gave up on a key (budget), 3
the cluster could not be set up. The data directory is deleted after a clean run and kept (and
printed) otherwise. A run replays its seed's choices (nemesis, clients); real time makes the same
interleaving likely, not certain.
"""
