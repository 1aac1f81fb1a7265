"""The server side of a run: the ServerApp's main (app), the round loop (runner), what a round measured (roundlog),
sending and receiving through Flower's Grid (exchange), the run directory and its metrics (metrics), checkpoints,
the checks made before a run starts (preflight) and experiment trackers."""
