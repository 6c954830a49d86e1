"""End to end on a real local head (`ray start --head`) through `ray job submit`: the
simulated-leakage protocol (small k, few epochs), resumed in-process from its completion
markers, and a screening job."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT, _submit  # ray_head (a real `ray start --head`) is conftest's session fixture

# a detector kept outside leakray: one file + one entry (leakray/detect/registry.py)
PLUGIN = {"LEAKRAY_DETECTORS": "toy=tests/plugins/toy_detector.py:Toy"}
# A planted leak strong enough to be seen on 6 + 6 tasks: the members are memorised. Measured with
# these settings: 18 epochs, 5 of 6 members pass in each model and every detector's AUC is 1.0 (as
# with 25, 28% more steps); 14 epochs, no member passes yet (the test's leak assertions would fail).
SMALL = ["--quick", "--set", "target.epochs=18", "--set", "shadow.epochs=18", "--set", "sample.max_new_tokens=128",
         "--set", "detect.cgmia.epochs=50", "--set", "detect.seeds=[0,1]",
         "--set", "detect.detectors=[cgmia,ref_loss,gt_match,detectleak,min_k,advprompt,toy]",
         "--set", "detect.advprompt_ablation=false", "--set", "columns.upper_case=false",
         # what the assertions need, not a measurement: no tracemalloc, fewer bootstrap resamples
         "--set", "detect.trace_memory=false", "--set", "detect.bootstrap=200",
         # one sampler worker: each collection is two batches of 8 tasks, and a second worker's start-up
         # (~6.7 CPU s importing torch and transformers, loading two models) outweighs the batch it
         # takes; the audit's end-to-end test runs two on the head
         "--set", "ray.sample_actors=1",
         # AdvPrompt's plumbing with one kind's two variants: its completions and embeddings were a third
         # of each collection's work with all 11 (docs/PERTURB.md, "Choosing kinds")
         "--set", "columns.advprompt_kinds=[IDP]"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_screen_job_submit(ray_head, tmp_path):
    fix = ROOT / "tests" / "fixtures" / "screen"
    out = tmp_path / "screen"
    _submit(ray_head, ["jobs/screen.py", "--benchmark", f"humaneval={fix / 'humaneval.jsonl'}",
                       "--corpus", str(fix / "corpus"), "--output", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    he = summary["benchmarks"]["humaneval"]
    assert he["n_leaked"] >= 1 and 0 < he["ratio"] <= 1
    assert (out / "pairs.parquet").exists() and (out / "labels.csv").exists()


@pytest.mark.slow
@pytest.mark.timeout(2400)  # generous guard: a killed run, a submitted job and a resume
def test_simulate_job_submit_then_resume(ray_head, tmp_path, leakray_cache):
    _, _, gcs, env = ray_head
    out, cache = tmp_path / "runs", leakray_cache
    # A driver killed (SIGKILL) inside the target's collection: every stage before it is marked
    # done, the killed one is not; the submitted job then resumes there from another process.
    killed = subprocess.run(
        [sys.executable, "-m", "leakray.cli", "simulate", *SMALL, "--output", str(out), "--address", gcs],
        env=dict(env, LEAKRAY_CACHE=str(cache), LEAKRAY_KILL_IN_STAGE="collect_target", **PLUGIN),
        capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (run_dir,) = out.iterdir()
    assert (run_dir / "collect_target" / "partial.tmp").exists()
    assert not (run_dir / "collect_target" / "_DONE.json").exists() and not (run_dir / "detect").exists()
    before_kill = {p.parent.name: p.stat().st_mtime for p in run_dir.glob("*/_DONE.json")}
    assert set(before_kill) >= {"folds", "perturb", "base", "target", "shadow", "collect_shadow"}
    _submit(ray_head, ["jobs/simulate.py", *SMALL, "--output", str(out)], {"LEAKRAY_CACHE": str(cache), **PLUGIN})
    assert {n: t for n, t in ((p.parent.name, p.stat().st_mtime) for p in run_dir.glob("*/_DONE.json"))
            if n in before_kill} == before_kill  # resumed: nothing finished ran twice
    report = json.loads((run_dir / "report.json").read_text())
    for name in ("cgmia", "detectleak", "advprompt", "min_k", "toy"):
        m = report["detectors"][name]
        assert set(m) >= {"precision", "recall", "mcc", "auc", "tpr_at_1fpr", "tpr_at_5fpr", "auc_ci", "n_neg"}
    # the planted leak is found: a broken pipeline (features, labels, thresholds) lands near 0.5
    assert report["detectors"]["ref_loss"]["auc"] >= 0.9
    assert report["detectors"]["cgmia"]["auc"] >= 0.75
    assert report["threshold_rule"] == "shadow_max_mcc" and report["detectors"]["cgmia"]["n_neg"] == 6
    leak = report["leak"]
    assert leak["target"]["members"]["tasks"] == leak["target"]["non_members"]["tasks"] == 6
    member_passes = sum(leak[role]["members"]["tasks_with_a_pass"] for role in ("target", "shadow"))
    assert member_passes >= 1 and all(leak[role]["non_members"]["tasks_with_a_pass"] == 0 for role in leak)
    assert leak["target"]["members"]["min_edit_distance"] < leak["target"]["non_members"]["min_edit_distance"] - 0.1
    assert report["isolation"] and set(report["stages"]) >= {"perturb", "collect_target", "detect"}
    # every stage that works says where its time went (leakray.parts), as the console's last line does
    parts = {name: set(st.get("part_seconds") or ()) for name, st in report["stages"].items()}
    # (the perturb stage's proofs may all come from the session's proof cache: then it timed nothing)
    assert parts["target"] == parts["shadow"] == {"load", "train", "save"}
    assert parts["detect"] >= {"fit", "threshold", "score", "metrics", "advprompt_graybox"}
    assert "sample" in parts["collect_target"] and report["stages"]["target"]["throughput"]["trained_tokens_per_s"] > 0
    assert " s, load " in (run_dir / "report.md").read_text().split("## Stages")[1]  # the parts column
    assert report["seeds"]["detector"] == [0, 1]
    assert len(report["detectors_full"]["per_seed"]["cgmia"]) == 2
    assert (run_dir / "report.md").read_text().startswith("# leakray simulated-leakage audit")
    # each fine-tune names the CPU kernels that trained it (a Ray task's process, not the driver's)
    assert all(report["models"][role]["host"]["torch_cpu_capability"] for role in ("target", "shadow"))

    # Same command again, in-process against the same cluster: every stage is marked done.
    done_before = {p.parent.name: p.stat().st_mtime for p in run_dir.glob("*/_DONE.json")}
    resumed = subprocess.run(
        [sys.executable, "-m", "leakray.cli", "simulate", *SMALL, "--output", str(out), "--address", gcs],
        env=dict(env, LEAKRAY_CACHE=str(cache), **PLUGIN), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert {p.parent.name: p.stat().st_mtime for p in run_dir.glob("*/_DONE.json")} == done_before
    assert json.loads((run_dir / "report.json").read_text())["detectors"] == report["detectors"]
