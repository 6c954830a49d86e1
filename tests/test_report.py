import pyarrow as pa

from leakray.report.simulate import leak_summary, render_markdown
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
              "detectors": {"cgmia": {"auc": 0.9}, "detectleak": {"auc": float("nan")}},
              "leak": {r: leak_summary(_table([_row(1, [True, False], [0.1, 0.3]),
                                               _row(0, [False, False], [0.8, 0.9])])) for r in ("target", "shadow")},
              "timings_s": {"base": 1.0}, "models": {}, "collections": {}, "seeds": {}}
    md = render_markdown(report)
    assert "| cgmia |" in md and "0.900" in md and "| detectleak |" in md and "nan" in md
    assert "graded leak: **yes**" in md
