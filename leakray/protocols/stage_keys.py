"""What each protocol stage's outputs depend on, as content keys (`runs.StageSpec.key`).

A run directory is keyed by its whole config, so a run that changes one detector setting, one
report threshold or the sampling budget is a new run. Its stages need not all be new: a stage
whose key matches a finished stage of another run in the same output directory adopts it
(`runs.StageRunner`). A key is the config the stage can read, minus what only later stages read,
plus the benchmark's content; the rules are coarse on purpose (whole config sections), so a key
errs towards running a stage again, never towards adopting one made from other inputs:

- **model stages** (folds, split, base, corpus, fine-tunes, pretraining mixtures) read neither the
  collection's settings (`sample`, `execute`, `columns`, `embed`) nor the detectors (`detect`);
- **collection stages** (perturb, collections and the audit's scoring stages) read everything but
  `detect`, except which extra passes the requested detectors need (`collection_needs`);
- the audit's card also reads `detect`; the detect stage and reports read everything and are
  never adopted;
- the audit's shadow side (base, perturb, shadow, its collection, the card) reads nothing of the
  model under audit (`TARGET_ONLY`, and behind an endpoint none of the endpoint's settings:
  `shadow_side`): audits of two targets, local or served, share one shadow and card;
- an audit's report settings (`REPORT_ONLY`) reach no stage; the settings that add a stage
  (`ADDS_A_STAGE`: a corpus, control tasks, rewrites) reach only the stage they add.
"""

from __future__ import annotations

import copy
from typing import Iterable

from leakray.runs import StageSpec, Together, content_hash

COLLECTING = ("sample", "execute", "columns", "embed")
# read by the audit's report (routes, flags, intervals) only, after every stage
REPORT_ONLY = ("audit.bootstrap", "audit.cleaned_near_copies", "audit.detector", "audit.fdr", "audit.lam",
               "audit.max_width", "audit.net_of_difficulty", "audit.route")
# each adds one stage of its own and is read by no other (the card is keyed by its id instead)
ADDS_A_STAGE = ("audit.corpus", "audit.control", "audit.rewrites", "audit.rewrite_seed", "audit.card")
# the model under audit (or the planted one): read by the split, the target's fine-tune and what
# scores the target, never by the shadow's side, so audits of two targets share one shadow and card
TARGET_ONLY = ("audit.target", "audit.member_fraction", "audit.member_seed", "audit.planted_base", "target")


# what only an endpoint reads (`sample.backend=openai`): the model under audit's settings alone, since
# the audit samples its shadow here (`protocols.audit.sampled_here`)
ENDPOINT_ONLY = ("endpoint_url", "endpoint_model", "api_key_env", "concurrency", "max_n", "timeout_s",
                 "max_retries", "backoff_s", "endpoint_api", "chat_extra_tokens")


def shadow_side(cfg):
    """``cfg`` as the audit's shadow side reads it: behind an endpoint, sampled with the HF backend
    and none of the endpoint's settings, so audits of two endpoints, or of an endpoint and a local
    model, share one shadow, its collection and its card."""
    if cfg.sample.backend != "openai":
        return cfg
    fields = type(cfg.sample).model_fields
    local = cfg.sample.model_copy(update={"backend": "hf", **{f: fields[f].default for f in ENDPOINT_ONLY}})
    return cfg.model_copy(update={"sample": local})


def collection_needs(cfg) -> dict:
    """Which passes of the model a collection makes: they follow the requested detectors
    (`detect.detectors`), the one part of `detect` a collection reads."""
    from leakray.protocols import collection

    return {"advprompt": collection.wants_advprompt(cfg), "upper_case": collection.wants_upper_case(cfg),
            "probes": list(collection.wanted_probes(cfg)),
            "second_reference": collection.wants_second_reference(cfg)}


def _without(config: dict, paths: Iterable[str]) -> dict:
    out = copy.deepcopy(config)
    for path in paths:
        *parents, leaf = path.split(".")
        node = out
        for p in parents:
            node = node.get(p, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    return out


def stage_key(kind: str, cfg, digest: str, *, drop: Iterable[str] = (), needs: dict | None = None, **extra) -> str:
    """The key of a stage of ``kind``: ``cfg.hashed()`` without ``drop`` (dotted paths), the
    benchmark's content ``digest``, with ``needs`` (`collection_needs`) when the stage collects,
    and any ``extra`` inputs (a card's id, a control set's digest)."""
    body = _without(cfg.hashed(), drop)
    if needs is not None:
        body["collection_needs"] = needs
    return content_hash(kind, body, digest, extra)


def simulate_keys(cfg, digest: str) -> dict[str, str]:
    """Keys of the simulate protocol's stages (the detect stage has none: it reads everything)."""
    models = stage_key("simulate:models", cfg, digest, drop=("detect", *COLLECTING))
    collections = stage_key("simulate:collections", cfg, digest, drop=("detect",), needs=collection_needs(cfg))
    return {**dict.fromkeys(("folds", "base", "shadow_base", "corpus", "target", "shadow"), models),
            **dict.fromkeys(("perturb", "collect_shadow", "collect_target"), collections)}


def audit_keys(cfg, digest: str, card_id: str | None = None, control_digest: str | None = None) -> dict[str, str]:
    """Keys of the audit's (and `card build`'s) stages. A reused card (``card_id``) keys every
    stage after it; control tasks key their own stage by their content."""
    quiet, needs = (*REPORT_ONLY, *ADDS_A_STAGE), collection_needs(cfg)
    models = stage_key("audit:models", cfg, digest, drop=(*quiet, "detect", *COLLECTING), card=card_id)
    shadow_models = stage_key("audit:models", cfg, digest, drop=(*quiet, "detect", *COLLECTING, *TARGET_ONLY),
                              card=card_id)
    collections = stage_key("audit:collections", cfg, digest, drop=(*quiet, "detect"), needs=needs, card=card_id)
    shadow_collections = stage_key("audit:collections", shadow_side(cfg), digest,
                                   drop=(*quiet, "detect", *TARGET_ONLY), needs=needs, card=card_id)
    from leakray.detect.card import VERSION

    # a card made by a leakray whose cards have another format (its detectors' scores on another
    # scale) is made again, not adopted and then refused
    card = stage_key("audit:card", shadow_side(cfg), digest, drop=(*quiet, *TARGET_ONLY), needs=needs,
                     card_version=VERSION)

    def own(*keys: str) -> str:  # a stage that one of ADDS_A_STAGE adds: a collection's key plus those settings
        return stage_key("audit:collections", cfg, digest, drop=[q for q in (*quiet, "detect") if q not in keys],
                         needs=needs, card=card_id, control=control_digest if "audit.control" in keys else None)

    return {"split": models, "target": models, "base": shadow_models, "shadow": shadow_models,
            "perturb": shadow_collections, "collect_shadow": shadow_collections, "collect_target": collections,
            "card": card,
            "rewrite_scores": own("audit.rewrites", "audit.rewrite_seed"),
            "control_scores": own("audit.control"),
            "screen": own("audit.corpus")}


def with_keys(stages: list[StageSpec | Together], keys: dict[str, str]) -> list[StageSpec | Together]:
    """The stages, each with its key from ``keys`` (a stage not named there keeps none)."""
    from dataclasses import replace

    def keyed(spec):
        if isinstance(spec, Together):
            return Together(tuple(keyed(s) for s in spec.specs))
        return replace(spec, key=keys.get(spec.name))

    return [keyed(spec) for spec in stages]
