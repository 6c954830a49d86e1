"""Every detector leakray runs, by name. Adding one = one module + one line below.

Entries are "module:Class" strings, imported on first use, so listing the registry does
not import torch or scikit-learn. A detector kept outside leakray is the same one file plus
one entry in ``$LEAKRAY_DETECTORS`` (``name=path/to/file.py:Class`` or
``name=package.module:Class``, comma-separated): it then runs in simulate reports, cards and
audits like the built-in ones.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

from leakray.detect.base import META_FILE, Detector, DetectorSpec
from leakray.errors import BadInput

_ENTRIES = {
    # likelihood family (logprobs of the reference; no shadow training)
    "ref_loss": "ref_loss:RefLoss",
    "min_k": "min_k:MinK",
    "min_k_pp": "min_k_pp:MinKPlusPlus",
    "zlib": "zlib_ratio:ZlibRatio",
    "ref_calibrated": "ref_calibrated:RefCalibrated",
    "ref_calibrated_nonoracle": "ref_calibrated_nonoracle:RefCalibratedNonOracle",
    "ref_calibrated_text": "ref_calibrated_text:RefCalibratedText",
    # generation only (the k completions)
    "detectleak": "detectleak:DetectLeak",
    "gt_match": "gt_match:GTMatch",
    "cdd": "cdd:CDD",
    "buzzer_b": "buzzer_b:BuzzerB",
    # text-only memory probes (greedy continuations of the prompt plus part of the reference)
    "prefix_completion": "prefix_completion:PrefixCompletion",
    "masked_span": "masked_span:MaskedSpan",
    "rewrite_preference": "rewrite_preference:RewritePreference",
    # sampled one-token continuations at the reference's token starts (text only, reads a likelihood)
    "next_token": "next_token:NextToken",
    "next_token_calibrated": "next_token_calibrated:NextTokenCalibrated",
    "next_token_calibrated_nonoracle": "next_token_calibrated_nonoracle:NextTokenCalibratedNonOracle",
    # the same draws at the prompt's own token starts (the question the sample asked)
    "question_next_token": "question_next_token:QuestionNextToken",
    "question_next_token_calibrated": "question_next_token_calibrated:QuestionNextTokenCalibrated",
    "question_next_token_calibrated_nonoracle":
        "question_next_token_calibrated_nonoracle:QuestionNextTokenCalibratedNonOracle",
    # learned on the shadow collection
    "cgmia": "cgmia:CGMIA",
    "gotcha": "gotcha:Gotcha",
    "codemi": "codemi:CodeMI",
    "lr": "expert_ml:LR",
    "rf": "expert_ml:RF",
    "svm": "expert_ml:SVM",
    "nb": "expert_ml:NB",
    "dt": "expert_ml:DT",
    "mlp": "expert_ml:MLP",
    "cnn": "sequence:CNN",
    "lstm": "sequence:LSTM",
    "transformer": "sequence:Transformer",
    "advprompt": "advprompt_mia:AdvPromptMIA",
    "advprompt_text": "advprompt_text:AdvPromptText",
    # composites
    "cgmia_ensemble": "cgmia_ensemble:CGMIAEnsemble",
    "leakray_combined": "combined:Combined",
    "text_combined": "combined:TextCombined",
}


PLUGINS_ENV = "LEAKRAY_DETECTORS"


def _plugins() -> dict[str, str]:
    out = {}
    for item in filter(None, (x.strip() for x in os.environ.get(PLUGINS_ENV, "").split(","))):
        name, sep, target = item.partition("=")
        if not sep or ":" not in target or not name.strip():
            raise BadInput(f"${PLUGINS_ENV}: expected name=file.py:Class or name=module:Class, got {item!r}")
        if name.strip() in _ENTRIES:
            raise BadInput(f"${PLUGINS_ENV}: {name.strip()!r} is a built-in detector")
        out[name.strip()] = target.strip()
    return out


def plugins_env() -> dict[str, str]:
    """$LEAKRAY_DETECTORS with file paths made absolute, for workers that run elsewhere (a Ray
    task's working directory is not the driver's); {} without plug-ins."""
    plugins = _plugins()
    if not plugins:
        return {}

    def absolute(target: str) -> str:
        module, _, cls = target.rpartition(":")
        return f"{Path(module).resolve()}:{cls}" if module.endswith(".py") else target

    return {PLUGINS_ENV: ",".join(f"{n}={absolute(t)}" for n, t in plugins.items())}


def _entries() -> dict[str, str]:
    return {**_ENTRIES, **_plugins()}


def names() -> list[str]:
    """Every registered detector, in report order (families as listed above, then plug-ins)."""
    return list(_entries())


def _import(target: str):
    module, _, cls = target.rpartition(":")
    if module.endswith(".py"):  # a plug-in file
        path = Path(module).resolve()
        spec = importlib.util.spec_from_file_location(f"leakray_plugin_{path.stem}", path)
        if spec is None or not path.exists():
            raise BadInput(f"${PLUGINS_ENV}: no such file", path=str(path))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its detectors pickle by module name (Ray tasks, returned results)
        spec.loader.exec_module(mod)
        return getattr(mod, cls)
    return getattr(importlib.import_module(module if "." in module else f"leakray.detect.{module}"), cls)


@lru_cache(maxsize=None)
def detector_class(name: str) -> type[Detector]:
    entries = _entries()
    if name not in entries:
        raise BadInput(f"unknown detector {name!r}; known: {', '.join(entries)}", field="detect.detectors")
    found = _import(entries[name])
    if found.spec.name != name:  # the registry key is the report key: they must agree
        raise RuntimeError(f"registry entry {name!r} points at {found.spec.name!r}")
    return found


def spec(name: str) -> DetectorSpec:
    return detector_class(name).spec


def resolve(selection: str | Iterable[str]) -> list[str]:
    """``"all"`` or a list of names -> validated names, duplicates dropped, order kept."""
    if isinstance(selection, str):
        selection = names() if selection == "all" else [selection]
    out: list[str] = []
    for name in selection:
        detector_class(name)  # refuses unknown names
        if name not in out:
            out.append(name)
    return out


def make(name: str, params: Mapping[str, Any] | None = None) -> Detector:
    return detector_class(name)(**dict(params or {}))


def load(directory: str | Path) -> Detector:
    """Load any saved detector: its name is in its detector.json."""
    from leakray.detect.datafiles import read_meta

    return detector_class(read_meta(directory, META_FILE, "detector")["name"]).load(directory)
