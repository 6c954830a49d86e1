"""Semantics-preserving prompt perturbations (AdvPrompt-MIA's five kinds, 11 variants) for
Python and Java, and the sandbox proof that each variant keeps the program's meaning."""

from leakray.perturb.core import (
    FORMS,
    KINDS,
    N_VARIANTS,
    SLOTS,
    NotApplicable,
    Variant,
    perturb,
    perturb_task,
    slot_name,
    variants_of,
)

__all__ = ["FORMS", "KINDS", "N_VARIANTS", "SLOTS", "NotApplicable", "Variant", "perturb", "perturb_task",
           "slot_name", "variants_of"]
