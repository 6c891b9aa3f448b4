"""Command-line entry points: ``latticed`` (the daemon) and ``latticectl`` (the client)."""
