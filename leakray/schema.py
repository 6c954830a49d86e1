"""Every column name and type leakray writes or reads, in one place.

Stages refer to ``T.PROMPT`` / ``C.PASSED`` rather than string literals, so a
rename is one edit here and a typo is an AttributeError, not a silent new column.

Four tables:
- ``T``  the task table: one row per benchmark sample, filled by every reader.
- ``C``  the collection: one row per task per (model, adapter), written once by
         the sample/execute/score/embed stages and read by every detector.
- ``X``  one sandbox execution (request and result), as `leakray execute` speaks it.
- ``P``  one screening pair (benchmark sample x corpus file).
"""

from __future__ import annotations

import pyarrow as pa


class T:
    """Task table columns (the one task schema every reader fills)."""

    BENCHMARK = "benchmark"  # e.g. "humaneval", "mbpp", "humaneval-x-java"
    TASK_ID = "task_id"  # as the benchmark spells it: "HumanEval/0", "MBPP/1"
    LANGUAGE = "language"  # "python" | "java"
    PROMPT = "prompt"  # what the model is given; a program is prompt + completion
    REFERENCE = "reference"  # always the complete runnable solution
    TESTS = "tests"  # harness-ready test text for `runner` ("" when the benchmark has none)
    RUNNER = "runner"  # sandbox runner name, see X.RUNNERS
    ENTRY_POINT = "entry_point"  # function/class under test ("" when not applicable)
    META = "meta"  # JSON object as a string: anything benchmark-specific

    ALL = (BENCHMARK, TASK_ID, LANGUAGE, PROMPT, REFERENCE, TESTS, RUNNER, ENTRY_POINT, META)
    REQUIRED_NONEMPTY = (BENCHMARK, TASK_ID, LANGUAGE, PROMPT, REFERENCE, RUNNER)


TASK_SCHEMA = pa.schema([(name, pa.string()) for name in T.ALL])

LANGUAGES = ("python", "java")


class C:
    """Collection columns: the contract between the expensive and the cheap part."""

    TASK_ID = T.TASK_ID
    BENCHMARK = T.BENCHMARK
    LANGUAGE = T.LANGUAGE
    FOLD = "fold"  # 0..3 for D1..D4 in the simulated-leakage protocol, -1 otherwise
    MEMBER = "member"  # 1 = in the model's fine-tuning data, 0 = not, -1 = unknown
    PROMPT = T.PROMPT
    REFERENCE = T.REFERENCE
    COMPLETIONS = "completions"  # list<string>[k]
    PERPLEXITY = "perplexity"  # list<float>[k], of each completion under the unwarped model
    N_TOKENS = "n_tokens"  # list<int>[k], generated tokens per completion
    EXEC_STATUS = "exec_status"  # list<string>[k], see X.STATUSES
    PASSED = "passed"  # list<bool>[k]; proven by the harness
    HAS_TESTS = "has_tests"  # bool: False for benchmarks without tests (pass feature absent)
    CODEBLEU = "codebleu"  # list<float>[k], completion program vs reference
    EDIT_DISTANCE = "edit_distance"  # list<float>[k], normalised token edit distance in [0, 1]
    EXPERT = "expert"  # list<float>[4k]: [ppl*k, codebleu*k, edit*k, pass*k]
    GEN_EMBEDDING = "gen_embedding"  # list<float>[k*d], row-major k x d
    REF_EMBEDDING = "ref_embedding"  # list<float>[d]
    REF_LOSS = "ref_loss"  # mean token NLL of the reference under the model (NaN + a note when unscorable)
    NOTES = "notes"  # list<string>: why this row was degraded (truncated prompt, NaN loss, ...), counted per stage
    # The reference continuation's tokens under the model (likelihood family, CodeMI). Null when
    # the backend could not fill them (the report says which; detectors needing them are skipped).
    REF_TOKEN_LOGPROBS = "ref_token_logprobs"  # list<float>: log p(token_t | prompt, ref_<t)
    REF_TOKEN_MU = "ref_token_mu"  # list<float>: E_v[log p(v | ...)] over the vocabulary at t (Min-K%++)
    REF_TOKEN_SIGMA = "ref_token_sigma"  # list<float>: std_v of log p(v | ...) at t (Min-K%++)
    REF_TOKEN_RANK = "ref_token_rank"  # list<int>: rank of the reference token at t (0 = argmax; CodeMI)
    REFMODEL_TOKEN_LOGPROBS = "refmodel_token_logprobs"  # list<float>: same tokens under the reference model
    # sum of log p over the prompt's own tokens (RefScores.context_logprob): the model, the reference model
    PROMPT_LOGPROB = "prompt_logprob"  # float; NaN when the backend gave none
    REFMODEL_PROMPT_LOGPROB = "refmodel_prompt_logprob"  # float
    # simulate's second reference model, never the target's own pre-leak checkpoint (the oracle a
    # real audit lacks): the same text's tokens under it (its own tokenizer)
    REFALT_TOKEN_LOGPROBS = "refalt_token_logprobs"  # list<float>
    UPPER_COMPLETIONS = "upper_completions"  # list<string>[k]: completions of the upper-cased prompt (BUZZER-b)
    UPPER_PERPLEXITY = "upper_perplexity"  # list<float>[k]
    # AdvPrompt-MIA: slot 0 is the unperturbed prompt, slots 1..11 the perturbation variants
    # (leakray.perturb SLOTS order); a variant that was not applicable or not proven to keep the
    # task's meaning has kind "" and prompt/completion "", perplexity NaN, embedding zeros.
    ADV_PROMPTS = "adv_prompts"  # list<string>[12]: the prompts sampled (input of the collection)
    ADV_KIND = "adv_kind"  # list<string>[12]: "base", "IDC1", ..., "IDL3", or "" when missing
    ADV_COMPLETIONS = "adv_completions"  # list<string>[12]: one greedy completion per prompt
    ADV_PERPLEXITY = "adv_perplexity"  # list<float>[12]
    ADV_EMBEDDING = "adv_embedding"  # list<float>[12*d], row-major
    # Text-only memory probes (leakray.features.probes): greedy continuations of the prompt plus
    # part of the reference; offsets are characters of the reference continuation
    PREFIX_CUTS = "prefix_cuts"  # list<int>: where each prefix probe's given text ends
    PREFIX_COMPLETIONS = "prefix_completions"  # list<string>: the model's continuation at each cut
    MASK_SPANS = "mask_spans"  # list<string>: the hidden spans (identifiers, or lines)
    MASK_COMPLETIONS = "mask_completions"  # list<string>: the continuation right before each span
    GREEDY_COMPLETION = "greedy_completion"  # string: the greedy completion of the prompt
    REWRITES = "rewrites"  # list<string>: continuations of rewrites renaming the solution's locals ([]: none)
    NEXT_CUTS = "next_cuts"  # list<int>: where each next-token cut falls in the continuation
    NEXT_DRAWS = "next_draws"  # list<list<string>>: the one-token samples drawn at each cut
    REFMODEL_NEXT_DRAWS = "refmodel_next_draws"  # list<list<string>>: the same cuts under the reference model
    REFALT_NEXT_DRAWS = "refalt_next_draws"  # list<list<string>>: and under the non-oracle reference
    QUESTION_CUTS = "question_cuts"  # list<int>: where each question cut falls in the generation prompt
    QUESTION_DRAWS = "question_draws"  # list<list<string>>: the one-token samples drawn at each question cut
    REFMODEL_QUESTION_DRAWS = "refmodel_question_draws"  # list<list<string>>: those cuts under the reference model
    REFALT_QUESTION_DRAWS = "refalt_question_draws"  # list<list<string>>: and under the non-oracle reference
    # list<float>[5]: wall time of the prefix, mask, greedy, next, question probes (0: off; older collections
    # have 3 or 4 entries)
    PROBE_SECONDS = "probe_seconds"
    # list<float>[len(PARTS)]: this row's share of each collection part's busy time (stages.rows.PARTS)
    PART_SECONDS = "part_seconds"
    # Not collected: added to a shadow table before its detectors fit (`detect.base.keyed_by_copies`).
    # The unit a learned detector's inner splits (validation split, cross-fitted folds) keep on one
    # side: the task, or the near-copy group it belongs to (`benchmark.near_copies`).
    SPLIT_KEY = "split_key"

    # The expert vector's blocks, in order; each block has k entries.
    EXPERT_BLOCKS = (PERPLEXITY, CODEBLEU, EDIT_DISTANCE, PASSED)



def filled_by(column: str) -> str | None:
    """The config switch whose pass fills an optional collection column (None: the main pass, or a
    value only some backends give): what a detector skipped for an empty column tells the user to turn on."""
    for prefix, switch in (("refalt_", "columns.nonoracle_reference"), ("refmodel_", "columns.reference_model"),
                           ("upper_", "columns.upper_case"), ("adv_", "columns.advprompt")):
        if column.startswith(prefix):
            return switch
    probe = {C.PREFIX_CUTS: "prefix", C.PREFIX_COMPLETIONS: "prefix", C.MASK_SPANS: "mask",
             C.MASK_COMPLETIONS: "mask", C.GREEDY_COMPLETION: "greedy", C.REWRITES: "greedy", C.NEXT_CUTS: "next",
             C.NEXT_DRAWS: "next", C.QUESTION_CUTS: "question", C.QUESTION_DRAWS: "question"}.get(column)
    return f"columns.probes ({probe})" if probe else None

def collection_schema() -> pa.Schema:
    # protocols.detectors.SCORES_SCHEMA is a twin in shape only: another table (a detector's
    # scores, one row per task, detector and seed) that shares its first column names.
    f32 = pa.float32()
    return pa.schema(
        [
            (C.TASK_ID, pa.string()),
            (C.BENCHMARK, pa.string()),
            (C.LANGUAGE, pa.string()),
            (C.FOLD, pa.int8()),
            (C.MEMBER, pa.int8()),
            (C.PROMPT, pa.string()),
            (C.REFERENCE, pa.string()),
            (C.COMPLETIONS, pa.list_(pa.string())),
            (C.PERPLEXITY, pa.list_(f32)),
            (C.N_TOKENS, pa.list_(pa.int32())),
            (C.EXEC_STATUS, pa.list_(pa.string())),
            (C.PASSED, pa.list_(pa.bool_())),
            (C.HAS_TESTS, pa.bool_()),
            (C.CODEBLEU, pa.list_(f32)),
            (C.EDIT_DISTANCE, pa.list_(f32)),
            (C.EXPERT, pa.list_(f32)),
            (C.GEN_EMBEDDING, pa.list_(f32)),
            (C.REF_EMBEDDING, pa.list_(f32)),
            (C.REF_LOSS, pa.float32()),
            (C.NOTES, pa.list_(pa.string())),
            (C.REF_TOKEN_LOGPROBS, pa.list_(f32)),
            (C.REF_TOKEN_MU, pa.list_(f32)),
            (C.REF_TOKEN_SIGMA, pa.list_(f32)),
            (C.REF_TOKEN_RANK, pa.list_(pa.int32())),
            (C.REFMODEL_TOKEN_LOGPROBS, pa.list_(f32)),
            (C.PROMPT_LOGPROB, pa.float64()),
            (C.REFMODEL_PROMPT_LOGPROB, pa.float64()),
            (C.REFALT_TOKEN_LOGPROBS, pa.list_(f32)),
            (C.UPPER_COMPLETIONS, pa.list_(pa.string())),
            (C.UPPER_PERPLEXITY, pa.list_(f32)),
            (C.ADV_PROMPTS, pa.list_(pa.string())),
            (C.ADV_KIND, pa.list_(pa.string())),
            (C.ADV_COMPLETIONS, pa.list_(pa.string())),
            (C.ADV_PERPLEXITY, pa.list_(f32)),
            (C.ADV_EMBEDDING, pa.list_(f32)),
            (C.PREFIX_CUTS, pa.list_(pa.int32())),
            (C.PREFIX_COMPLETIONS, pa.list_(pa.string())),
            (C.MASK_SPANS, pa.list_(pa.string())),
            (C.MASK_COMPLETIONS, pa.list_(pa.string())),
            (C.GREEDY_COMPLETION, pa.string()),
            (C.REWRITES, pa.list_(pa.string())),
            (C.NEXT_CUTS, pa.list_(pa.int32())),
            (C.NEXT_DRAWS, pa.list_(pa.list_(pa.string()))),
            (C.REFMODEL_NEXT_DRAWS, pa.list_(pa.list_(pa.string()))),
            (C.REFALT_NEXT_DRAWS, pa.list_(pa.list_(pa.string()))),
            (C.QUESTION_CUTS, pa.list_(pa.int32())),
            (C.QUESTION_DRAWS, pa.list_(pa.list_(pa.string()))),
            (C.REFMODEL_QUESTION_DRAWS, pa.list_(pa.list_(pa.string()))),
            (C.REFALT_QUESTION_DRAWS, pa.list_(pa.list_(pa.string()))),
            (C.PROBE_SECONDS, pa.list_(f32)),
            (C.PART_SECONDS, pa.list_(f32)),
        ]
    )


class X:
    """One sandbox execution: the `leakray execute` JSONL contract."""

    ID = "id"
    LANGUAGE = "language"
    RUNNER = "runner"
    PROGRAM = "program"
    TESTS = "tests"
    TIMEOUT_S = "timeout_s"
    # result
    STATUS = "status"
    PASSED = "passed"
    DURATION_S = "duration_s"
    STDOUT_TAIL = "stdout_tail"
    STDERR_TAIL = "stderr_tail"
    # only on a result the sandbox itself failed to produce: the harness's exception type, or
    # "BadRequest"; set by the host, never from anything the program printed (absent otherwise)
    HARNESS_ERROR = "harness_error"

    STATUSES = ("passed", "failed", "timeout", "memory", "error")
    RUNNERS = ("python", "unittest", "pytest", "java-main", "junit5", "stdio")
    DEFAULT_RUNNER = {"python": "python", "java": "java-main"}


class P:
    """One screening pair: a benchmark sample and a corpus file."""

    BENCHMARK = T.BENCHMARK
    TASK_ID = T.TASK_ID
    CORPUS_ID = "corpus_id"  # the corpus row's id or path
    EST_JACCARD = "est_jaccard"  # MinHash estimate
    JACCARD = "jaccard"  # exact, on the same shingles that were hashed
    CONTAINMENT = "containment"  # |sample ∩ file| / |sample|, exact
    SAMPLE_TEXT = "sample_text"
    CORPUS_TEXT = "corpus_text"
    LABEL = "label"  # empty in the labelling sheet; LessLeak's four classes
    FIELD = "field"  # which part of the sample matched: prompt | solution | tests | task
    PART = FIELD
    SAMPLE_SHINGLES = "sample_shingles"  # distinct shingles of the sample text
    CORPUS_SHINGLES = "corpus_shingles"  # distinct shingles of the corpus file
    SHARED_SHINGLES = "shared_shingles"  # |sample ∩ file|
    # `leakray screen`'s provenance and evidence (pairs.parquet, labels.csv)
    CORPUS_FILE = "corpus_file"  # the corpus file (or shard) the text came from
    CORPUS_RECORD = "corpus_record"  # JSONL line (1-based), JSON / parquet / Arrow row (0-based); null: whole file
    CORPUS_KEY = "corpus_key"  # where in the record or file: JSON key path, column, notebook cell, markdown fence
    LINE_START = "line_start"  # lines of the aligned copy: of the file where known, else of the text
    LINE_END = "line_end"
    MATCHED_BY = "matched_by"  # jaccard | containment (rare-shingle evidence) | runs (number-bearing token runs)
    SAMPLE_RARE = "sample_rare_shingles"  # the sample's rare shingles (null when matched by runs)
    SHARED_RARE = "shared_rare_shingles"  # of those, how many the corpus text holds
    SAMPLE_RUNS = "sample_runs"  # the sample's indexed token runs (null unless matched by runs)
    SHARED_RUNS = "shared_runs"  # of those, how many the corpus text holds
    SPAN_COVERAGE = "span_coverage"  # share of the sample's tokens in aligned runs shared with the text


class V:
    """One row per (task, variant slot) of `leakray perturb`'s output, beyond the task's own columns."""

    SLOT = "slot"  # "IDC1" .. "IDL3"
    KIND = "kind"  # IDC | IRV | VR | IDP | IDL
    VARIANT = "variant"  # 0-based index within the kind
    FORM = "form"  # which form of the kind ("" when not applicable)
    APPLICABLE = "applicable"  # False: the kind cannot apply to this prompt; see REASON
    REASON = "reason"  # why not applicable ("" otherwise)
    RENAME = "rename"  # {old: new} for VR, {} otherwise; already applied to prompt and reference
    DETAIL = "detail"  # where and what was inserted, or the rename
    SEED = "seed"
    CHECK = "check"  # with --check: kept | failed | not-applicable | baseline-failed | no-tests
    CHECK_DETAIL = "check_detail"  # the sandbox status and last stderr line of a failed check

    ALL = (SLOT, KIND, VARIANT, FORM, APPLICABLE, REASON, RENAME, DETAIL, SEED, CHECK, CHECK_DETAIL)


class R:
    """The self-calibrated audit route's scores: one row per task (`rewrite_scores.parquet`).
    Log-likelihoods are sums over the continuation's tokens (the log-probability of the text), so
    they compare across tokenizers; rewrites renamed the solution's locals (leakray.perturb.rewrite)."""

    TASK_ID = T.TASK_ID
    N_REWRITES = "n_rewrites"  # 0: not applicable (REASON says why)
    REASON = "reason"
    TARGET_ORIGINAL = "target_original"  # float: log p_target(original continuation | prompt)
    TARGET_REWRITES = "target_rewrites"  # list<float>[n]: the same for each rewrite
    REFERENCE_ORIGINAL = "reference_original"  # float: under the reference model
    REFERENCE_REWRITES = "reference_rewrites"  # list<float>[n]


def rewrite_scores_schema() -> pa.Schema:
    f64 = pa.float64()
    return pa.schema([(R.TASK_ID, pa.string()), (R.N_REWRITES, pa.int32()), (R.REASON, pa.string()),
                      (R.TARGET_ORIGINAL, f64), (R.TARGET_REWRITES, pa.list_(f64)),
                      (R.REFERENCE_ORIGINAL, f64), (R.REFERENCE_REWRITES, pa.list_(f64))])


class K:
    """The control route's scores (`control_scores.parquet`): every benchmark task and every control
    task (tasks the target cannot have seen) scored by the same code under the target and the
    reference model. Log-likelihoods are sums over tokens (comparable across tokenizers); the prompt's
    is `RefScores.context_logprob` (its first token aside)."""

    TASK_ID = T.TASK_ID
    SET = "set"  # "benchmark" or "control"
    CHARS = "chars"  # characters of prompt + solution: the statistic is per character
    TARGET_SOLUTION = "target_solution"  # log p_target(solution | prompt)
    TARGET_PROMPT = "target_prompt"  # log p_target(prompt)
    REFERENCE_SOLUTION = "reference_solution"  # the same under the reference model
    REFERENCE_PROMPT = "reference_prompt"
    REASON = "reason"  # "" when scored; else why not


def control_scores_schema() -> pa.Schema:
    f64 = pa.float64()
    return pa.schema([(K.TASK_ID, pa.string()), (K.SET, pa.string()), (K.CHARS, pa.int64()),
                      (K.TARGET_SOLUTION, f64), (K.TARGET_PROMPT, f64), (K.REFERENCE_SOLUTION, f64),
                      (K.REFERENCE_PROMPT, f64), (K.REASON, pa.string())])


class S:
    """Scores a detector writes: one row per task."""

    TASK_ID = T.TASK_ID
    DETECTOR = "detector"
    SCORE = "score"  # higher = more likely a member
    PREDICTION = "prediction"  # 0/1
    MEMBER = C.MEMBER
    SEED = "seed"
    BASELINE_SEED = -1  # the SEED value of seed-free detectors (they are fitted once, not per seed)
