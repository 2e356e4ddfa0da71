"""`epochlog serve` as other builds of Epochlog, for mixed-version and poison tests (real processes).

    python -m tests.support.builds BUILD serve --config ... --node-id N ...

- `unchecked`: a node from before the leader's check: it proposes any event that decodes, a newer
  schema version included (what wrote the poison record of issue 11);
- `kvput-newer`: a newer Epochlog that knows the next KvPut schema version (same fields: it applies a
  put of that version as it applies one of this tree's).

Everything else is the code of this tree; the build is changed before the CLI starts.
"""

from __future__ import annotations

import sys

from statemachines import events as ev

BUILDS = ("unchecked", "kvput-newer")


def _unchecked_record(event: ev.Event) -> tuple[bytes, bytes]:
    return event.key().encode(), ev.encode_event(event)


def _unchecked_checked_record(event: ev.Event) -> tuple[bytes, bytes, ev.Event]:
    return (*_unchecked_record(event), event)


def _expect_nothing(self: object, records: object) -> None:
    """Such a node's applier decodes every record (it predates `Applier.expect`)."""


def main(argv: list[str]) -> None:
    build, args = argv[0], argv[1:]
    if build == "unchecked":
        from statemachines.views import ViewsStateMachine

        ev.event_record = _unchecked_record   # the node's own writes (membership, compaction)
        ev.checked_record = _unchecked_checked_record   # Node.write's
        ViewsStateMachine.expect = _expect_nothing  # type: ignore[method-assign]
    elif build == "kvput-newer":
        ev.KvPut.VERSION += 1
    else:
        raise SystemExit(f"unknown build {build!r} (builds: {', '.join(BUILDS)})")
    from epochlog.cli import main as cli_main

    cli_main(args)


if __name__ == "__main__":
    main(sys.argv[1:])
