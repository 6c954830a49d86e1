"""The suite's own scheduler (tests/conftest.py, `RayHeadFirst`): the tests on the real head start
first, as one unit on one worker, and a module with a module-scoped fixture goes to one worker whole
(split, both workers set its fixture up: gpu_check's 12-second CPU run twice)."""

from types import SimpleNamespace

import pytest

pytest.importorskip("xdist")

from conftest import RAY_HEAD_MODULES, pytest_xdist_make_scheduler  # noqa: E402


class Worker:
    """A stand-in for xdist's WorkerController: records what it was sent."""

    def __init__(self, name: str):
        self.name, self.sent, self.shutting_down = name, [], False
        self.gateway = SimpleNamespace(id=name)

    def send_runtest_some(self, indices):
        self.sent.append(list(indices))

    def shutdown(self):
        self.shutting_down = True


def test_the_head_starts_first_and_a_module_fixtures_tests_stay_together():
    head = [f"{m}::test_{i}" for i, m in enumerate(RAY_HEAD_MODULES)]
    # test_gpu_check.py defines a module-scoped fixture; test_resample.py does not
    shared = [f"tests/test_gpu_check.py::test_{i}" for i in range(7)]
    alone = [f"tests/test_resample.py::test_{i}" for i in range(6)]
    collection = alone + shared + head  # the head last in collection order, and fewer tests than gpu_check
    config = SimpleNamespace(getvalue=lambda name: ["2*popen"] if name == "tx" else None,
                             option=SimpleNamespace(loadscopereorder=True))
    sched = pytest_xdist_make_scheduler(config, None)
    workers = [Worker("gw0"), Worker("gw1")]
    for w in workers:
        sched.add_node(w)
        sched.add_node_collection(w, collection)
    sched.schedule()
    first, second = ([collection[i] for i in w.sent[0]] for w in workers)
    assert first == head  # the head's tests, all of them, first, on the first worker
    assert second == shared  # the largest other unit: the module whose tests share a fixture, whole
    sent = [collection[i] for w in workers for batch in w.sent for i in batch]
    assert len(sent) == len(set(sent))  # nothing sent twice
    # a module without one is split test by test
    assert {sched._split_scope(n) for n in alone} == set(alone)
