"""Chaos runs against real processes: `python -m tests.chaos --seconds N --seed S`.

Theory of operation. A run starts three `epochlog serve` processes on 127.0.0.1 (tests/node's
`NodeCluster`) and, for N seconds, drives two things at once:

- clients (asyncio, one SDK `AsyncClient` each): put, compare-and-set and get (linearizable, a
  quarter at `lease` consistency) on a small keyspace in the kv group, one operation at a time per
  client, every value unique. Each operation is recorded in a history (tests/sim/history.py) at its
  invocation and at its completion: ok (with its output), or unknown when it timed out or failed in
  a way that does not say whether it took effect (a write then may or may not have happened, at any
  time after its invocation; an unknown read is dropped);
- a nemesis (a thread), drawn from the seed: kill -9 and restart, SIGSTOP / SIGCONT pauses, of
  group leaders (mostly kv's) and followers, one node at a time so a majority stays.

Then it heals (resumes and restarts everything), waits for every member of every group to converge
(each applied the leader's commit offset, and the leader's match for each reached it), and checks:

1. linearizability of the history per key (tests/sim/linearizability.py: Wing & Gong's search on a
   register). The SDK's compare-and-set is on a key's version, the offset of the write that last
   changed it; since values are unique, "version == V" is "value == the value written at V", so a
   CAS is a register CAS on the value the client saw with that version (`cas_expected`);
2. every acknowledged write is on every replica: each node's kv log (`read_events` from that node)
   holds it at its offset with its value, applied; each node's history of the key (local
   consistency, at the final commit offset) lists it; and all nodes' logs are identical up to the
   commit offset.

It prints the seed, the nemesis log and a summary. Exit code: 0 no violation, 1 a violation (the
first ones are printed), 2 none found but the linearizability search gave up on a key (budget), 3
the cluster could not be set up. The data directory is deleted after a clean run and kept (and
printed) otherwise. A run replays its seed's choices (nemesis, clients); real time makes the same
interleaving likely, not certain.
"""
