"""The shipped local models (tiny, tiny-alt): used for their own config on any machine, checked on
copy; a rebuild compares bit for bit only where the corpus and torch are the build's."""

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


def test_the_shipped_copy_installs_for_its_own_config_whatever_the_corpus_and_torch_here(tmp_path):
    cfg = TinyLMConfig(corpus_mb=0.2)
    _, where = _ship(tmp_path, cfg)
    stats = prebuilt.install(cfg, tmp_path / "cache", where)
    assert stats == {"steps": 3, "prebuilt": True}
    assert (tmp_path / "cache" / "model.safetensors").read_text() == "bytes of model.safetensors"
    assert prebuilt.install(replace(cfg, max_steps=499), tmp_path / "other", where) is None  # another config
    assert prebuilt.reproducible_here(cfg, CORPUS, where) == (True, "")
    # another Python's standard library (measured: two Debian updates of 3.11.2) or another torch: the
    # shipped model is still the one the config names, but a rebuild here would not give its bytes
    ok, why = prebuilt.reproducible_here(cfg, CORPUS + ["y = 3\n"], where)
    assert not ok and "corpus" in why and "built with Python 3." in why
    doc = json.loads((where / prebuilt.MANIFEST).read_text())
    doc["key"]["torch"] = "0.0.1"
    (where / prebuilt.MANIFEST).write_text(json.dumps(doc))
    ok, why = prebuilt.reproducible_here(cfg, CORPUS, where)
    assert not ok and "torch" in why
    assert prebuilt.install(cfg, tmp_path / "again", where) == stats


def test_ensure_base_model_copies_the_shipped_base_where_this_machines_stdlib_is_another(tmp_path, monkeypatch):
    """The failure a fresh machine met: its standard library differed from the build machine's by a
    security update, and the first demo and the suite pretrained the base for minutes."""
    from leakray.models import offline

    cfg = TinyLMConfig(corpus_mb=0.2)
    _, where = _ship(tmp_path, cfg)
    monkeypatch.setattr(prebuilt, "shipped_for", lambda c, root=prebuilt.ROOT: where)
    monkeypatch.setattr(offline, "cache_root", lambda: tmp_path / "cache")
    monkeypatch.setattr(offline, "stdlib_sources", lambda n: CORPUS + ["# another Python's stdlib\n"])
    monkeypatch.setattr(offline, "pretrain", lambda *a, **k: pytest.fail("trained a base that ships"))
    path, stats = offline.ensure_base_model(cfg, progress=False)
    assert stats["prebuilt"] and not stats["cached"]
    assert (path / "model.safetensors").read_text() == "bytes of model.safetensors"


def test_a_damaged_shipped_file_is_refused(tmp_path):
    cfg = TinyLMConfig(corpus_mb=0.2)
    _, where = _ship(tmp_path, cfg)
    (where / "model.safetensors").write_text("flipped bits")
    with pytest.raises(RuntimeError, match="model.safetensors"):
        prebuilt.install(cfg, tmp_path / "cache", where)
    assert not (tmp_path / "cache").exists()
    (where / "tokenizer.json").unlink()  # a file missing: damaged too, not a reason to train quietly
    with pytest.raises(RuntimeError, match="tokenizer.json"):
        prebuilt.install(cfg, tmp_path / "cache", where)


def test_compare_names_each_file_that_differs(tmp_path):
    cfg = TinyLMConfig(corpus_mb=0.2)
    built, where = _ship(tmp_path, cfg)
    assert all(prebuilt.compare(built, where).values())
    (built / "tokenizer.json").write_text("another tokenizer")
    (built / "pretrain.json").write_text("other timings")  # not compared: the build's own clock
    assert prebuilt.compare(built, where) == {name: name != "tokenizer.json" for name in prebuilt.FILES
                                              if name != "pretrain.json"}


def test_the_folder_is_found_by_the_config_it_was_built_with(tmp_path):
    one, two = TinyLMConfig(corpus_mb=0.2), TinyLMConfig(corpus_mb=0.2, n_layer=6, seed=1)
    built, _ = _ship(tmp_path, one)
    prebuilt.write(two, CORPUS, built, tmp_path / "root" / "tiny-alt")
    prebuilt.write(one, CORPUS, built, tmp_path / "root" / "base")
    assert prebuilt.shipped_for(one, tmp_path / "root") == tmp_path / "root" / "base"
    assert prebuilt.shipped_for(two, tmp_path / "root") == tmp_path / "root" / "tiny-alt"
    assert prebuilt.shipped_for(replace(two, max_steps=30), tmp_path / "root") is None  # a smoke-sized build is trained


@pytest.mark.parametrize("model", ["tiny", "tiny-alt"])
def test_the_package_ships_both_default_local_models(model):
    from leakray.config import SimulateConfig, load_config, to_stage

    models = load_config([], [], SimulateConfig).model
    cfg = to_stage(models.tiny if model == "tiny" else models.shadow_tiny)
    where = prebuilt.FOLDERS[model]
    assert prebuilt.shipped_for(cfg) == where  # what a default run asks for is what ships
    doc = prebuilt.manifest(where)
    assert doc is not None and set(doc["files"]) == set(prebuilt.FILES)
    for name, digest in doc["files"].items():
        assert prebuilt.sha256(where / name) == digest
    assert not json.loads((where / "pretrain.json").read_text())["stopped_by_time_cap"]
