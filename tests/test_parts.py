"""Where a stage's time goes (`leakray.parts`): the clock every non-collection stage times its
parts with, and how the reports say it (`report.costs`, the simulate report's stage table)."""

import time

import pytest

from leakray.parts import PartClock, per_second, timed


def test_a_part_clock_adds_up_each_parts_time_however_it_is_timed():
    clock = PartClock()
    clock.switch("load")
    time.sleep(0.02)
    clock.switch("train")  # ends load
    time.sleep(0.03)
    clock.stop()
    clock.stop()  # nothing running: nothing added
    with clock.part("load"):
        time.sleep(0.01)
    clock.merge({"train": 1.0, "save": 0.25})
    got = clock.seconds
    assert list(got) == ["load", "train", "save"]
    assert 0.03 <= got["load"] < 0.2 and 1.03 <= got["train"] < 1.2 and got["save"] == 0.25
    assert clock.rounded() == {k: round(v, 2) for k, v in got.items()}
    with pytest.raises(ValueError), clock.part("score"):  # a part that fails still counts its time
        raise ValueError
    assert clock.seconds["score"] >= 0


def _work(n: int, clock: PartClock) -> str:
    with clock.part("score"):
        clock.count("score", n)
        clock.count("score", 1)
    return "done"


def test_timed_gives_a_functions_result_and_its_clock_from_wherever_it_ran():
    result, clocked = timed(_work, 4)  # what a Ray task sends back: plain dicts, not the clock
    assert result == "done" and clocked["counts"] == {"score": 5} and set(clocked["seconds"]) == {"score"}


def test_a_throughput_needs_time_spent():
    assert per_second(10, 4.0) == 2.5
    assert per_second(10, 0.0) is None and per_second(10, None) is None and per_second(0, 1.0) == 0.0


def test_reports_say_each_stages_parts_slowest_first_and_their_throughput():
    from leakray.report.costs import parts_by_stage, parts_text, throughput_text

    stages = {"collect_target": {"seconds": 136.8, "part_seconds": {"load": 10.9, "sample": 61.6, "advprompt": 151.0,
                                                                      "score": 0.0},
                                 "throughput": {"generated_tokens_per_s": 488.3, "programs_per_s": None}},
              "target": {"seconds": 66.9, "part_seconds": {"load": 1.2, "train": 63.1, "save": 0.3},
                         "throughput": {"trained_tokens_per_s": 1520.5}},
              "detect": {"seconds": 108.0, "part_seconds": {"fit": 150.2, "metrics": 3.1}},
              "folds": {"seconds": 0.0}}
    assert parts_text(stages["collect_target"]) == "advprompt 151.0 s, sample 61.6 s, load 10.9 s"  # 0 s: left out
    assert throughput_text(stages["collect_target"]) == "488.3 generated tokens/s"  # one it could not measure: out
    assert parts_text(stages["folds"]) == throughput_text(stages["folds"]) == ""
    (blank, line), = [parts_by_stage(stages)]
    assert blank == "" and line.index("collect_target:") < line.index("; detect:") < line.index("; target: train")
    assert "detect: fit 150.2 s, metrics 3.1 s;" in line  # no throughput: no brackets
    assert "target: train 63.1 s, load 1.2 s, save 0.3 s (1520.5 trained tokens/s)." in line
    assert parts_by_stage({"folds": {"seconds": 0.0}}) == []

