import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from leakray.cli import main
from leakray.config import DEFAULT, SimulateConfig, load_config, to_stage
from leakray.errors import BadInput
from leakray.models.finetune import FinetuneConfig
from leakray.runs import Stage, StageRunner, StageSpec, Together, content_hash

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_packaged_yaml_agrees_with_the_typed_defaults():
    # the YAML documents the defaults; any value it states must be the model's own
    assert DEFAULT.is_file() and "leakray" in DEFAULT.parts[-3]
    assert load_config() == SimulateConfig()
    stated = yaml.safe_load(DEFAULT.read_text())
    dumped = SimulateConfig().model_dump()

    def check(node, ref, where):
        for key, value in node.items():
            assert key in ref, f"{where}{key} is not a config key"
            if isinstance(value, dict) and value:
                check(value, ref[key], f"{where}{key}.")
            else:
                assert value == ref[key], f"{where}{key}: yaml {value!r} != default {ref[key]!r}"
    check(stated, dumped, "")


def test_overrides_reach_the_typed_stage_config():
    cfg = load_config([], ["target.epochs=3", "detect.seeds=[0, 1]", "benchmark.limit=8"])
    assert cfg.target.epochs == 3 and cfg.detect.seeds == [0, 1] and cfg.benchmark.limit == 8
    ft = to_stage(cfg.target)
    assert isinstance(ft, FinetuneConfig) and ft.epochs == 3 and ft.max_length == 1024
    with pytest.raises(BadInput, match="key.sub=value"):
        load_config([], ["noequals"])


def test_ray_train_only_where_it_places_or_spreads_the_work():
    """use_ray_train "auto" (the default): Ray Train for a CUDA CGMIA, Ray tasks on CPUs; a
    true/false setting is kept as given."""
    assert load_config([DEFAULT], []).detect.ray_train() is False
    assert load_config([DEFAULT], ["detect.cgmia={device: cuda}"]).detect.ray_train() is True
    assert load_config([DEFAULT], ["detect.use_ray_train=true"]).detect.ray_train() is True
    assert load_config([DEFAULT], ["detect.use_ray_train=false", "detect.cgmia={device: cuda}"]).detect.ray_train() is False
    with pytest.raises(BadInput):
        load_config([DEFAULT], ["detect.use_ray_train=sometimes"])
    # fine-tunes: Ray Train where it places (GPU) or spreads (several workers) the work, else a Ray task
    from leakray.executor.train import use_ray_train

    assert load_config([DEFAULT], []).ray.use_ray_train == "auto"
    assert [use_ray_train("auto", w, gpu) for w, gpu in ((1, False), (2, False), (1, True))] == [False, True, True]
    assert use_ray_train(True, 1, False) and not use_ray_train(False, 1, True)


def test_config_file_layer(tmp_path):
    f = tmp_path / "my.yaml"
    f.write_text("sample:\n  k: 3\n")
    assert load_config([f], ["sample.temperature=0.5"]).sample.k == 3
    f.write_text("- a list\n")
    with pytest.raises(BadInput, match="mapping"):
        load_config([f])


BAD_SETTINGS = [
    (["execute.timeout=3"], "execute.timeout", "did you mean 'execute.timeout_s'"),
    (["sample.kk=3"], "sample.kk", "did you mean 'sample.k'"),
    (["sampel.k=3"], "sampel", "did you mean 'sample'"),
    (["target.method=qlora"], "target.method", "'full' or 'lora'"),
    (["sample.backend=vlm"], "sample.backend", "'vllm' or 'openai'"),
    (["sample.backend=openai"], "sample.endpoint_url", "http://host:8000/v1"),
    # simulate builds its target and shadow here: an endpoint is an audit's model under audit
    (["sample.backend=openai", "sample.endpoint_url=http://host:8000/v1"], "sample.backend", "leakray audit --target"),
    (["sample.backend=vllm"], "vllm", "pip install 'leakray[vllm]'"),
    (["sample.endpoint_api=chat"], "sample.endpoint_api", "drop sample.endpoint_api"),
    (["sample.endpoint_api=chats"], "sample.endpoint_api", "'completions' or 'chat'"),
    (["benchmark.name=mbpp"], "benchmark", "set benchmark.path"),
    (["benchmark.name=humaneval2"], "benchmark", "unknown benchmark"),
    (["benchmark.folds=5"], "benchmark.folds", "4"),
    (["embed.model=nobody/no-such-encoder"], "embed.model", "HF_HUB_OFFLINE"),
    (["detect.cgmia.epoch=3"], "detect.cgmia", "did you mean 'epochs'"),
    (["detect.seeds=[]"], "detect.seeds", "at least 1"),
    (["sample.top_p=1.5"], "sample.top_p", "less than or equal to 1"),
    (["sample.dtype=bf16"], "sample.dtype", "'bfloat16'"),
    (["detect.threshold_rule=target_median"], "detect.threshold_rule", "shadow_max_mcc"),
    # a local path that is not a model: refused here, not when a collection's actors load it
    ([f"columns.reference_model={FIXTURES}"], "columns.reference_model", "no config.json"),
    ([f"model.base={FIXTURES / 'screen' / 'mbpp.jsonl'}"], "model.base", "is a file"),
]


@pytest.mark.parametrize("overrides,key,hint", BAD_SETTINGS, ids=[b[0][0] for b in BAD_SETTINGS])
def test_bad_settings_get_one_line_before_any_stage(overrides, key, hint, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = ["simulate", "--output", str(tmp_path / "runs")]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert key in err and hint in err, err
    assert not (tmp_path / "runs").exists()  # refused before a run directory, let alone a stage


def test_an_audit_target_without_a_tokenizer_is_refused_before_any_stage(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "gpt2"}')
    assert main(["audit", "--target", str(model), "--output", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no tokenizer" in err and "tokenizer.save_pretrained" in err and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()
    # a served model's address given as the target: the way to audit an endpoint, in one line
    assert main(["audit", "--target", "http://host:8000/v1", "--output", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sample.backend=openai" in err and \
        "sample.endpoint_url=http://host:8000/v1" in err, err
    assert not (tmp_path / "runs").exists()
    # an endpoint without a served model's name: the planted target is built here, never served
    assert main(["audit", "--set", "sample.backend=openai", "--set", "sample.endpoint_url=http://host:8000/v1",
                 "--output", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--target MODEL_NAME" in err and "planted" in err, err
    assert not (tmp_path / "runs").exists()


def test_content_hash_ignores_key_order_and_sees_values():
    assert content_hash({"a": 1, "b": 2}) == content_hash({"b": 2, "a": 1})
    assert content_hash({"a": 1}) != content_hash({"a": 2})
    assert SimulateConfig().hashed() != load_config([], ["sample.k=3"]).hashed()
    assert SimulateConfig().hashed() == load_config([], ["ray.sample_actors=4"]).hashed()
    # a key added later keeps the runs made before it on their keys while it is at its old behaviour
    assert "fold_balance" not in SimulateConfig().hashed()["benchmark"]
    assert SimulateConfig().hashed() != load_config([], ["benchmark.fold_balance=length"]).hashed()
    # near-copies kept together changed what every split does: the default is a new key, and the old
    # behaviour ("ignore", "keep") the old one
    assert SimulateConfig().hashed()["benchmark"]["near_copies"] == "together"
    assert "near_copies" not in load_config([], ["benchmark.near_copies=ignore"]).hashed()["benchmark"]
    from leakray.config import AUDIT_DEFAULTS, AuditConfig

    audit = load_config([AUDIT_DEFAULTS], [], AuditConfig).hashed()["audit"]
    assert audit["cleaned_near_copies"] == "drop"
    assert "cleaned_near_copies" not in load_config([AUDIT_DEFAULTS], ["audit.cleaned_near_copies=keep"],
                                                    AuditConfig).hashed()["audit"]


def test_stage_marker(tmp_path):
    s = Stage(tmp_path, "x")
    assert not s.done
    s.finish(rows=3)
    again = Stage(tmp_path, "x")
    assert again.done and again.info()["rows"] == 3


class _Quiet:
    verbose = False

    def __init__(self):
        self.lines = []

    def stage(self, name, info, summary, cached):
        self.lines.append((name, cached, summary))


def test_stage_runner_resumes_and_records_stats(tmp_path):
    calls = []

    def make(name, fail=False):
        def run(out):
            calls.append(name)
            assert list(out.iterdir()) == []  # a killed attempt's leftovers are never read back
            if fail:
                (out / "half").mkdir()
                (out / "half" / "part-0.parquet").write_text("half written")
                raise RuntimeError("killed")
            (out / "data.txt").write_text(name)
            return {"rows_in": 2, "rows_out": 1, "errors": {"timeout": 1}}
        return run

    console = _Quiet()
    with pytest.raises(RuntimeError):
        StageRunner(tmp_path, console).run([StageSpec("a", make("a")), StageSpec("b", make("b", fail=True))])
    assert calls == ["a", "b"] and not Stage(tmp_path, "b").done
    info = StageRunner(tmp_path, console).run([StageSpec("a", make("a")), StageSpec("b", make("b"))])
    assert calls == ["a", "b", "b"]  # "a" finished before: not run again
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["_DONE.json", "data.txt"]
    assert info["a"]["rows_out"] == 1 and info["b"]["errors"] == {"timeout": 1}
    assert set(info["b"]) >= {"seconds", "rows_in", "rows_out", "errors", "parse_failures"}
    assert console.lines[-2] == ("a", True, "")


def test_the_cluster_is_joined_before_the_first_stage_that_runs_and_not_for_a_finished_run(tmp_path, monkeypatch):
    """A finished run invoked again (its report written anew) starts no cluster: Ray is joined
    once, just before the first stage that is not done, also when two stages start together."""
    from types import SimpleNamespace

    from leakray.executor import runtime
    from leakray.protocols.engine import stage_runner
    from leakray.runs import Together
    from leakray.storage import RunStore

    joined, order = [], []
    monkeypatch.setattr(runtime, "ensure_ray", lambda address, **kw: joined.append((address, kw["log_dir"])))
    cfg, store = SimpleNamespace(ray=SimpleNamespace(address="10.0.0.1:6379")), RunStore(tmp_path, "run")

    def stage(name):
        def run(out):
            order.append((name, len(joined)))  # how many joins had happened when the stage started
            return {}
        return run

    specs = [StageSpec("a", stage("a")), Together((StageSpec("b", stage("b")), StageSpec("c", stage("c"))))]
    stage_runner(cfg, store, _Quiet()).run(specs[:1])
    assert joined == [("10.0.0.1:6379", store.local / "logs")] and order == [("a", 1)]
    stage_runner(cfg, store, _Quiet()).run(specs)  # resumed: "a" is done, "b" and "c" start together
    assert len(joined) == 2 and sorted(order[1:]) == [("b", 2), ("c", 2)]
    runner = stage_runner(cfg, store, _Quiet())  # finished: every stage done
    assert runner.run(specs).keys() == {"a", "b", "c"} and len(joined) == 2 and runner.ran == []


def test_submitted_jobs_write_outside_rays_temporary_working_dir(tmp_path, monkeypatch):
    from leakray.runs import output_root

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert output_root("runs") == tmp_path / "runs"
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # what Ray's job supervisor sets
    monkeypatch.setenv("LEAKRAY_HOME", str(tmp_path / "home"))
    assert output_root("runs") == tmp_path / "home" / "runs"
    assert output_root(tmp_path / "abs") == tmp_path / "abs"


def test_a_run_ends_with_its_total_and_its_slowest_stages(tmp_path):
    from leakray.protocols.engine import time_line

    runner = StageRunner(tmp_path, _Quiet())
    runner.run([StageSpec("a", lambda out: {})])
    runner = StageRunner(tmp_path, _Quiet())  # resumed: "a" is done, "b" and "c" run now
    runner.run([StageSpec(n, lambda out: {}) for n in ("a", "b", "c")])
    assert runner.ran == ["b", "c"]
    info = {"b": {"seconds": 3.0}, "c": {"seconds": 40.0}, "d": {"seconds": 7.0}, "e": {"seconds": 1.0}}
    assert time_line(info, 61.2) == "total 61 s; slowest: c 40 s, d 7 s, b 3 s"
    assert time_line({}, 2.0) == "total 2 s (every stage was already done)"
    info["c"]["part_seconds"] = {"load": 2.0, "sample": 30.5, "execute": 6.0, "embed": 0.0}
    assert time_line(info, 61.2).endswith("; slowest parts (busy time): c/sample 30 s, c/execute 6 s, c/load 2 s")
    machine = {"busy_s": 119.0, "idle_s": 3.4, "busy_share": 0.972, "cpus": 2}
    assert time_line(info, 61.2, machine).endswith(
        "c/load 2 s; this machine's 2 CPUs were 97% busy")
    assert time_line({}, 2.0, machine) == "total 2 s (every stage was already done)"  # nothing ran: nothing to say


def test_a_stage_marker_records_how_busy_the_machine_was(tmp_path, monkeypatch):
    import time

    from leakray import runs
    from leakray.runs import machine_use

    if runs.machine_cpu() is None:
        pytest.skip("no /proc/stat on this system")

    def spin(out):
        end = time.process_time() + 0.3
        while time.process_time() < end:  # 0.3 CPU-seconds of this process's own work
            pass
        return {}

    StageRunner(tmp_path, _Quiet()).run([StageSpec("busy", spin)])
    use = json.loads((tmp_path / "busy" / "_DONE.json").read_text())["machine_cpu"]
    assert use["busy_s"] >= 0.25 and use["cpus"] == os.cpu_count() and 0 < use["busy_share"] <= 1
    assert use["busy_share"] == pytest.approx(use["busy_s"] / (use["busy_s"] + use["idle_s"]), abs=2e-3)
    # readings that cannot be compared (no /proc/stat, a counter reset) record nothing rather than a wrong share
    assert machine_use(None, (5.0, 5.0)) is None and machine_use((5.0, 5.0), (4.0, 9.0)) is None
    assert machine_use((1.0, 1.0), (4.0, 2.0)) == {"busy_s": 3.0, "idle_s": 1.0, "busy_share": 0.75,
                                                   "cpus": os.cpu_count()}
    monkeypatch.setattr(runs, "PROC_STAT", str(tmp_path / "missing"))  # macOS, a container without /proc
    StageRunner(tmp_path, _Quiet()).run([StageSpec("elsewhere", lambda out: {})])
    assert "machine_cpu" not in json.loads((tmp_path / "elsewhere" / "_DONE.json").read_text())


def test_stages_run_together_side_by_side_each_with_its_own_marker(tmp_path):
    import threading
    import time

    from leakray.runs import Together

    both_running = threading.Barrier(2, timeout=10)  # each waits for the other: only side by side passes

    def make(name, fail=False):
        def run(out):
            both_running.wait()
            if fail:
                raise RuntimeError("killed")
            (out / "data.txt").write_text(name)
            return {"rows_out": 1}
        return run

    with pytest.raises(RuntimeError, match="killed"):
        StageRunner(tmp_path, _Quiet()).run([Together((StageSpec("t", make("t")), StageSpec("s", make("s", True))))])
    assert Stage(tmp_path, "t").done and not Stage(tmp_path, "s").done  # one finished, one did not
    both_running.reset()
    runner = StageRunner(tmp_path, _Quiet())
    t0 = time.perf_counter()
    info = runner.run([Together((StageSpec("t", make("t")), StageSpec("s", lambda out: {"rows_out": 2})))])
    assert runner.ran == ["s"] and info["t"]["rows_out"] == 1 and info["s"]["rows_out"] == 2
    assert time.perf_counter() - t0 < 5  # "t" was done: "s" did not wait on a barrier nobody else reaches
    assert Together((StageSpec("t", make("t")), StageSpec("s", make("s")))).name == "t+s"


def test_a_stage_marker_gives_the_stage_wall_time_and_keeps_the_runs_own(tmp_path):
    import time

    from leakray.runs import StageRunner, StageSpec

    def run(out):
        time.sleep(0.3)  # e.g. a worker group starting, then a loop that times only itself
        return {"seconds": 0.01}

    info = StageRunner(tmp_path, _Quiet()).run([StageSpec("fit", run)])["fit"]
    assert info["seconds"] >= 0.3 and info["run_seconds"] == 0.01


def test_a_keyed_stage_another_run_finished_is_adopted_not_run(tmp_path):
    """Two runs in one output directory: the second adopts the first's keyed stage (its files, its
    marker with paths moved to the new run), runs its unkeyed one, and runs a stage whose key
    differs; with reuse off it runs everything. The adopted files outlive the donor run."""
    calls = []

    def make(name):
        def run(out):
            calls.append((out.parent.name, name))
            (out / "model").mkdir()
            (out / "model" / "weights.bin").write_bytes(b"w" * 100)
            return {"model": str(out / "model"), "paths": [str(out.parent / "other" / "x")], "rows_out": 7}
        return run

    def stages(key_b="kb"):
        return [StageSpec("a", make("a"), key="ka"), Together((StageSpec("b", make("b"), key=key_b),)),
                StageSpec("detect", make("detect"))]

    out = tmp_path / "runs"
    first = StageRunner(out / "run1", _Quiet()).run(stages())
    assert first["a"]["stage_key"] == "ka" and "stage_key" not in first["detect"]
    console = _Quiet()
    second = StageRunner(out / "run2", console).run(stages())
    assert calls == [("run1", "a"), ("run1", "b"), ("run1", "detect"), ("run2", "detect")]
    assert second["a"]["reused_from"] == "run1" and second["b"]["reused_from"] == "run1"
    assert second["a"]["model"] == str((out / "run2" / "a" / "model").resolve())  # moved to this run
    assert second["a"]["paths"] == [str((out / "run2" / "other" / "x").resolve())]
    assert second["a"]["rows_out"] == 7 and "reused_from" not in second["detect"]
    assert ("a", "reused", "(reused from run1)") in console.lines
    shutil.rmtree(out / "run1")
    assert (out / "run2" / "a" / "model" / "weights.bin").read_bytes() == b"w" * 100
    StageRunner(out / "run3", _Quiet()).run(stages(key_b="other"))  # "a" from run2 (run1 is gone), "b" anew
    assert calls[4:] == [("run3", "b"), ("run3", "detect")]
    StageRunner(out / "run4", _Quiet(), reuse=False).run(stages())
    assert calls[6:] == [("run4", "a"), ("run4", "b"), ("run4", "detect")]


def test_a_fan_outs_children_adopt_from_another_fan_outs_children_only(tmp_path):
    """A second dose sweep with other detector settings is a new parent directory: its doses find
    the first sweep's doses (both parents are marked as fan-outs); a plain run in the output
    directory does not look inside a fan-out, and a fan-out's child does not look inside a
    directory that is not one."""
    from leakray.runs import FANOUT_MARK

    calls = []

    def stages():
        return [StageSpec("target", lambda out: calls.append(out.parent) or {}, key="dose-4")]

    out = tmp_path / "runs"
    for parent in ("sweep-a", "sweep-b"):
        (out / parent).mkdir(parents=True)
        (out / parent / FANOUT_MARK).write_text("{}")
    (out / "not-a-fan-out" / "x").mkdir(parents=True)
    StageRunner(out / "not-a-fan-out" / "x", _Quiet()).run(stages())
    StageRunner(out / "sweep-a" / "dose4", _Quiet()).run(stages())  # runs: the other directory is no fan-out
    StageRunner(out / "plain", _Quiet()).run(stages())  # runs: a plain run's siblings hold no such stage
    info = StageRunner(out / "sweep-b" / "dose4", _Quiet()).run(stages())
    assert calls == [out / "not-a-fan-out" / "x", out / "sweep-a" / "dose4", out / "plain"]
    assert info["target"]["reused_from"] == "dose4" and (out / "sweep-b" / "dose4" / "target" / "_DONE.json").exists()


# (setting, stages of the simulate protocol whose key it changes): the detectors' own settings reach
# no stage before detect; what a stage reads changes its key, and the keys of the stages after it
SIMULATE_KEYS = [
    ("detect.seeds=[0,1]", set()), ("detect.bootstrap=10", set()), ("detect.threshold_rule=shadow_fpr:0.05", set()),
    ("ray.sample_actors=1", set()), ("reuse_stages=false", set()),
    ("sample.k=3", {"perturb", "collect_shadow", "collect_target"}),
    ("embed.batch_size=4", {"perturb", "collect_shadow", "collect_target"}),
    ("columns.upper_case=false", {"perturb", "collect_shadow", "collect_target"}),
    # which passes a collection makes follows the requested detectors
    ("detect.detectors=[min_k,ref_loss]", {"perturb", "collect_shadow", "collect_target"}),
    ("target.epochs=3", "all"), ("model.base=tiny-alt", "all"), ("benchmark.fold_seed=5", "all"),
    ("leak.member_fraction=0.2", "all"),
]


@pytest.mark.parametrize("setting,changed", SIMULATE_KEYS)
def test_a_stage_key_changes_with_what_the_stage_reads(setting, changed):
    from leakray.config import load_config
    from leakray.protocols.stage_keys import simulate_keys

    before, after = simulate_keys(load_config([], []), "d"), simulate_keys(load_config([], [setting]), "d")
    got = {name for name in before if before[name] != after[name]}
    assert got == (set(before) if changed == "all" else changed)
    assert simulate_keys(load_config([], []), "other benchmark") != before and set(before) == {
        "folds", "base", "shadow_base", "corpus", "target", "shadow", "perturb", "collect_shadow", "collect_target"}


@pytest.mark.parametrize("detectors,loads", [
    ("[ref_calibrated_nonoracle]", True), ("[next_token_calibrated_nonoracle]", True),
    ("[question_next_token_calibrated_nonoracle]", True), ("[next_token_calibrated,ref_calibrated]", False)])
def test_the_non_oracle_reference_is_loaded_for_every_detector_that_reads_it(detectors, loads):
    """Not only for `ref_calibrated_nonoracle`: the probes' `_nonoracle` variants read its draws, and
    a black-box sweep that asked for them alone found their columns empty and skipped them."""
    from leakray.config import load_config
    from leakray.protocols.simulate import nonoracle_reference
    from leakray.protocols.stage_keys import collection_needs

    cfg = load_config([], ["columns.nonoracle_reference=auto", f"detect.detectors={detectors}"])
    assert (nonoracle_reference(cfg) is not None) == loads
    assert collection_needs(cfg)["second_reference"] == loads


AUDIT_KEYS = [
    *((f"audit.{k}={v}", set()) for k, v in (("fdr", 0.2), ("lam", 0.3), ("max_width", 0.5), ("route", "card"),
                                             ("bootstrap", 10), ("detector", "min_k"))),
    ("audit.rewrites=2", {"rewrite_scores"}), ("audit.corpus=corpus/*.py", {"screen"}),
    ("detect.seeds=[0,1]", {"card"}), ("audit.fpr=0.1", "all"),
    ("sample.k=3", {"perturb", "collect_shadow", "collect_target", "card", "rewrite_scores", "control_scores",
                    "screen"}),
    ("shadow.epochs=3", "all"),
    # the model under audit: the shadow's side (and the card) stay, audits of two targets share them
    *((setting, {"split", "target", "collect_target", "rewrite_scores", "control_scores", "screen"})
      for setting in ("audit.member_fraction=0.3", "target.epochs=3", "audit.planted_base=tiny-alt",
                      f"audit.target={FIXTURES / 'model_dir_stand_in'}")),
]


@pytest.mark.parametrize("setting,changed", AUDIT_KEYS)
def test_an_audit_stage_key_changes_with_what_the_stage_reads(setting, changed):
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.protocols.stage_keys import audit_keys

    def keys(*settings, **extra):
        return audit_keys(load_config([AUDIT_DEFAULTS], list(settings), AuditConfig), "d", **extra)

    before, after = keys(), keys(setting)
    assert {name for name in before if before[name] != after[name]} == (set(before) if changed == "all" else changed)
    # a reused card keys every stage but the card's own; control tasks key their stage by content
    with_card = keys(card_id="c1")
    assert {n for n in before if before[n] != with_card[n]} == set(before) - {"card"}
    assert {n for n in before if before[n] != keys(control_digest="x")[n]} == {"control_scores"}


def test_a_card_of_another_format_is_made_again_not_adopted(monkeypatch):
    """Cards of version 2 hold CGMIA's and AdvPrompt-MIA's cuts on their probabilities; the
    detectors score by log-odds since (card version 3). An audit re-run after an upgrade would
    adopt the old card stage, then refuse to load it; the card's key carries the format, so the
    card is built again and the shadow's models and collections are adopted."""
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.detect import card
    from leakray.protocols.stage_keys import audit_keys

    cfg = load_config([AUDIT_DEFAULTS], [], AuditConfig)
    now = audit_keys(cfg, "d")
    monkeypatch.setattr(card, "VERSION", card.VERSION - 1)
    before = audit_keys(cfg, "d")
    assert {n for n in now if now[n] != before[n]} == {"card"}


def test_a_detector_added_to_the_registry_is_a_new_run_of_all_and_a_new_card(monkeypatch):
    """`detect.detectors: all` is the registry as the run finds it. Before, a plug-in added to an
    existing run (or a detector a new release brings) found that run's detect stage "done before"
    and never ran. Now it is another run; the models and collections are adopted by key, the
    audit's card and the detect stage are made anew."""
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.detect import registry
    from leakray.protocols.simulate import run_id
    from leakray.protocols.stage_keys import audit_keys, simulate_keys

    tasks = [{"task_id": "t/0", "prompt": "p", "reference": "r", "tests": ""}]

    def state():
        cfg, audit = load_config([], []), load_config([AUDIT_DEFAULTS], [], AuditConfig)
        return run_id(cfg, tasks), simulate_keys(cfg, "d"), audit_keys(audit, "d"), audit.hashed()

    monkeypatch.delenv("LEAKRAY_DETECTORS", raising=False)
    run, keys, audit, audit_hashed = state()
    monkeypatch.setenv("LEAKRAY_DETECTORS", f"toy={FIXTURES.parent / 'plugins' / 'toy_detector.py'}:Toy")
    run2, keys2, audit2, audit_hashed2 = state()
    assert run2 != run and keys2 == keys and audit_hashed2 != audit_hashed
    assert {name for name in audit if audit[name] != audit2[name]} == {"card"}
    # a list naming exactly the registry is the same run as "all"
    every = load_config([], [f"detect.detectors=[{','.join(registry.names())}]"])
    assert run_id(every, tasks) == run2


def test_no_reuse_runs_every_stage_and_keeps_the_runs_name():
    """`--no-reuse` is a setting outside the run's hash: the same run directory, nothing adopted."""
    from leakray.cli import build_parser
    from leakray.commands.run import config_from_args
    from leakray.protocols.simulate import run_id

    tasks = [{"task_id": "t/0", "prompt": "p", "reference": "r", "tests": ""}]
    for argv in (["demo"], ["simulate", "--no-reuse"]):
        cfg = config_from_args(build_parser().parse_args(argv))
        assert cfg.reuse_stages is (argv == ["demo"])
        assert run_id(cfg, tasks) == run_id(load_config([], []), tasks)


def test_how_often_a_failed_row_is_tried_again_is_not_part_of_the_run():
    """A retried row is sampled with its own seed, as its first attempt was: a resumed run with
    another `sample.row_retries` is the same run, not a new one that samples everything again."""
    base = load_config([DEFAULT], [], SimulateConfig).hashed()
    retried = load_config([DEFAULT], ["sample.row_retries=3", "sample.row_retry_wait_s=5"], SimulateConfig)
    assert retried.hashed() == base
    assert load_config([DEFAULT], ["sample.max_new_tokens=7"], SimulateConfig).hashed() != base
    with pytest.raises(BadInput, match="row_retries"):
        load_config([DEFAULT], ["sample.row_retries=-1"], SimulateConfig)


def test_an_endpoint_audit_shares_the_shadow_side_of_a_local_one():
    """Behind an endpoint the shadow is sampled here (HF backend), so the endpoint's settings are the
    target's alone: audits of two endpoints, or of an endpoint and a local model, adopt one shadow,
    its collection and its card; what reads the target is keyed by its endpoint."""
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.protocols.stage_keys import audit_keys

    def keys(*settings):
        return audit_keys(load_config([AUDIT_DEFAULTS], list(settings), AuditConfig), "d")

    local = keys(f"audit.target={FIXTURES / 'model_dir_stand_in'}")
    served = [keys("audit.target=served", "sample.backend=openai", f"sample.endpoint_url=http://{host}:8000/v1",
                   f"sample.max_retries={retries}", *api) for host, retries, api in
              (("a", 5, ()), ("b", 9, ()), ("a", 5, ("sample.endpoint_api=chat",)))]
    shadow = ("base", "shadow", "perturb", "collect_shadow", "card")
    assert all(local[n] == s[n] for s in served for n in shadow)
    assert len({local["collect_target"], *(s["collect_target"] for s in served)}) == 4
    # a sampling setting both sides read still keys both
    assert keys("audit.target=served", "sample.backend=openai", "sample.endpoint_url=http://a:8000/v1",
                "sample.k=3")["collect_shadow"] != served[0]["collect_shadow"]


def test_a_cards_name_does_not_read_how_often_a_failed_row_is_tried_again():
    """`card build` names its directory by what the card is made of; the row-retry settings are
    outside it, as outside every hash (with them the default card kept the name 0b3caf3 gave it,
    checked once against that commit's code)."""
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.protocols.audit import card_run_name

    name = card_run_name(load_config([AUDIT_DEFAULTS], [], AuditConfig), "d")
    assert card_run_name(load_config([AUDIT_DEFAULTS], ["sample.row_retries=4", "sample.row_retry_wait_s=1"],
                                     AuditConfig), "d") == name
    assert card_run_name(load_config([AUDIT_DEFAULTS], ["sample.k=3"], AuditConfig), "d") != name


def test_a_resumable_stage_finds_what_its_killed_attempt_kept_and_nothing_else(tmp_path):
    """A resumable stage (a collection) keeps its finished rows under kept/<its key>: the next
    attempt of the same stage and key finds them; whatever else the killed attempt left, and
    what another key kept, is cleared; a finished stage keeps none of it; a stage that is not
    resumable gets no such directory."""
    from leakray.runs import KEPT, kept_dir

    seen = []

    def run(out):
        kept = kept_dir(out)
        seen.append((sorted(p.name for p in kept.iterdir()), (out / "half-written.parquet").exists()))
        (kept / f"rows-{len(seen)}").write_text("rows")
        (out / "half-written.parquet").write_text("")
        if len(seen) == 1:
            raise KeyboardInterrupt  # killed mid-stage
        return {}

    stage = tmp_path / "collect"
    with pytest.raises(KeyboardInterrupt):
        StageRunner(tmp_path, _Quiet()).run([StageSpec("collect", run, key="k1", resumable=True)])
    (stage / KEPT / "k0").mkdir()  # kept under other settings
    StageRunner(tmp_path, _Quiet()).run([StageSpec("collect", run, key="k1", resumable=True)])
    assert seen == [([], False), (["rows-1"], False)]
    assert (stage / "_DONE.json").exists() and not (stage / KEPT).exists()
    assert StageRunner(tmp_path, _Quiet()).run([StageSpec("plain", lambda out: {"kept": kept_dir(out)})])[
        "plain"]["kept"] is None
