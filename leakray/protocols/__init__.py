"""Protocols: what leakray runs (simulate, audit, card, dose sweep, sweep, screen), each a short
list of `runs.StageSpec` run by `runs.StageRunner`. A protocol chooses an executor for its
stages; it never calls Ray itself."""
