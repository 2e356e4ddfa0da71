"""`python -m epochlog` runs the command line."""

from epochlog.cli import main

main()
