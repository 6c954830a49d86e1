import pytest

from leakray.config import build, load_config
from leakray.errors import BadInput
from leakray.models.finetune import FinetuneConfig
from leakray.runs import Stage, content_hash


def test_default_config_and_overrides():
    cfg = load_config([], ["target.epochs=3", "detect.seeds=[0, 1]", "benchmark.limit=8"])
    assert cfg["target"]["epochs"] == 3 and cfg["detect"]["seeds"] == [0, 1] and cfg["benchmark"]["limit"] == 8
    assert build(FinetuneConfig, cfg["target"], "target").epochs == 3


def test_unknown_key_is_named():
    with pytest.raises(BadInput, match="epochz"):
        build(FinetuneConfig, {"epochz": 3}, "target")
    with pytest.raises(BadInput, match="key.sub=value"):
        load_config([], ["noequals"])


def test_content_hash_ignores_key_order_and_sees_values():
    assert content_hash({"a": 1, "b": 2}) == content_hash({"b": 2, "a": 1})
    assert content_hash({"a": 1}) != content_hash({"a": 2})


def test_stage_marker(tmp_path):
    s = Stage(tmp_path, "x")
    assert not s.done
    s.finish(rows=3)
    again = Stage(tmp_path, "x")
    assert again.done and again.info()["rows"] == 3
