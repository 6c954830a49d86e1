"""Fitted detector state as plain data: nothing a saved detector (or a detector card shared
between users) holds can run code when it is loaded.

- numpy arrays: ``.npy`` / ``.npz``, read with ``allow_pickle=False``;
- torch weights: ``.safetensors`` (a header and raw tensor bytes);
- scikit-learn models: ``.skops`` (skops.io: a zip of JSON and ``.npy`` files), loaded only
  when every type in the file is one skops trusts by default or one of ``TRUSTED_SKLEARN``;
  a file naming any other type is refused before anything is built;
- everything else: JSON.

``DATA_SUFFIXES`` are the extensions a card may hold; pickles (``.pkl``, ``.joblib``,
``.pt`` ...) are refused wherever they appear in a card.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from leakray.errors import BadInput

MODEL_FILE = "model.skops"  # a fitted scikit-learn model
DATA_SUFFIXES = (".json", ".parquet", ".npy", ".npz", ".safetensors", ".skops")

# Types inside fitted leakray scikit-learn models that skops does not trust by default
# (fitted trees; the MLP's optimiser state). Both are plain containers of arrays.
TRUSTED_SKLEARN = (
    "sklearn.tree._tree.Tree",
    "sklearn.neural_network._stochastic_optimizers.AdamOptimizer",
    "sklearn.neural_network._stochastic_optimizers.SGDOptimizer",
)


def write_meta(directory: str | Path, name: str, meta: Mapping[str, Any], default=None) -> Path:
    """``meta`` as JSON in ``directory/name``, written last: its presence marks a complete save.
    Returns the directory."""
    directory = Path(directory)
    (directory / name).write_text(json.dumps(meta, indent=1, default=default))
    return directory


def read_meta(directory: str | Path, name: str, what: str) -> dict[str, Any]:
    """The JSON ``write_meta`` left in ``directory/name``; without it the directory holds no saved ``what``."""
    path = Path(directory) / name
    if not path.exists():
        raise BadInput(f"not a saved {what}", path=str(path))
    return json.loads(path.read_text())


def save_sklearn(model: Any, path: str | Path) -> Path:
    import skops.io as sio

    sio.dump(model, Path(path))
    return Path(path)


def load_sklearn(path: str | Path) -> Any:
    """A scikit-learn object from a ``.skops`` file; types outside the trusted list are refused."""
    import skops.io as sio

    path = Path(path)
    if not path.exists():
        raise BadInput("saved model is missing", path=str(path))
    try:
        untrusted = sio.get_untrusted_types(file=path)
    except Exception as exc:  # not a skops zip (a pickle, a truncated file, ...)
        raise BadInput(f"not a skops model file ({type(exc).__name__})", path=str(path)) from None
    refused = sorted(set(untrusted) - set(TRUSTED_SKLEARN))
    if refused:
        raise BadInput(f"model file names types leakray does not load: {', '.join(refused)}", path=str(path))
    try:
        return sio.load(path, trusted=list(untrusted))
    except Exception as exc:
        raise BadInput(f"unreadable skops model file ({type(exc).__name__}: {exc})".replace("\n", " "),
                       path=str(path)) from None


def save_tensors(tensors: Mapping[str, Any], path: str | Path) -> Path:
    """torch tensors by name to ``.safetensors`` (copied to CPU, contiguous, unshared)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, str(path))
    return Path(path)


def load_tensors(path: str | Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    path = Path(path)
    if not path.exists():
        raise BadInput("saved weights are missing", path=str(path))
    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:
        raise BadInput(f"not a safetensors file ({type(exc).__name__})", path=str(path)) from None


def load_array(path: str | Path) -> np.ndarray:
    """One ``.npy`` array, never unpickled."""
    try:
        return np.load(Path(path), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise BadInput(f"not a plain numpy array file ({exc})".replace("\n", " "), path=str(path)) from None


def load_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz``, never unpickled."""
    try:
        with np.load(Path(path), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError) as exc:
        raise BadInput(f"not a plain numpy archive ({exc})".replace("\n", " "), path=str(path)) from None


def split_state(state: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``{"a": {"w": t}}`` -> ``{"a.w": t}`` (one flat safetensors namespace for several modules)."""
    return {f"{part}.{k}": v for part, sd in state.items() for k, v in sd.items()}


def join_state(flat: Mapping[str, Any], parts: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {p: {} for p in parts}
    for key, v in flat.items():
        part, _, k = key.partition(".")
        if part not in out:
            raise BadInput(f"weights hold an unexpected entry {key!r}")
        out[part][k] = v
    return out
