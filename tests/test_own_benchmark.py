"""A benchmark of the user's own: `--benchmark NAME=PATH` with NAME a label and PATH a file in any
reader's format or in leakray's task format (data/task_file.py). Before, `audit`, `simulate` and
`card build` refused any NAME that was not a reader ("unknown benchmark 'mybench'"), so a private
benchmark had to be passed off as one of the eight public ones."""

import json
from pathlib import Path

import pytest

from leakray.errors import BadInput
from leakray.schema import T

FIX = Path(__file__).parent / "fixtures"
OWN = FIX / "own_benchmark.jsonl"  # 8 small Python tasks in leakray's task format, with tests


def test_a_file_in_the_task_format_is_read_under_its_label():
    from leakray.data.registry import load_benchmark, sniff_reader

    assert sniff_reader(OWN) == "tasks"
    tasks = load_benchmark("mybench", OWN)
    assert len(tasks) == 8 and {t[T.BENCHMARK] for t in tasks} == {"mybench"}
    first = tasks[0]
    assert first[T.TASK_ID] == "mine/add" and first[T.LANGUAGE] == first[T.RUNNER] == "python"
    assert first[T.REFERENCE].startswith(first[T.PROMPT]) and first[T.ENTRY_POINT] == "add"
    assert json.loads(first[T.META])["source_row"] == 1  # the cleaned export writes back the rows read
    # under the reader's own name the label is each record's `benchmark`, else the file's stem
    assert {t[T.BENCHMARK] for t in load_benchmark("tasks", OWN)} == {"own_benchmark"}


def test_a_public_format_under_a_label_of_your_own(tmp_path):
    from leakray.data.registry import load_benchmark

    rows = [json.loads(line) for line in (FIX / "mbpp_small.jsonl").read_text().splitlines() if line.strip()]
    path = tmp_path / "private.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_benchmark("inhouse", path)
    assert len(tasks) == len(rows) and {t[T.BENCHMARK] for t in tasks} == {"inhouse"}


@pytest.mark.parametrize("record, field", [
    ({"task_id": "a", "prompt": "def f():\n"}, "reference"),
    ({"task_id": "a", "prompt": "def f():\n", "reference": "def f():\n    return 1\n", "tests": ["x"]}, "tests"),
    ({"task_id": "a", "prompt": "def f():\n", "reference": "def f():\n    return 1\n", "meta": "{bad"}, "meta"),
    ({"task_id": "a", "prompt": "def f():\n", "reference": "def f():\n    return 1\n", "language": "cobol"},
     "language"),
    ({"task_id": "a", "prompt": " ", "reference": "def f():\n    return 1\n"}, "prompt"),
])
def test_a_bad_row_is_refused_with_file_row_and_field(tmp_path, record, field):
    from leakray.data.registry import load_benchmark

    good = {"task_id": "ok", "prompt": "def g():\n", "reference": "def g():\n    return 2\n"}
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(BadInput) as err:
        load_benchmark("mine", path)
    msg = str(err.value)
    assert str(path) in msg and "row 2" in msg and f"field '{field}'" in msg, msg


def test_the_config_takes_a_label_with_its_file_and_refuses_what_it_cannot_read(tmp_path):
    from leakray.config import AuditConfig, SimulateConfig, load_config

    cfg = load_config([], ["benchmark.name=mybench", f"benchmark.path={OWN}"], AuditConfig)
    assert cfg.benchmark.name == "mybench"
    load_config([], ["benchmark.name=mybench", f"benchmark.path={OWN}"], SimulateConfig)
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(json.dumps({"id": 1, "question": "?"}) + "\n")
    for sets, needle in (
            (["benchmark.name=mybench"], "mybench=PATH"),  # a label needs its file
            (["benchmark.name=my bench", f"benchmark.path={OWN}"], "benchmark label"),  # it names directories
            (["benchmark.name=../up", f"benchmark.path={OWN}"], "benchmark label"),
            (["benchmark.name=mybench", f"benchmark.path={tmp_path / 'missing.jsonl'}"], "does not exist"),
            (["benchmark.name=mybench", f"benchmark.path={unknown}"], "task_id, prompt, reference")):
        with pytest.raises(ValueError) as err:
            load_config([], sets, AuditConfig)
        assert needle in str(err.value), (sets, str(err.value))


def test_the_command_line_validates_plans_and_refuses_your_own_benchmark_as_it_does_a_public_one(tmp_path, capsys):
    from leakray.cli import main

    # the references against their own tests, in the sandbox: the check a user runs on a new file
    assert main(["benchmarks", "validate", f"mybench={OWN}"]) == 0
    assert "mybench: 8/8 references pass" in capsys.readouterr().out
    # what an audit of it would ask of a served model, per part; nothing run or sent
    assert main(["audit", "--benchmark", f"mybench={OWN}", "--target", "served", "--set", "sample.backend=openai",
                 "--set", "sample.endpoint_url=http://127.0.0.1:9/v1", "--plan", "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "What this audit of 8 tasks will ask of the endpoint" in out and "Per task:" in out, out
    assert not list(tmp_path.glob("audit-*"))
    assert main(["audit", "--benchmark", "mybench", "--plan", "--output", str(tmp_path)]) == 2
    assert "mybench=PATH" in capsys.readouterr().err


def test_the_cleaned_export_of_your_own_benchmark_keeps_its_format(tmp_path):
    """The audit's cleaned copy drops the flagged tasks' records and writes the rest as they were read."""
    from leakray.data.registry import load_benchmark
    from leakray.screen.outputs import export_clean

    tasks = load_benchmark("mybench", OWN)
    drop = {json.loads(t[T.META])["source_row"] for t in tasks if t[T.TASK_ID] in ("mine/clamp", "mine/flatten")}
    out = export_clean(OWN, tmp_path, drop)
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    original = [json.loads(line) for line in OWN.read_text().splitlines()]
    assert kept == [r for r in original if r["task_id"] not in ("mine/clamp", "mine/flatten")]
    assert [t[T.TASK_ID] for t in load_benchmark("mybench", out)] == [r["task_id"] for r in kept]


def test_an_audit_of_the_first_tasks_exports_only_those_it_found_clean(tmp_path):
    """`benchmark.limit` audits the first tasks only; the cleaned file used to keep every other task
    of the file too, unjudged, beside "N removed"."""
    from leakray.config import AuditConfig, load_config
    from leakray.protocols.simulate import load_tasks
    from leakray.report.audit import export_cleaned

    cfg = load_config([], ["benchmark.name=mybench", f"benchmark.path={OWN}", "benchmark.limit=4"], AuditConfig)
    tasks = load_tasks(cfg)
    audited = [t[T.TASK_ID] for t in tasks]
    assert audited == ["mine/add", "mine/clamp", "mine/count_vowels", "mine/flatten"]  # sorted by id, first 4
    got = export_cleaned(cfg, tasks, {"mine/clamp"}, tmp_path)
    assert got["removed"] == 1 and got["kept"] == 3 and got["not_audited"] == 4
    kept = [json.loads(line)["task_id"] for line in (tmp_path / got["path"]).read_text().splitlines()]
    assert kept == ["mine/add", "mine/count_vowels", "mine/flatten"]
    whole = load_config([], ["benchmark.name=mybench", f"benchmark.path={OWN}"], AuditConfig)
    (tmp_path / "whole").mkdir()
    got = export_cleaned(whole, load_tasks(whole), {"mine/clamp"}, tmp_path / "whole")
    assert got["not_audited"] == 0 and len((tmp_path / "whole" / got["path"]).read_text().splitlines()) == 7
    # a clean near-copy of a flagged task goes with it (audit.cleaned_near_copies=drop): listed and counted
    (tmp_path / "copy").mkdir()
    got = export_cleaned(whole, load_tasks(whole), {"mine/clamp"}, tmp_path / "copy", also=["mine/add", "mine/clamp"])
    assert got["removed"] == 2 and got["near_copies_removed"] == 1
    assert (tmp_path / "copy" / "cleaned" / "removed_ids.txt").read_text().split() == ["mine/add", "mine/clamp"]
    assert "mine/add" not in (tmp_path / "copy" / got["path"]).read_text()


def test_two_records_with_one_task_id_are_refused_before_any_work(tmp_path, capsys):
    """Every stage keys its rows by task_id: a repeated id took the first record's place, and a file
    of 9 records was audited as 8 without a word."""
    from leakray.cli import main

    dup = tmp_path / "dup.jsonl"
    lines = OWN.read_text().splitlines()
    dup.write_text("\n".join(lines + lines[:1]) + "\n")
    assert main(["audit", "--benchmark", f"dup={dup}", "--plan", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "'mine/add' is in two records (rows 1 and 9)" in err and str(dup) in err, err
    assert main(["screen", "--benchmark", f"dup={dup}", "--corpus", str(FIX / "own_benchmark.jsonl"),
                 "--output", str(tmp_path / "screen")]) != 0
    assert "two records" in capsys.readouterr().err


def test_a_benchmark_without_tests_is_told_why_no_advprompt_variant_was_kept():
    """Variants are proven against the task's tests: a benchmark without any printed an empty
    "AdvPrompt variants kept:" line."""
    from leakray.protocols.collection import perturb_line

    none = {"kept": {"python/IDC": {"no-tests": 64, "rate": None}, "python/VR": {"no-tests": 64, "rate": None}},
            "rows_in": 32}
    assert perturb_line(none) == ("AdvPrompt variants kept: none could be proven (no task has tests to prove "
                                  "them against); AdvPrompt-MIA has nothing to read")
    some = {"kept": {"python/IDC": {"kept": 30, "failed": 2, "no-tests": 4, "rate": 0.9375}}, "rows_in": 32,
            "from_cache": 3}
    assert perturb_line(some) == "AdvPrompt variants kept: python/IDC 94% (3 of 32 tasks proven by an earlier run)"


def test_a_sweep_plans_cells_on_a_benchmark_of_your_own(tmp_path):
    import yaml

    from leakray.protocols.sweep.spec import plan

    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "mine", "output_dir": str(tmp_path / "sw"),
                                    "models": [{"name": "tiny", "set": {"model.base": "tiny"}}],
                                    "benchmarks": [{"name": "mybench", "path": str(OWN)}, {"name": "humaneval"}],
                                    "detectors": ["ref_loss"]}))
    _, _, cells = plan(str(path))
    assert [(c.benchmark, c.cfg.benchmark.name) for c in cells] == [("mybench", "mybench"), ("humaneval", "humaneval")]
    assert cells[0].run_dir.name.startswith("mybench-")


def test_a_plain_text_prompt_is_named_before_any_work(tmp_path, capsys):
    """A prompt must be the program's beginning: with plain text as the prompt, every completion
    (and the reference itself) fails to compile, and the run used to say nothing of why."""
    from leakray.data.registry import load_benchmark
    from leakray.data.tasks import references_that_do_not_compile
    from leakray.protocols.collection import perturb_line
    from leakray.protocols.engine import broken_references_line

    rows = [json.loads(line) for line in OWN.read_text().splitlines()]
    rows[0] = dict(rows[0], prompt="Write a function add(a, b) returning their sum.")  # text, not code
    rows[1] = dict(rows[1], prompt='"""Clamp x into [lo, hi]."""\n')  # text in a docstring: a code prefix
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_benchmark("mixed", path)
    assert [t for t, _ in references_that_do_not_compile(tasks)] == ["mine/add"]
    assert references_that_do_not_compile(load_benchmark("mybench", OWN)) == []
    line = broken_references_line(tasks)
    assert line.startswith("1 of 8 references do not compile") and "mine/add: SyntaxError" in line
    assert "leakray benchmarks validate" in line
    assert broken_references_line(load_benchmark("mybench", OWN)) is None  # nothing said of a sound file
    # said once, on stderr, by --plan too (before any request is counted)
    from leakray.cli import main

    assert main(["audit", "--benchmark", f"mixed={path}", "--plan", "--output", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert err.count("references do not compile") == 1 and err.startswith("[leakray] WARNING: 1 of 8"), err
    # the perturb stage counts the tasks whose reference failed its own tests
    assert perturb_line({"kept": {"python/IDC": {"kept": 5, "baseline-failed": 3, "rate": 1.0}}, "rows_in": 8,
                         "references_failed": 3}).endswith(
        "; 3 of 8 tasks' references fail their own tests and get no variant (`leakray benchmarks validate "
        "NAME=PATH` shows why; a prompt must be the program's beginning)")


def test_a_card_is_matched_to_a_benchmark_by_its_tasks_not_its_name(tmp_path):
    """A card built on HumanEval and reused on the same tasks under a label of one's own is the same
    benchmark (it warned); one built on other tasks under the same name is not (it said nothing)."""
    from types import SimpleNamespace

    from leakray.config import AuditConfig, load_config
    from leakray.data.registry import load_benchmark
    from leakray.protocols.audit import card_meta, card_mismatches

    he = load_config([], [], AuditConfig)
    he_tasks = load_benchmark("humaneval")
    card = SimpleNamespace(meta=card_meta(he, he_tasks, "/base"))
    assert card_mismatches(card, he, he_tasks) == []
    path = tmp_path / "he.jsonl"
    path.write_text("".join(json.dumps({k: t[k] for k in (T.TASK_ID, T.PROMPT, T.REFERENCE, T.TESTS)}) + "\n"
                            for t in he_tasks))
    mine = load_config([], ["benchmark.name=heown", f"benchmark.path={path}"], AuditConfig)
    assert card_mismatches(card, mine, load_benchmark("heown", path)) == []  # the same tasks, another label
    (line,) = card_mismatches(card, he, he_tasks[:100])  # the same name, other tasks
    assert line.startswith("the card was built on other tasks of humaneval (164 tasks; this audit has 100 of "
                           "humaneval)"), line
    other = load_config([], ["benchmark.name=mybench", f"benchmark.path={OWN}"], AuditConfig)
    (line,) = card_mismatches(card, other, load_benchmark("mybench", OWN))
    assert line.startswith("the card was built on humaneval (164 tasks; this audit has 8 of mybench)"), line
