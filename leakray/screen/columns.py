"""Column names of a screen's pairs (pairs.parquet, labels.csv), in one place.

The columns shared with the rest of leakray live in `leakray.schema.P`; the provenance and
verification columns below are the screen's own.
"""

from __future__ import annotations

from leakray.schema import P


class S(P):
    PART = P.FIELD  # which part of the sample matched: prompt | solution | tests | task
    CORPUS_FILE = "corpus_file"  # the corpus file (or shard) the text came from
    CORPUS_RECORD = "corpus_record"  # JSONL line (1-based), JSON / parquet / Arrow row (0-based); null: whole file
    CORPUS_KEY = "corpus_key"  # where in the record or file: JSON key path, column, notebook cell, markdown fence
    LINE_START = "line_start"  # lines of the aligned copy: of the file where known, else of the text
    LINE_END = "line_end"
    SAMPLE_RARE = "sample_rare_shingles"  # the sample's rare shingles (an uncommon token, not boilerplate)
    SHARED_RARE = "shared_rare_shingles"  # of those, how many the corpus text holds
    SPAN_COVERAGE = "span_coverage"  # share of the sample's tokens in aligned runs shared with the text
