"""What every test shares: Python's bytecode cache, and how the JVMs Spark starts compile (the suite's
SparkSession and every `epochlog export`, `audit` or `up --tour` process a test runs).

The suite starts well over a thousand Python processes (every `epochlog serve` node, CLI call, crash
child). With PYTHONDONTWRITEBYTECODE set (this machine's environment sets it; CI runs with that
environment) none of them wrote a .pyc, so each compiled every module it imports from source again: a
node's imports took 0.45 s of CPU instead of 0.28 s (the shared 2-core machine; test_poison.py and
eventlog/test_crash.py together 90, 94 s -> 70, 74 s at load 3-5). The suite writes the cache
(`__pycache__/`, git-ignored; Python checks each .pyc against its source) for its own process and the
processes it starts.

A test's JVM lives seconds to a few minutes on tables of thousands of rows; the server JIT's (C2)
compiler threads and G1's concurrent threads then cost the 2 cores more than they give back. The
suite's JVMs compile with C1 only and collect with the serial collector (SPARK_SUBMIT_OPTS, read by
spark-submit for the driver JVM; outside the suite the product's defaults stay). Measured on the shared
2-core machine, runs interleaved: the JVM's own CPU time (/proc) for a local session's start 14.2, 13.4 s
-> 8.6, 7.5 s and for its first two queries 7.1, 7.0 s -> 4.2, 3.7 s (load 21-23); wall time of
test_export_cli_output (one `epochlog export` process) 159, 196 s -> 151, 130 s (load 9-22). Nothing a
test asserts depends on the JIT; set SPARK_SUBMIT_OPTS yourself (even empty) to run the suite with your
own JVM options.
"""

from __future__ import annotations

import os
import sys

sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
