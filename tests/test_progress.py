"""A running stage's progress lines (leakray/progress.py): a collection of a real model runs for
hours, and the console said nothing between a stage's start and its summary line."""

import io
import time

import pyarrow as pa
import pyarrow.parquet as pq

from leakray import progress
from leakray.console import Console
from leakray.runs import KEPT, StageRunner, StageSpec


def _part(directory, ids):
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"task_id": ids, "x": list(range(len(ids)))}),
                   directory / f"{ids[0].replace('/', '_')}.parquet")


def test_a_stage_that_declares_its_rows_says_how_far_it_is_and_what_is_left(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "EVERY_S", 0.05)
    out = io.StringIO()

    def stage(d):
        progress.expect_rows(d, 8, "task_id")
        for i in range(4):  # four batches of two tasks, one part file each, as Ray Data writes them
            _part(d / "parts", [f"T/{2 * i}", f"T/{2 * i + 1}"])
            deadline = time.monotonic() + 30  # the next batch once this one is reported (a busy host)
            while f"{2 * i + 2} of 8 tasks" not in out.getvalue() and time.monotonic() < deadline:
                time.sleep(0.01)
        return {"rows_out": 8}

    StageRunner(tmp_path, Console(stream=out)).run([StageSpec("collect_target", stage)])
    lines = [line for line in out.getvalue().splitlines() if "running" in line]
    assert lines and all(line.startswith("[leakray] collect_target      running  ") for line in lines), out.getvalue()
    done = [int(line.split("running  ")[1].split()[0]) for line in lines]
    if done[0] == 0:  # a count before the first batch landed: "0 of 8 tasks after ..." (no pace yet)
        assert "left" not in lines.pop(0)
        done.pop(0)
    assert done == [2, 4, 6, 8], lines  # a line each time the count moved, and only then
    assert all("of 8 tasks after" in line and "left" in line for line in lines[:3]), lines
    assert "left" not in lines[3]
    assert not (tmp_path / "collect_target" / progress.PROGRESS_FILE).exists()  # the hint goes with the stage


def test_rows_a_killed_attempt_left_count_as_done_but_not_towards_the_pace(tmp_path):
    kept = tmp_path / KEPT / "key" / "attempt-1" / "parts"
    _part(kept, ["T/0", "T/1", "T/2", "T/3"])
    _part(kept, ["T/3"])  # a retry's row again: counted once
    counter = progress.RowCounter(tmp_path)
    earlier = counter.files()
    assert counter.count("task_id") == 4
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "half.parquet").write_bytes(b"PAR1 not yet whole")  # a file being written
    assert counter.count("task_id") == 4
    _part(tmp_path / "parts", ["T/4", "T/5"])  # this attempt's first batch
    assert counter.count("task_id") == 6 and counter.count("task_id", earlier) == 4
    # 6 of 10 done, 2 of them made by this attempt in 60 s: the other 4 take about 2 min
    assert progress.progress_line(6, 10, 60.0, 2) == "6 of 10 tasks after 1.0 min; about 2.0 min left"
    assert progress.progress_line(0, 10, 30.0, 0) == "0 of 10 tasks after 30 s"
    assert progress.progress_line(10, 10, 90.0, 10) == "10 of 10 tasks after 1.5 min"


def test_a_stage_that_declares_nothing_prints_no_progress(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "EVERY_S", 0.02)
    out = io.StringIO()

    def stage(d):
        _part(d / "parts", ["T/0"])
        time.sleep(0.15)
        return {}

    StageRunner(tmp_path, Console(stream=out)).run([StageSpec("detect", stage)])
    assert "running" not in out.getvalue() and "detect" in out.getvalue()


def test_a_fine_tune_counts_its_steps_for_its_stage(tmp_path, monkeypatch):
    """A stage whose work is steps (a fine-tune) has its worker keep the count (`report_steps`)."""
    monkeypatch.setattr(progress, "EVERY_S", 0.02)
    out = io.StringIO()

    def stage(d):
        for step in (10, 20, 30):
            progress.report_steps(d / progress.PROGRESS_FILE, step, 30)
            deadline = time.monotonic() + 30
            while f"{step} of 30 steps" not in out.getvalue() and time.monotonic() < deadline:
                time.sleep(0.01)
        return {}

    StageRunner(tmp_path, Console(stream=out)).run([StageSpec("shadow", stage)])
    lines = [line.split("running  ")[1] for line in out.getvalue().splitlines() if "running" in line]
    assert [line.split()[0] for line in lines] == ["10", "20", "30"], lines
    assert "left" in lines[0] and "left" not in lines[-1]
    progress.report_steps(tmp_path / "no" / "such" / "dir" / "p.json", 1, 2)  # another node's path: skipped


def test_a_stage_of_jobs_counts_them_as_they_finish_in_any_order(tmp_path, monkeypatch):
    """The detect stage's jobs (detectors and seeds) finish in any order, from Ray tasks and the
    driver's threads: a `JobTally` counts them, the jobs added as the stage plans them."""
    from concurrent.futures import ThreadPoolExecutor

    from leakray.executor.runtime import submit_tasks

    monkeypatch.setattr(progress, "EVERY_S", 0.02)
    out = io.StringIO()

    def stage(d):
        tally = progress.JobTally(d / progress.PROGRESS_FILE, unit="detector jobs")
        tally.add(2)
        gather = submit_tasks(lambda x: x * 2, [1, 2], on_done=tally.finished)  # local: counted as it runs
        assert gather() == [2, 4] and tally.done == 2
        tally.add(6)
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda _: tally.finished(), range(6)))
        deadline = time.monotonic() + 30
        while "8 of 8 detector jobs" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        return {}

    StageRunner(tmp_path, Console(stream=out)).run([StageSpec("detect", stage)])
    lines = [line.split("running  ")[1] for line in out.getvalue().splitlines() if "running" in line]
    assert lines and lines[-1].startswith("8 of 8 detector jobs after"), out.getvalue()
    assert not any("left" in line for line in lines)  # jobs of any size: no time left is guessed
    assert not (tmp_path / "detect" / progress.PROGRESS_FILE).exists()

def test_the_fine_tune_writes_its_count_where_it_is_told(tmp_path, tiny_lm):
    import json

    from leakray.models.finetune import FinetuneConfig, finetune

    counts = tmp_path / progress.PROGRESS_FILE
    finetune(tiny_lm[0], ["def f():\n    return 1\n"] * 4, FinetuneConfig(epochs=2, batch_size=2), None,
             progress=False, progress_file=counts)
    assert json.loads(counts.read_text()) == {"total": 4, "done": 4, "unit": "steps"}


def test_a_resumed_stage_counts_the_rows_it_found_as_done_and_paces_on_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "EVERY_S", 0.02)
    seen = []  # (done, total, made) of each line
    monkeypatch.setattr(progress, "progress_line",
                        lambda done, total, elapsed, made, unit="tasks": seen.append((done, total, made)) or "")
    _part(tmp_path / KEPT / "key" / "attempt-1" / "parts", ["T/0", "T/1", "T/2", "T/3"])  # the killed attempt's
    with progress.StageProgress(tmp_path, lambda line: None):
        progress.expect_rows(tmp_path, 10, "task_id")
        _part(tmp_path / KEPT / "key" / "attempt-2" / "parts", ["T/4", "T/5"])
        deadline = time.monotonic() + 30
        while (6, 10, 2) not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
    # 6 of 10 done, 2 of them by this attempt: its pace is read from those 2, not from the 4 it found
    assert (6, 10, 2) in seen and all(made <= 2 for _, _, made in seen), seen


def test_a_base_that_has_to_be_pretrained_counts_its_steps_and_times_its_parts(tmp_path, tiny_lm):
    """A local base no shipped copy matches is pretrained in the base stage, for minutes on a
    laptop: its steps reach the stage's progress lines, and the stage's marker its parts, only when
    the stage built it (a cached base's stats are its build's)."""
    import json

    from leakray.models.offline import TinyLMConfig, pretrain
    from leakray.protocols.simulate import base_stage_info

    _, stats = tiny_lm  # the session's tiny model, pretrained by the same function
    assert list(stats["part_seconds"]) == ["tokenize", "train", "evaluate", "save"]
    assert stats["trained_tokens"] == stats["steps"] * 4 * 64  # batch_size x block_size a step, no padding
    cfg = TinyLMConfig(vocab_size=400, n_layer=1, n_embd=32, n_head=2, n_positions=512, block_size=64,
                       batch_size=4, max_steps=30, pretrain_seconds=60, corpus_mb=0.3, threads=1, warmup_steps=5)
    pretrain(cfg, tmp_path / "base", progress=False, progress_file=tmp_path / progress.PROGRESS_FILE)
    assert json.loads((tmp_path / progress.PROGRESS_FILE).read_text()) == {"total": 30, "done": 30, "unit": "steps"}
    built = base_stage_info("p", {**stats, "cached": False})
    assert built["part_seconds"] == stats["part_seconds"] and built["throughput"] == stats["throughput"]
    assert "part_seconds" not in base_stage_info("p", {**stats, "cached": True})  # the build's, not this stage's
    assert "part_seconds" not in base_stage_info("p", {"name": "an HF model"})
