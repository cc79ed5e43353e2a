"""The remote runtime server: ``trouper runtime-server`` (see docs/runtimes.md)."""
