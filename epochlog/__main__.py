"""`python -m epochlog` runs the command line, with the collector paused while it starts
(epochlog/startup_gc.py)."""

from epochlog import startup_gc

startup_gc.pause()

from epochlog.cli import main  # noqa: E402  (after the pause: importing it is most of a start)

main()
