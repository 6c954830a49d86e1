"""Batch stages: plain classes or functions on a pyarrow batch (sample, execute, score, embed,
prove variants). They import domain packages only and do not know their executor."""
