"""The shipped base model: used only where it is what training here would give, checked on copy."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from leakray.models import prebuilt
from leakray.models.offline import TinyLMConfig

CORPUS = ["def f():\n    return 1\n", "x = 2\n"]

def _ship(tmp_path, cfg):
    """A fake build and its shipped copy (files with known contents, the manifest for ``cfg`` here)."""
    built = tmp_path / "built"
    built.mkdir()
    for name in prebuilt.FILES:
        (built / name).write_text(json.dumps({"steps": 3}) if name == "pretrain.json" else f"bytes of {name}")
    where = tmp_path / "shipped"
    prebuilt.write(cfg, CORPUS, built, where)
    return built, where


def test_the_shipped_copy_installs_only_for_its_own_config_corpus_and_torch(tmp_path):
    cfg = TinyLMConfig(corpus_mb=0.2)
    _, where = _ship(tmp_path, cfg)
    stats = prebuilt.install(cfg, CORPUS, tmp_path / "cache", where)
    assert stats == {"steps": 3, "prebuilt": True}
    assert (tmp_path / "cache" / "model.safetensors").read_text() == "bytes of model.safetensors"
    assert prebuilt.install(replace(cfg, max_steps=499), CORPUS, tmp_path / "other", where) is None  # another config
    ok, why = prebuilt.matches(cfg, CORPUS + ["y = 3\n"], where)  # another corpus (another Python's stdlib)
    assert not ok and "corpus" in why
    doc = json.loads((where / prebuilt.MANIFEST).read_text())
    doc["key"]["torch"] = "0.0.1"
    (where / prebuilt.MANIFEST).write_text(json.dumps(doc))
    ok, why = prebuilt.matches(cfg, CORPUS, where)
    assert not ok and "torch" in why


def test_a_damaged_shipped_file_is_refused(tmp_path):
    cfg = TinyLMConfig(corpus_mb=0.2)
    _, where = _ship(tmp_path, cfg)
    (where / "model.safetensors").write_text("flipped bits")
    with pytest.raises(RuntimeError, match="model.safetensors"):
        prebuilt.install(cfg, CORPUS, tmp_path / "cache", where)
    assert not (tmp_path / "cache").exists()


def test_compare_names_each_file_that_differs(tmp_path):
    cfg = TinyLMConfig(corpus_mb=0.2)
    built, where = _ship(tmp_path, cfg)
    assert all(prebuilt.compare(built, where).values())
    (built / "tokenizer.json").write_text("another tokenizer")
    (built / "pretrain.json").write_text("other timings")  # not compared: the build's own clock
    assert prebuilt.compare(built, where) == {name: name != "tokenizer.json" for name in prebuilt.FILES
                                              if name != "pretrain.json"}


def test_the_package_ships_a_manifest_for_the_default_base():
    doc = prebuilt.manifest()
    assert doc is not None and set(doc["files"]) == set(prebuilt.FILES)
    assert doc["key"]["config"] == prebuilt.build_key(TinyLMConfig(), [])["config"]
    for name, digest in doc["files"].items():
        assert prebuilt.sha256(prebuilt.SHIPPED / name) == digest
