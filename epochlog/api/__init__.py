"""The api layer: the client protocol's messages and framing, and the routing table (sans-IO).

Below the controller, the node and its faces, and the SDK, which all speak it; it imports only
`eventlog` and `statemachines` (tests/test_layers.py). docs/protocol.md is the spec.
"""
