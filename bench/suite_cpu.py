"""Where a command's CPU goes, by process kind: runs it (e.g. a sample of the test suite) under the
kernel's process accounting, so every process below it that exits is counted exactly (all its threads,
also one killed with SIGKILL), however short it lived.

The accounting record names a process only by its 16-character comm; a poller of /proc (every 50 ms; it reads each new process once)
reads the command line of each new process below the command, which is how `epochlog serve`, an xdist
worker and a CLI call are told apart. This process is made the subreaper of the tree, so an orphan stays
counted. Needs root (acct(2)); the record file is in a scratch directory and accounting is switched off
on exit. Accounting is one switch for the whole machine: run one of these at a time (a second one
redirects the records of the first, then switches accounting off).

    sudo python -m bench.suite_cpu [--by-command N] -- python -m pytest -q -n 2 tests/epochlog/node
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36
# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime, etime,
# utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16].
_ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")
_AHZ = 100


def _comp(value: int) -> int:
    """A comp_t (13-bit mantissa, 3-bit base-8 exponent) as an integer."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def kind(comm: str, argv: list[str]) -> str:
    """What a process is, from its command line (or its comm when the poller never saw it)."""
    text = " ".join(argv)
    if not argv:
        return f"unseen ({comm})"
    if "java" in comm or argv[0].endswith("java"):
        return "JVM (Spark)"
    if "epochlog" in text:
        for word in ("serve", "up", "controller"):
            if word in argv:
                return f"epochlog {word}"
        return "epochlog CLI/other"
    if "exec(eval(sys.stdin.readline()))" in text or "execnet" in text:
        return "xdist worker"
    if "pytest" in text:
        return "pytest main"
    if "python" in Path(argv[0]).name or comm.startswith("python"):
        return "python other: " + " ".join(argv[1:3])[:60]
    return f"other: {Path(argv[0]).name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--by-command", type=int, default=0, help="also list the N costliest command lines")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    scratch = Path(tempfile.mkdtemp(prefix="suite-cpu-"))
    record = scratch / "acct"
    record.touch()
    if libc.acct(str(record).encode()) != 0:
        sys.exit(f"acct(2) failed: errno {ctypes.get_errno()} (needs root)")
    argv_of: dict[int, list[str]] = {}
    parent_of: dict[int, int] = {}
    others: set[int] = set()   # processes seen that are not below the command (pids are not reused soon)
    start = time.monotonic()
    try:
        root = subprocess.Popen(command)
        argv_of[root.pid] = command
        parent_of[root.pid] = os.getpid()
        status = None
        while status is None:
            mine = {os.getpid(), *argv_of}
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit() or int(entry.name) in argv_of or int(entry.name) in others:
                    continue
                pid = int(entry.name)
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                ppid = int(stat.rpartition(")")[2].split()[1])
                if ppid in mine and cmdline:
                    argv_of[pid] = [a.decode(errors="replace") for a in cmdline.rstrip(b"\0").split(b"\0")]
                    parent_of[pid] = ppid
                elif ppid not in mine:
                    others.add(pid)   # read once: a process's parent is set when it forks
            while True:  # reap orphans given to us; the command's own status ends the loop
                try:
                    pid, code = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                if pid == root.pid:
                    status = os.waitstatus_to_exitcode(code)
            time.sleep(0.05)
    except KeyboardInterrupt:
        root.send_signal(signal.SIGINT)
        status = root.wait()
    finally:
        libc.acct(None)
    wall = time.monotonic() - start
    data = record.read_bytes()
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0.0])   # CPU s, processes, alive s
    by_command: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    records = [_ACCT_V3.unpack_from(data, off) for off in range(0, len(data) - _ACCT_V3.size + 1, _ACCT_V3.size)]
    # A process is ours if the poller saw it below us, or its parent at exit is ours (records are in exit
    # order: children exit before the parent that waits on them, so one pass from the end is not enough).
    ours = set(argv_of) | {os.getpid()}
    changed = True
    while changed:
        changed = False
        for rec in records:
            pid, ppid = rec[6], rec[7]
            if pid not in ours and ppid in ours:
                ours.add(pid)
                changed = True
    for rec in records:
        pid, comm = rec[6], rec[18].split(b"\0")[0].decode(errors="replace")
        if pid not in ours:
            continue
        cpu = (_comp(rec[10]) + _comp(rec[11])) / _AHZ
        argv = argv_of.get(pid, [])
        totals[kind(comm, argv)][0] += cpu
        totals[kind(comm, argv)][1] += 1
        totals[kind(comm, argv)][2] += rec[9] / _AHZ   # elapsed, from start to exit
        short = " ".join(a if len(a) < 50 else "..." + a[-30:] for a in argv)[:110] or f"({comm})"
        by_command[short][0] += cpu
        by_command[short][1] += 1
    everything = sum(t[0] for t in totals.values()) or 1e-9
    print(f"\nwall {wall:.1f} s, CPU {everything:.1f} s of exited processes below the command "
          f"(exit status {status}); alive s: summed lifetimes; load now {os.getloadavg()[0]:.2f}")
    print(f"{'kind':<60} {'procs':>6} {'CPU s':>8} {'share':>6} {'alive s':>8} {'CPU/proc':>8}")
    for name, (cpu, count, alive) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:<60} {count:>6} {cpu:>8.1f} {cpu / everything:>6.1%} {alive:>8.0f} {cpu / count:>8.2f}")
    if args.by_command:
        print(f"\n{'command line':<110} {'procs':>6} {'CPU s':>8}")
        for line, (cpu, count) in sorted(by_command.items(), key=lambda kv: -kv[1][0])[: args.by_command]:
            print(f"{line:<110} {count:>6} {cpu:>8.1f}")
    record.unlink()
    scratch.rmdir()
    sys.exit(status or 0)


if __name__ == "__main__":
    main()
