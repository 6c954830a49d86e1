"""Scheduled contamination sweeps: models x benchmarks x detectors, each cell a resumable
simulate run, every result kept in a history catalog (SQLite) for `history` and `diff`."""
