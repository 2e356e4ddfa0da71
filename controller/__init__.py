"""The controller: broker registry, heartbeats, fencing, SyncStateSet, master election, topic routes.

It runs on the leader of the `metadata` group (RocketMQ 5's controller mode and NameServer, KRaft's
broker lifecycle). Every decision is an event in the log; heartbeats are not.

    config.py     ControllerConfig ([controller]: heartbeat timing profiles, unclean election)
    registry.py   the in-memory copy of the broker and group views, with the applier's rules
    liveness.py   heartbeat clocks (deadline heap, grace for a new controller)
    decisions.py  pure decisions: register, fence, unfence, elect, SyncStateSet, shutdown
    core.py       ControllerCore: the sans-IO controller (registry + clocks + decisions)
    routes.py     topic routes and broker listings from view states
    runtime.py    ControllerRuntime: runs the core on the metadata leader (asyncio, the node's IO)
    errors.py     the refusals (fenced, stale_epoch, controller_starting, ...)
"""

from controller.config import ControllerConfig, controller_config
from controller.core import ControllerCore
from controller.errors import ControllerError, FencedError, StaleEpochError

__all__ = ["ControllerConfig", "ControllerCore", "ControllerError", "FencedError", "StaleEpochError",
           "controller_config"]
