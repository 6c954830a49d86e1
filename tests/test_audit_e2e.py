"""The audit end to end on the real local head (a planted leak, killed while building its card
and resumed, then the same audit again from its card with no fine-tuning). A module of its own:
the tests on the real head run on one xdist worker, one after another (conftest.py)."""

import gzip
import json
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import ROOT  # ray_head (a real `ray start --head`) is conftest's session fixture

AUDIT = ["--quick", "--set", "detect.detectors=[ref_loss,min_k,gt_match,cgmia,advprompt,toy]", "--set", "audit.member_fraction=0.25",
         "--set", "columns.upper_case=false", "--set", "detect.trace_memory=false",
         # AdvPrompt's plumbing with one kind's two variants: its completions and embeddings were a third
         # of each collection's work with all 11 (docs/PERTURB.md, "Choosing kinds")
         "--set", "columns.advprompt_kinds=[IDP]"]


@pytest.mark.slow
# generous guards: three invocations (killed, resumed, card reused) on a possibly busy 2-core machine
@pytest.mark.timeout(2400)
def test_audit_end_to_end_then_reuse_card(ray_head, tmp_path, leakray_cache):
    _, _, gcs, env = ray_head
    out = tmp_path / "runs"
    # a detector kept outside leakray (one file + one entry) goes into the card and the audit
    env = dict(env, LEAKRAY_CACHE=str(leakray_cache), LEAKRAY_DETECTORS="toy=tests/plugins/toy_detector.py:Toy")

    def audit(*extra):
        proc = subprocess.run([sys.executable, "-m", "leakray.cli", "audit", *AUDIT, *extra, "--output", str(out),
                               "--address", gcs], env=env, capture_output=True, text=True, timeout=1500, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    corpus = ["--corpus", str(ROOT / "tests" / "fixtures" / "screen" / "corpus")]  # holds a copy of HumanEval/0
    # killed (SIGKILL) while building the card; the next invocation resumes at the card
    killed = subprocess.run([sys.executable, "-m", "leakray.cli", "audit", *AUDIT, *corpus, "--output", str(out),
                             "--address", gcs], env=dict(env, LEAKRAY_KILL_IN_STAGE="card"), capture_output=True,
                            text=True, timeout=1500, cwd=ROOT)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (run,) = out.glob("audit-*")
    assert not (run / "card" / "_DONE.json").exists() and (run / "card" / "partial.tmp").exists()
    before_kill = {p.parent.name: p.stat().st_mtime for p in run.glob("*/_DONE.json")}
    assert set(before_kill) >= {"split", "base", "perturb", "shadow", "collect_shadow"}
    audit(*corpus)
    assert {p.parent.name: p.stat().st_mtime for p in run.glob("*/_DONE.json") if p.parent.name in before_kill} \
        == before_kill
    report = json.loads((run / "report.json").read_text())
    s = report["summary"]
    assert s["n_tasks"] == 32 and sum(s["verdicts"].values()) == 32
    lf = s["leaked_fraction"]
    assert lf["truth"] == 0.25
    # against the prebuilt tiny-alt reference the self-calibrated route sees the planted 25% even on
    # 32 tasks (measured: 25.0% [12.5%, 37.6%], net of difficulty; 27.7% [15.5%, 40.7%] raw; with a
    # 30-step stand-in reference it could not tell).
    # docs/AUDIT.md has the validation matrix.
    assert s["self_calibrated"]["n_tasks"] == 32 and s["self_calibrated"]["usable"]
    assert lf["route"] == "self-calibrated" and lf["ci"][0] <= lf["truth"] <= lf["ci"][1]
    assert abs(lf["estimate"] - lf["truth"]) <= 0.10 and s["verdicts"]["suspected"] >= 1
    assert set(s["crossfit"]["detectors"]) == {"cgmia", "advprompt"}  # learned: scored only held-out tasks
    card = json.loads((run / "card" / "card.json").read_text())
    assert {"toy", "advprompt"} <= set(card["detectors"])  # a plug-in and AdvPrompt-MIA are in the card
    assert {"toy", "advprompt"} <= set(report["truth"]["target_auc"])  # and scored in the audit
    assert report["truth"]["target_auc"]["ref_loss"] >= 0.9  # the planted leak is real
    samples = pq.read_table(run / "samples.parquet").to_pylist()
    assert len(samples) == 32 and {r["verdict"] for r in samples} <= {"confirmed", "suspected", "clean"}
    confirmed = [r for r in samples if r["verdict"] == "confirmed"]
    assert [r["task_id"] for r in confirmed] == ["HumanEval/0"] and max(confirmed[0]["jaccard"], confirmed[0]["containment"]) >= 0.7
    assert "copy_he0.py" in confirmed[0]["evidence"]
    assert all(0 <= r["probability"] <= 1 for r in samples)
    # near-copies inside the benchmark: none among these 32 tasks (HumanEval's one pair is /56 ~ /61)
    assert s["near_copies"]["pairs"] == [] and all(r["near_copies"] == [] for r in samples)
    assert s["near_copies"]["dropped"] and report["cleaned"]["near_copies_removed"] == 0  # audit.cleaned_near_copies
    removed = (run / "cleaned" / "removed_ids.txt").read_text().split()
    assert len(removed) == s["inflation"]["n_flagged"] == s["verdicts"]["suspected"] + 1
    assert (run / "cleaned" / "HumanEval.jsonl.gz").exists() and (run / "report.html").exists()
    # the first 32 tasks audited (--quick): the cleaned file holds those found clean, no unjudged one
    cleaned = [json.loads(line)["task_id"] for line in gzip.open(run / "cleaned" / "HumanEval.jsonl.gz", "rt")]
    assert sorted(cleaned) == sorted(r["task_id"] for r in samples if r["task_id"] not in removed)
    assert (run / "report.md").read_text().startswith("# leakray audit")
    assert s["self_calibrated"]["adjustment"]["n"] == 32  # the statistic net of difficulty (audit.net_of_difficulty)
    assert "net of each task's difficulty and length" in (run / "report.md").read_text()
    assert "AdvPrompt-MIA completed the variants of IDP only" in (run / "report.md").read_text()
    assert "Time by stage (wall, in the invocation that ran it; the machine's CPUs busy over it): " \
        in (run / "report.md").read_text()
    # and inside each: the card's fits and calibration, the fine-tunes' training (leakray.parts)
    card_parts = json.loads((run / "card" / "_DONE.json").read_text())["part_seconds"]
    assert {"fit", "threshold", "score", "metrics", "calibrate"} <= set(card_parts)
    inside = (run / "report.md").read_text().split("Inside the stages (")[1]
    assert "card: " in inside and "calibrate " in inside.split("card: ")[1].split(";")[0]
    assert f"torch's CPU kernels **{report['environment']['torch_cpu_capability']}**" in (run / "report.md").read_text()

    # another report setting is another audit, but no stage reads it: every stage is adopted from the
    # run above (its files, no work, no cluster started) and only the report is made anew
    audit(*corpus, "--set", "audit.fdr=0.2")
    (again,) = [d for d in out.glob("audit-*") if d != run]
    assert {p.parent.name: json.loads(p.read_text())["reused_from"] for p in again.glob("*/_DONE.json")} \
        == dict.fromkeys((p.parent.name for p in run.glob("*/_DONE.json")), run.name)
    assert not (again / "logs" / "ray").exists()
    r_again = json.loads((again / "report.json").read_text())["summary"]
    same = ("estimate", "ci", "route")
    assert [r_again["leaked_fraction"][k] for k in same] == [lf[k] for k in same]
    shutil.rmtree(again)  # the card reuse below finds one audit beside the first

    # the card reused on a given target (the planted model, by path) over 8 of the tasks: no shadow,
    # no detector fitting, and per task the very scores the card-building audit gave (a second
    # 32-task collection would double this test's time for the same check)
    # with control tasks (40 HumanEval tasks outside the audited 8, under new ids): the control route's
    # stage and report run; 8 benchmark tasks are too few for its number, so it says so and defers
    control = tmp_path / "control.jsonl"
    control.write_text("".join(json.dumps({**r, "task_id": f"Fresh/{i}"}) + "\n"
                               for i, r in enumerate(_humaneval_records()[40:80])))
    audit("--card", str(run / "card"), "--target", str(run / "target" / "model"), "--set", "benchmark.limit=8",
          "--control", f"fresh={control}")
    (reuse,) = [d for d in out.glob("audit-*") if d != run]
    assert not (reuse / "shadow").exists() and not (reuse / "card").exists() and not (reuse / "target").exists()
    r2 = json.loads((reuse / "report.json").read_text())
    assert r2["summary"]["card"] == s["card"] and r2["summary"]["n_tasks"] == 8
    assert "truth" not in r2["summary"]["leaked_fraction"]  # a given target's membership is unknown
    a = pq.read_table(run / "scores.parquet").to_pandas().drop(columns="member")
    b = pq.read_table(reuse / "scores.parquet").to_pandas().drop(columns="member")
    a = a[a.task_id.isin(set(b.task_id))]
    assert len(b) == len(a) > 0
    key = ["detector", "task_id"]
    a, b = a.sort_values(key).reset_index(drop=True), b.sort_values(key).reset_index(drop=True)
    assert a[key].equals(b[key])
    # the same model and card: the same scores, up to float32 rounding of another batch size; a
    # learned detector's own training tasks are NaN (cross-fitting) in both
    np.testing.assert_allclose(a["score"].to_numpy(), b["score"].to_numpy(), rtol=1e-6, atol=1e-6)
    scored = pq.read_table(reuse / "control_scores" / "control_scores.parquet").to_pylist()
    assert [r["set"] for r in scored] == ["benchmark"] * 8 + ["control"] * 40 and not any(r["reason"] for r in scored)
    marker = json.loads((reuse / "control_scores" / "_DONE.json").read_text())  # its parts (leakray.parts)
    assert set(marker["part_seconds"]) == {f"{p}_{m}" for p in ("load", "score") for m in ("target", "reference")}
    assert marker["throughput"]["target_texts_per_s"] > 0 and marker["throughput"]["reference_texts_per_s"] > 0
    c = r2["summary"]["control"]
    assert c["n_control"] == 40 and c["n_tested"] == 8 and not c["usable"] and "30 of each needed" in c["why_unusable"]
    assert r2["summary"]["leaked_fraction"]["route"] != "control"
    assert "- control route (8 tasks against 40 control tasks" in (reuse / "report.md").read_text()


def _humaneval_records() -> list[dict]:
    import gzip

    from leakray.data.humaneval import packaged_path

    with gzip.open(packaged_path(), "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]
