import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from leakray.report.simulate import leak_summary, render_markdown, write_report
from leakray.runs import MARKER
from leakray.schema import C, collection_schema


def _table(rows):
    schema = collection_schema()
    cols = {name: [r.get(name) for r in rows] for name in schema.names}
    return pa.table(cols, schema=schema)


def _row(member, passed, edit):
    return {C.TASK_ID: f"t{member}{passed}{edit}", C.MEMBER: member, C.PASSED: passed, C.EDIT_DISTANCE: edit,
            C.CODEBLEU: [0.5] * len(passed), C.PERPLEXITY: [3.0] * len(passed), C.REF_LOSS: 1.0,
            C.HAS_TESTS: True}


def test_leak_summary_separates_members_and_says_graded():
    table = _table([_row(1, [True, False], [0.1, 0.3]), _row(1, [False, False], [0.4, 0.5]),
                    _row(0, [False, False], [0.8, 0.9]), _row(0, [False, False], [0.7, 0.9])])
    s = leak_summary(table)
    assert s["members"]["pass_rate"] == 0.25 and s["non_members"]["pass_rate"] == 0.0
    assert s["members"]["tasks_with_a_pass"] == 1
    assert s["members"]["min_edit_distance"] == 0.25 and s["non_members"]["min_edit_distance"] == 0.75
    assert s["graded"] is True


def test_saturated_leak_is_not_graded():
    table = _table([_row(1, [True, True], [0.0, 0.0]), _row(0, [False, False], [0.8, 0.9])])
    assert leak_summary(table)["graded"] is False


def test_markdown_has_every_detector_row():
    report = {"benchmark": {"name": "humaneval"}, "protocol": "p",
              "detectors": {"cgmia": {"auc": 0.9, "cost": {"wall_s": 2.0, "peak_rss_mb": 147.25,
                                                           "peak_rss_how": "sampled"}},
                            "detectleak": {"auc": float("nan"), "cost": {"wall_s": 0.1, "peak_rss_mb": 3.5,
                                                                         "peak_rss_how": "high-water mark"}}},
              "leak": {r: leak_summary(_table([_row(1, [True, False], [0.1, 0.3]),
                                               _row(0, [False, False], [0.8, 0.9])])) for r in ("target", "shadow")},
              "timings_s": {"base": 1.0}, "models": {}, "collections": {}, "seeds": {}}
    md = render_markdown(report)
    assert "| cgmia |" in md and "0.900" in md and "| detectleak |" in md and "nan" in md
    assert "graded leak: **yes**" in md
    # a sampled peak is a lower bound and says so; the kernel's mark is exact
    assert "≥ 147.250" in md.split("| cgmia |")[1].split("\n")[0]
    assert "≥" not in md.split("| detectleak |")[1].split("\n")[0] and "3.500" in md


def _write_marker(run_dir, stage, **info):
    (run_dir / stage).mkdir(parents=True, exist_ok=True)
    (run_dir / stage / MARKER).write_text(json.dumps({"stage": stage, **info}))


def test_write_report_states_thresholds_degenerate_seeds_negatives_intervals_stages(tmp_path):
    import torch

    from cgmia_data import synthetic_collection
    from leakray.detect.cgmia import CGMIAConfig
    from leakray.protocols.detectors import evaluate_detectors, scores_to_dict

    torch.set_num_threads(1)
    shadow = synthetic_collection(n=80, seed=1)
    target = synthetic_collection(n=60, seed=2, prefix="u", member_share=0.3)  # 42 non-members
    res = evaluate_detectors(shadow, target, CGMIAConfig(epochs=3, expert_proj_dim=32, hidden=(16,), lr=1e-3,
                                                         batch_size=32),
                             seeds=[0, 1], threshold_rule="shadow_fpr:0.05", bootstrap=200, bootstrap_seed=7)
    # one seed made no positive call: degenerate, MCC 0
    res["per_seed"]["cgmia"][1].update(mcc=0.0, degenerate=True)
    from leakray.evaluate.metrics import median_over_repeats
    res["median"]["cgmia"] = median_over_repeats(res["per_seed"]["cgmia"])
    run = tmp_path / "humaneval-abc"
    for role, table in (("shadow", shadow), ("target", target)):
        _write_marker(run, f"collect_{role}", seconds=12.5, rows_in=table.num_rows, rows_out=table.num_rows,
                      errors={"timeout": 2}, parse_failures={"codebleu": 3}, isolation="bwrap",
                      machine_cpu={"busy_s": 24.1, "idle_s": 0.9, "busy_share": 0.964, "cpus": 2})
        pq.write_table(table, run / f"collect_{role}" / "collection.parquet")
    _write_marker(run, "detect", seconds=4.0, rows_in=140)  # no rows_out/errors recorded
    (run / "detect" / "metrics.json").write_text(json.dumps(scores_to_dict({**res, "scores": None})))
    cfg = {"benchmark": {"name": "humaneval", "fold_seed": 0}, "target": {"seed": 1}, "shadow": {"seed": 2},
           "sample": {"seed": 3}, "detect": {"seeds": [0, 1]}}

    report = write_report(run, cfg, {"total_this_invocation": 20.0})

    assert report["threshold_rule"] == "shadow_fpr:0.05" and report["bootstrap"] == {"n_resamples": 200, "seed": 7,
                                                                                      "groups_drawn_whole": 0}
    assert report["isolation"] == {"collect_shadow": "bwrap", "collect_target": "bwrap"}
    cg = report["detectors"]["cgmia"]
    assert cg["n_degenerate"] == 1 and cg["n_repeats"] == 2 and cg["n_neg"] == 42
    assert cg["min_nonzero_fpr"] == pytest.approx(1 / 42)
    assert cg["auc_ci"][0] <= cg["auc"] <= cg["auc_ci"][1] and len(cg["tpr_at_5fpr_ci"]) == 2
    assert cg["threshold"]["rule"] == "shadow_fpr:0.05" and len(cg["threshold"]["values"]) == 2
    assert "out-of-fold" in cg["threshold"]["chosen_on"]
    assert report["detectors"]["detectleak"]["threshold"]["values"] == res["thresholds"]["detectleak"]["values"]
    assert report["stages"]["collect_target"] == {"seconds": 12.5, "machine_busy": 0.964, "rows_in": 60,
                                                  "rows_out": 60, "errors": {"timeout": 2},
                                                  "parse_failures": {"codebleu": 3}}
    assert report["stages"]["detect"]["rows_out"] is None and report["stages"]["detect"]["machine_busy"] is None
    assert json.loads((run / "report.json").read_text())["detectors"] == json.loads(json.dumps(report["detectors"]))

    md = (run / "report.md").read_text()
    head = md.split("## Detectors")[0]
    assert "Sandbox isolation of generated code: **bwrap**" in head
    env = report["environment"]  # which kernels computed the numbers (they differ across CPUs)
    assert env["torch_cpu_capability"] and env["cpu"] and env["torch"] and env["python"]
    assert f"torch's CPU kernels **{env['torch_cpu_capability']}**" in head
    assert "rule `shadow_fpr:0.05`" in md and "chosen on the shadow collection" in md
    assert "| 1 of 2 |" in md and "| 42 |" in md
    assert f"[{cg['auc_ci'][0]:.3f}, {cg['auc_ci'][1]:.3f}]" in md
    assert "42 non-members" in md and "1/42" in md and "200 resamples" in md
    assert "| collect_target | 12.5 | 96% | 60 | 60 | timeout: 2 | codebleu: 3 |" in md
    assert "| detect | 4.0 | – | 140 | – | – | – |" in md  # a marker without the machine's reading
    assert "machine busy: the share of the CPU time" in md


def test_isolation_line_mixed_and_missing():
    base = {"benchmark": {"name": "humaneval"}, "protocol": "p", "detectors": {}, "timings_s": {},
            "leak": {r: leak_summary(_table([_row(1, [True, False], [0.1, 0.3]),
                                             _row(0, [False, False], [0.8, 0.9])])) for r in ("target", "shadow")},
            "models": {}, "collections": {}, "seeds": {}}
    md = render_markdown({**base, "isolation": {"collect_shadow": "bwrap", "collect_target": "none"}})
    assert "collect_shadow: **bwrap**; collect_target: **none**" in md.split("## Detectors")[0]
    md = render_markdown({**base, "isolation": {"collect_shadow": None}})
    assert "Sandbox isolation of generated code: **–**" in md
    assert "not recorded" in render_markdown(base)


def test_a_run_of_fewer_advprompt_kinds_says_so():
    base = {"benchmark": {"name": "humaneval"}, "protocol": "p", "detectors": {"advprompt": {"auc": 0.8}},
            "timings_s": {}, "models": {}, "collections": {}, "seeds": {},
            "leak": {r: leak_summary(_table([_row(1, [True, False], [0.1, 0.3]),
                                             _row(0, [False, False], [0.8, 0.9])])) for r in ("target", "shadow")}}
    every = {"advprompt": True, "advprompt_kinds": ["IDC", "IRV", "VR", "IDP", "IDL"]}
    assert "completed the variants" not in render_markdown({**base, "config": {"columns": every}})
    md = render_markdown({**base, "config": {"columns": {**every, "advprompt_kinds": ["VR", "IDP"]}}})
    assert "AdvPrompt-MIA completed the variants of VR, IDP only" in md


def test_audit_report_says_what_each_stage_cost():
    from leakray.report.costs import time_by_stage

    stages = {"split": {"seconds": 0.0}, "perturb": {"seconds": 0.04}, "collect_target": {"seconds": 32.4, "machine_cpu": {"busy_share": 0.995}},
              "card": {"seconds": 11.5, "machine_cpu": {"busy_share": 0.739}}, "screen": {"seconds": 1.4}}
    assert time_by_stage(stages, {"total_this_invocation": 60.2}) == [
        "", "Time by stage (wall, in the invocation that ran it; the machine's CPUs busy over it): collect_target "
            "32.4 s (100%), card 11.5 s (74%), screen 1.4 s; this invocation 60 s."]  # a resumed 0.04-s stage: left out
    assert time_by_stage({"split": {"seconds": 0.0}}, {}) == []  # nothing took time: no line
    # a stage adopted from another run (runs.adopt) keeps that run's time, and says so
    adopted = {**stages, "card": {**stages["card"], "reused_from": "audit-humaneval-1"}}
    assert time_by_stage(adopted, {"total_this_invocation": 2.0})[1] == (
        "Time by stage (wall, in the invocation that ran it; the machine's CPUs busy over it): collect_target "
        "32.4 s (100%), card 11.5 s (74%) (adopted), screen 1.4 s; this invocation 2 s. Adopted stages were made by "
        "audit-humaneval-1 from the same inputs.")


def test_a_simulate_report_names_the_run_that_made_an_adopted_stage():
    from leakray.report.simulate import stage_stats

    got = stage_stats({"target": {"seconds": 9.1, "reused_from": "humaneval-ba24"}, "detect": {"seconds": 3.0}})
    assert got["target"]["reused_from"] == "humaneval-ba24" and "reused_from" not in got["detect"]


def test_the_simulate_reports_stage_table_has_each_stages_parts_and_throughput():
    from leakray.report.simulate import render_markdown, stage_stats

    markers = {"target": {"seconds": 66.9, "rows_in": 41, "rows_out": 41, "machine_cpu": {"busy_share": 0.999},
                          "part_seconds": {"load": 1.2, "train": 63.1, "save": 0.3},
                          "throughput": {"trained_tokens_per_s": 1520.5, "steps_per_s": 9.5}},
               "folds": {"seconds": 0.02, "rows_in": 164, "rows_out": 164}}
    stages = stage_stats(markers)
    assert stages["target"]["part_seconds"] == markers["target"]["part_seconds"]
    assert "part_seconds" not in stages["folds"] and "throughput" not in stages["folds"]
    leak = leak_summary(_table([_row(1, [True, False], [0.1, 0.3]), _row(0, [False, False], [0.8, 0.9])]))
    md = render_markdown({"benchmark": {"name": "humaneval"}, "protocol": "p", "detectors": {}, "models": {},
                          "timings_s": {}, "collections": {}, "seeds": {}, "isolation": {},
                          "leak": {"target": leak, "shadow": leak}, "stages": stages})
    assert "| stage | seconds | machine busy | rows in | rows out | errors | parse failures | parts (busy s) | " \
           "throughput |" in md
    assert ("| target | 66.9 | 100% | 41 | 41 | – | – | train 63.1 s, load 1.2 s, save 0.3 s | "
            "1520.5 trained tokens/s, 9.5 steps/s |") in md
    assert "| folds | 0.0 | – | 164 | 164 | – | – | – | – |" in md

def test_a_simulate_report_says_which_rows_a_collection_read_back_or_tried_again():
    from leakray.report.simulate import render_markdown, stage_stats

    base = {"benchmark": {"name": "humaneval"}, "protocol": "p", "detectors": {}, "timings_s": {}, "models": {},
            "collections": {}, "seeds": {}, "isolation": {},
            "leak": {r: leak_summary(_table([_row(1, [True, False], [0.1, 0.3]),
                                             _row(0, [False, False], [0.8, 0.9])])) for r in ("target", "shadow")}}
    stages = stage_stats({"collect_shadow": {"rows_in": 82, "resumed_rows": 40},
                          "collect_target": {"rows_in": 82, "row_retries": {"rows": 2, "recovered": 2}}})
    md = render_markdown({**base, "stages": stages})
    assert "Rows read back from a killed attempt of the stage (not collected again): collect_shadow 40 of 82" in md
    assert "(`sample.row_retries`): collect_target 2, of which 2 went through" in md
    assert "read back" not in render_markdown({**base, "stages": stage_stats({"collect_shadow": {"rows_in": 82}})})


def test_a_run_shared_by_several_detectors_is_not_each_ones_cost():
    base = {"benchmark": {"name": "humaneval"}, "protocol": "p", "timings_s": {}, "models": {}, "collections": {},
            "seeds": {}, "leak": {r: leak_summary(_table([_row(1, [True, False], [0.1, 0.3]),
                                                          _row(0, [False, False], [0.8, 0.9])])) for r in ("target", "shadow")}}
    tune = ["lr", "mlp"]
    detectors = {"mlp": {"auc": 0.9, "cost": {"wall_s": 84.128, "shared_run": tune, "trial_s": 4.726}},
                 "cgmia": {"auc": 0.89, "cost": {"wall_s": 25.225, "shared_run": ["cgmia", "cgmia_ensemble"]}},
                 "advprompt": {"auc": 0.84, "cost": {"wall_s": 17.319}}}
    md = render_markdown({**base, "detectors": detectors})
    assert "| 84.128 shared by 2, own trials 4.726 |" in md and "| 25.225 shared by 2 |" in md
    assert "| 17.319 |" in md and '"shared by n": one run fitted n detectors' in md
    only = render_markdown({**base, "detectors": {"advprompt": detectors["advprompt"]}})
    assert "shared by" not in only  # no shared run: no note


def test_an_audit_report_names_the_rows_a_collection_tried_again():
    from leakray.report.rows import row_retries_line

    stages = {"collect_shadow": {"errors": {}}, "collect_target": {"row_retries": {"rows": 3, "recovered": 2}}}
    assert row_retries_line(stages) == ["", "Rows collected again after a failure another attempt can cure "
                                            "(`sample.row_retries`): collect_target 3, of which 2 went through"]
    assert row_retries_line({"collect_target": {"row_retries": {"rows": 0, "recovered": 0}}}) == []
    from leakray.report.rows import resumed_line

    assert resumed_line({"collect_target": {"resumed_rows": 120, "rows_in": 164}, "collect_shadow": {}}) == [
        "", "Rows read back from a killed attempt of the stage (not collected again): collect_target 120 of 164"]
    assert resumed_line(stages) == []
