"""The Raft node runtime: IO around the sans-IO core (storage on the segmented log, transport, tasks)."""
