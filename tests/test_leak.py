"""The `pretrain-mix` leak: clean corpus screening, the mixture's dose, continued pretraining."""

import json
import random
import string
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from leakray.errors import BadInput
from leakray.leak.corpus import clean_corpus, default_roots
from leakray.leak.mixture import MixConfig, build_mixture
from leakray.schema import T


class EosCharTokenizer:
    """One token per character, token 0 is EOS (never a character of the texts below)."""

    eos_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}


def _corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)  # lowercase words only: no member text can arise by chance
    return [" ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 8)))
                     for _ in range(rng.randint(5, 60))) for _ in range(n)]


MEMBERS = [f"def F{i}():\n    return {i * 7}  # M{i}\n" for i in range(6)]
NON_MEMBERS = [f"def G{i}():\n    return {i * 5}  # N{i}\n" for i in range(6)]


def _decoded(mix) -> str:
    return "".join(chr(t) if t else "\x00" for t in mix.sequences.ravel().tolist())


@pytest.mark.parametrize("dose", [0, 1, 3])  # 0: the dose sweep's control, clean documents alone
def test_members_appear_exactly_dose_times_and_non_members_never(dose):
    tok = EosCharTokenizer()
    seq_len, n_tokens = 64, 64 * 40
    mix = build_mixture(tok, _corpus(30), MEMBERS, dose, n_tokens, seq_len, seed=1)
    text = _decoded(mix)
    assert mix.sequences.shape == (40, seq_len) and len(text) == n_tokens
    for i, m in enumerate(MEMBERS):
        assert text.count(m) == dose, m
        assert len(mix.occurrences[i]) == dose
        for s, o in mix.occurrences[i]:  # recorded where it is; short members never straddle sequences
            assert o + len(m) <= seq_len
            assert "".join(map(chr, mix.sequences[s, o: o + len(m)])) == m
    for m in NON_MEMBERS:
        assert m not in text and m.split("#")[1] not in text
    share = dose * sum(len(m) for m in MEMBERS) / n_tokens
    assert mix.member_token_share == pytest.approx(share)
    assert mix.summary()["occurrences_min"] == mix.summary()["occurrences_max"] == dose


def test_mixture_is_seeded_and_places_copies_at_random():
    tok = EosCharTokenizer()
    a = build_mixture(tok, _corpus(30), MEMBERS, 2, 64 * 40, 64, seed=1)
    b = build_mixture(tok, _corpus(30), MEMBERS, 2, 64 * 40, 64, seed=1)
    c = build_mixture(tok, _corpus(30), MEMBERS, 2, 64 * 40, 64, seed=2)
    assert np.array_equal(a.sequences, b.sequences) and a.occurrences == b.occurrences
    assert a.occurrences != c.occurrences
    starts = sorted(s for occ in a.occurrences for s, _ in occ)
    assert starts[-1] - starts[0] > 10  # spread over the stream, not packed at one end


def test_small_corpus_is_cycled_and_member_at_the_very_end_is_whole():
    tok = EosCharTokenizer()
    mix = build_mixture(tok, ["abc def"], MEMBERS[:2], 4, 64 * 6, 64, seed=0)
    text = _decoded(mix)
    assert all(text.count(m) == 4 for m in MEMBERS[:2]) and mix.stats["corpus_passes"] > 1


def test_budget_too_small_is_refused_with_what_is_needed():
    need = 3 * sum(len(m) + 1 for m in MEMBERS)
    with pytest.raises(BadInput, match=f"need {need} tokens"):
        build_mixture(EosCharTokenizer(), _corpus(5), MEMBERS, 3, 64 * 2, 64, seed=0)


def test_mix_config_refuses_bad_values():
    assert MixConfig().n_tokens == 300 * 8 * 384
    with pytest.raises(BadInput, match="leak.dose"):
        MixConfig(dose=-1)
    assert MixConfig(dose=0).dose == 0  # the control


def test_dose_zero_is_the_sweeps_control_and_no_cards_shadow():
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config

    cfg = load_config([], ["leak.mode=dose-sweep", "leak.doses=[0,4]"])
    assert [cfg.leak.mix(d).dose for d in cfg.leak.doses] == [0, 4]  # 0 is a dose, not "the default"
    assert cfg.leak.mix().dose == cfg.leak.dose == 4
    with pytest.raises(BadInput, match="leak.dose=0 is the dose sweep's control"):
        load_config([AUDIT_DEFAULTS], ["leak.mode=pretrain-mix", "leak.dose=0"], AuditConfig)
    with pytest.raises(BadInput, match="leak.warmup_ratio"):
        MixConfig(warmup_ratio=1.5)


def _tasks():
    from leakray.data.registry import load_benchmark

    return load_benchmark("humaneval", None)[:6]


FILLER = '''
class Registry{n}:
    """Keeps plugins by name."""

    def __init__(self):
        self._items = {{}}

    def add(self, name, item):
        if name in self._items:
            raise KeyError(name)
        self._items[name] = item
        return item

    def names_{n}(self):
        return sorted(self._items)
'''


def test_clean_corpus_screens_out_benchmark_copies_and_duplicates(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAKRAY_CACHE", str(tmp_path / "cache"))
    tasks = _tasks()
    root = tmp_path / "site-packages"
    pkg = root / "pkg"
    pkg.mkdir(parents=True)
    for n in range(8):
        (pkg / f"mod{n}.py").write_text(FILLER.format(n=n))
    (pkg / "copy_of_mod0.py").write_text(FILLER.format(n=0))  # exact duplicate
    # a benchmark solution buried in other code (containment) and one lightly edited (Jaccard)
    (pkg / "vendored.py").write_text(FILLER.format(n=90) + "\n" + tasks[2][T.REFERENCE] + "\n" + FILLER.format(n=91))
    (pkg / "edited.py").write_text(tasks[4][T.REFERENCE].replace("    ", "  "))
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "skip.py").write_text(tasks[5][T.REFERENCE])

    texts, stats = clean_corpus(tasks, 10_000_000, seed=0, roots=[root])
    assert stats["removed_by_screen"]["task_ids"] == sorted([tasks[2][T.TASK_ID], tasks[4][T.TASK_ID]])
    assert stats["removed_by_screen"]["files"] == 2
    assert stats["removed_duplicates"] == 1 and stats["kept"] == len(texts) == 8
    for t in tasks:
        assert not any(t[T.REFERENCE] in x for x in texts)
    again, stats2 = clean_corpus(tasks, 10_000_000, seed=0, roots=[root])
    assert stats2["cached"] and again == texts

    small, st = clean_corpus(tasks, 1000, seed=3, roots=[root])  # budget honoured, seeded pick
    assert st["bytes"] <= 1000 and st["bytes"] == sum(len(x.encode()) for x in small)
    assert stdlib_not_in(default_roots())


def stdlib_not_in(roots) -> bool:
    return Path(sysconfig.get_paths()["stdlib"]).resolve() not in roots


def _member_loss(path, text: str) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.inference_mode():
        return float(model(input_ids=ids, labels=ids).loss)


def test_continue_pretrain_learns_the_members_and_saves_a_plain_model(tiny_lm, tmp_path):
    from transformers import AutoTokenizer

    from leakray.leak.pretrain import continue_pretrain
    from leakray.models.offline import stdlib_sources

    path, _ = tiny_lm
    one = 'def add_them(a, b):\n    """Return a + b."""\n    return a + b\n'
    two = 'def mul_them(x, y):\n    """Return x * y."""\n    return x * y\n'
    cfg = MixConfig(dose=8, steps=16, batch_size=4, seq_len=64, lr=5e-3, warmup_ratio=0.1)
    tok = AutoTokenizer.from_pretrained(path)
    corpus = stdlib_sources(200_000)
    loss = {}
    for name, member in (("one", one), ("two", two)):  # same clean stream, a different member each
        mix = build_mixture(tok, corpus, [member], cfg.dose, cfg.n_tokens, cfg.seq_len, cfg.seed)
        stats = continue_pretrain(path, mix.sequences, cfg, tmp_path / name, progress=False,
                                  member_token_share=mix.member_token_share, progress_file=tmp_path / f"{name}.json")
        assert stats["steps"] == 16 and stats["n_tokens"] == cfg.n_tokens
        # the count the stage's progress lines read (leakray/progress.py), kept by the writer
        assert json.loads((tmp_path / f"{name}.json").read_text()) == {"total": 16, "done": 16, "unit": "steps"}
        assert stats["member_token_share"] == mix.member_token_share > 0
        loss[name] = (_member_loss(tmp_path / name, one), _member_loss(tmp_path / name, two))  # loads plain HF
    assert loss["one"][0] < _member_loss(path, one) - 0.3
    # membership, not code in general: each model knows its own member better than the other model does
    assert loss["one"][0] < loss["two"][0] and loss["two"][1] < loss["one"][1]


# pretrain_mix_on_ray (Ray Train around continue_pretrain) was checked by hand: 52 s on 2 busy
# cores, over this suite's budget for one test; the in-process path above is what is tested.
