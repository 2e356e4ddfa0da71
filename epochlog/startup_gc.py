"""The cyclic garbage collector paused while an `epochlog` process starts.

A process's start (its imports and, for `serve`, the node's start) allocates tens of thousands of objects
that live as long as the process: the collections it triggers find nothing to free and cost about a
tenth of the start's CPU (bench/RESULTS.md startup-cost). `python -m epochlog` pauses the collector
before its first import; the CLI resumes it before a command runs, and `serve` once its node serves
(after `gc.freeze()` has moved what start made out of the collector's passes). Only a pause made here is
resumed: a collector someone else disabled stays disabled.
"""

from __future__ import annotations

import gc

_paused = False


def pause() -> None:
    """Disable the collector, if it is enabled, until `resume()`."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """Enable the collector again if `pause()` disabled it; otherwise nothing."""
    global _paused
    if _paused:
        _paused = False
        gc.enable()
