"""The two local models, shipped with the package so a fresh machine does not spend minutes
pretraining them: the demo's base (`tiny`, `leakray/prebuilt/base/`) and the other local
architecture (`tiny-alt`, `leakray/prebuilt/tiny-alt/`: the audit's default reference model for a
tiny target, and a mismatched shadow's base).

Each folder holds the files `offline.pretrain(cfg)` writes (model, tokenizer, pretrain.json) and
`MANIFEST.json`: each file's sha256 and what the build depended on: the training config's hash,
the corpus (the build machine's standard library: a digest of the exact source texts read) and
the torch version. `ensure_base_model` copies the folder whose config is the one asked for into
the cache, its files checked against their digests, on any machine: the config names the model,
and the corpus and torch decide only the bytes a rebuild *here* would give. They did differ
between two machines of this project with the same Python 3.11.2 (Debian's security updates of
its standard library), and there the first demo and the test suite pretrained for minutes a base
that was not the one the README's numbers came from.

`python scripts/build_base.py --check [--model tiny-alt]` rebuilds a model from scratch and
compares every file with the manifest, bit for bit where this machine's corpus and torch are the
build's (two builds a day apart on one machine gave the same bytes; `reproducible_here` says
whether they are), and `--update` replaces the shipped copy.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "prebuilt"
SHIPPED = ROOT / "base"  # model.tiny's defaults
FOLDERS = {"tiny": SHIPPED, "tiny-alt": ROOT / "tiny-alt"}  # model.shadow_tiny's defaults
MANIFEST = "MANIFEST.json"
# what a build writes and the shipped copy holds (pretrain.json's timings are the build machine's)
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "pretrain.json")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build_key(cfg, corpus_texts: list[str]) -> dict:
    """What decides the base's weights, bit for bit: the config, the corpus texts
    (`offline.stdlib_sources`), torch."""
    import torch

    from leakray.runs import content_hash

    corpus = hashlib.sha256()
    for text in corpus_texts:
        corpus.update(hashlib.sha256(text.encode()).digest())
    return {"config": content_hash(asdict(cfg)), "corpus_sha256": corpus.hexdigest(), "torch": torch.__version__}


def manifest(where: Path = SHIPPED) -> dict | None:
    path = where / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def shipped_for(cfg, root: Path = ROOT) -> Path | None:
    """The shipped folder built with ``cfg`` (its manifest's config hash), if any."""
    want = _config_hash(cfg)
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ():
        doc = manifest(folder)
        if doc is not None and doc["key"].get("config") == want:
            return folder
    return None


def reproducible_here(cfg, corpus_texts: list[str], where: Path | None = None) -> tuple[bool, str]:
    """Whether training ``cfg`` on ``corpus_texts`` here would give the shipped model (``where``, else
    the folder built with ``cfg``) bit for bit: the same corpus and torch as its build; and why not."""
    where = where or shipped_for(cfg)
    shipped = manifest(where) if where is not None else None
    if shipped is None:
        return False, "no prebuilt model of this config in this installation"
    here = build_key(cfg, corpus_texts)
    for key, value in here.items():
        if shipped["key"].get(key) != value:
            return False, (f"the prebuilt model was built with another {key} ({shipped['key'].get(key)} vs {value}"
                           + (f"; built with Python {shipped['built_with']['python']}" if key == "corpus_sha256"
                              and shipped.get("built_with") else "") + ")")
    return True, ""


def install(cfg, out_dir: Path, where: Path | None = None) -> dict | None:
    """Copy the shipped model (``where``, else the folder built with ``cfg``) into ``out_dir``,
    checking every file's sha256; its pretrain stats (with ``prebuilt``), or None where no copy
    ships for ``cfg`` (then the caller trains). Whatever this machine's corpus and torch: they
    decide what a rebuild here would give (`reproducible_here`), not which model ``cfg`` is."""
    where = where or shipped_for(cfg)
    doc = manifest(where) if where is not None else None
    if doc is None or doc["key"].get("config") != _config_hash(cfg):
        return None
    missing = [name for name in doc["files"] if not (where / name).exists()]
    if missing:
        raise RuntimeError(f"the prebuilt model {where} lacks {missing}: the installation is damaged")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, digest in doc["files"].items():
        shutil.copyfile(where / name, out_dir / name)
        if sha256(out_dir / name) != digest:
            shutil.rmtree(out_dir, ignore_errors=True)
            raise RuntimeError(f"prebuilt model file {where / name} does not match its manifest: "
                               "the installation is damaged")
    stats = json.loads((out_dir / "pretrain.json").read_text())
    return {**stats, "prebuilt": True}


def _config_hash(cfg) -> str:
    from leakray.runs import content_hash

    return content_hash(asdict(cfg))


def write(cfg, corpus_texts: list[str], built: Path, where: Path = SHIPPED) -> dict:
    """Make ``built`` (a fresh `pretrain` output for ``cfg`` on ``corpus_texts``) the shipped copy in ``where``."""
    where.mkdir(parents=True, exist_ok=True)
    files = {}
    for name in FILES:
        shutil.copyfile(built / name, where / name)
        files[name] = sha256(where / name)
    doc = {"key": build_key(cfg, corpus_texts), "files": files,
           # which interpreter's standard library the corpus was: what a bit-for-bit rebuild needs
           "built_with": {"python": sys.version},
           "rebuild": f"python scripts/build_base.py --check --model {_name(where)} "
                      "(compares a fresh build with these digests)"}
    (where / MANIFEST).write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def _name(where: Path) -> str:
    return next((name for name, folder in FOLDERS.items() if folder == where), str(where))


def compare(built: Path, where: Path = SHIPPED) -> dict[str, bool]:
    """Per shipped file (pretrain.json excluded: it holds the build's timings): equal bit for bit?"""
    files = manifest(where)["files"]
    return {name: sha256(built / name) == digest for name, digest in files.items() if name != "pretrain.json"}
