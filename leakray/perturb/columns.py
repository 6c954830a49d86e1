"""Columns of `leakray perturb`'s output beyond the task's own (``leakray.schema.T``).

Kept here until the perturbation stage joins the collection pipeline; then they belong in
``leakray.schema`` beside ``T`` and ``C``."""

from __future__ import annotations


class V:
    """One row per (task, variant slot) of ``variants.jsonl``."""

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
