"""`epochlog serve` as other builds of Epochlog, for mixed-version and poison tests (real processes).

    python -m tests.support.builds BUILD serve --config ... --node-id N ...

- `unchecked`: a node from before the leader's check: it proposes any event that decodes, a newer
  schema version included (what wrote the poison record of issue 11);
- `kvput-newer`: a newer Epochlog that knows the next KvPut schema version (same fields: it applies a
  put of that version as it applies one of this tree's);
- `views-format-1`: an Epochlog that knows views format level 1 only (statemachines/views_format.py): its
  peer hello says so, and it halts on a raise to level 2 as on any newer schema;
- `views-format-1-stale`: the same node whose hello still says the newest level (a node downgraded while
  its peers remember it, or one that lies): the leader raises the level and this node halts there;
- `views-format-2`: an Epochlog that knows views format levels 1 and 2 only (before a session's ok
  requests shared outcome rows): its hello says 2, and it halts on a raise to level 3.

Everything else is the code of this tree; the build is changed before the CLI starts.
"""

from __future__ import annotations

import sys

from statemachines import events as ev

BUILDS = ("unchecked", "kvput-newer", "views-format-1", "views-format-1-stale", "views-format-2")


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
    elif build in ("views-format-1", "views-format-1-stale", "views-format-2"):
        from statemachines import views_format

        known = 2 if build == "views-format-2" else 1
        ev.ViewsFormatRaised.VERSION = known   # a raise to a higher level (v = level) is a newer schema: halts
        if build != "views-format-1-stale":
            views_format.LATEST = known        # what its hello advertises, and the most it would raise to
    else:
        raise SystemExit(f"unknown build {build!r} (builds: {', '.join(BUILDS)})")
    from epochlog.cli import main as cli_main

    cli_main(args)


if __name__ == "__main__":
    main(sys.argv[1:])
