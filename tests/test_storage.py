"""Run outputs on a pyarrow filesystem URI: a local `file://` URI and an S3-compatible server
(moto, in this process, no network): stages mirrored with markers last, a resume from a fresh
staging copy skips finished stages, Ray Data part files written by workers straight to the
URI, Ray Train results stored there, `leakray screen --output s3://...`."""

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs

from leakray.errors import BadInput
from leakray.runs import MARKER, StageRunner, StageSpec
from leakray import storage
from leakray.storage import RunStore, display, join, shared_dir

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class Quiet:
    def stage(self, *a):
        pass

    def say(self, *a):
        pass


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAKRAY_CACHE", str(tmp_path / "cache"))
    storage._SENT.clear()
    yield
    storage._OPEN.clear()


def two_stages(calls: list) -> list[StageSpec]:
    def first(out: Path) -> dict:
        calls.append("first")
        (out / "model").mkdir()
        (out / "model" / "weights.bin").write_bytes(os.urandom(3000))
        return {"rows_out": 3}

    def second(out: Path) -> dict:
        calls.append("second")
        pq.write_table(pa.table({"x": [1, 2, 3]}), out / "table.parquet")
        return {"rows_out": 3}

    return [StageSpec("first", first), StageSpec("second", second)]


def test_join_and_display_keep_queries_and_hide_credentials():
    uri = "s3://key:secret@bucket/runs?endpoint_override=host:9000&scheme=http"
    assert join(uri, "run-1") == "s3://key:secret@bucket/runs/run-1?endpoint_override=host:9000&scheme=http"
    assert display(join(uri, "run-1")) == "s3://bucket/runs/run-1"
    assert "secret" not in str(storage.staging_dir(uri))
    assert join("runs", "x") == str(Path("runs") / "x")


def test_file_uri_mirrors_stages_markers_last_and_resumes_from_a_fresh_node(tmp_path, monkeypatch):
    remote_root = tmp_path / "shared"
    uri = f"file://{remote_root}"
    store = RunStore(uri, "run-a")
    assert store.mirrored and store.local != remote_root / "run-a"
    calls = []
    StageRunner(store.local, Quiet(), store).run(two_stages(calls))
    store.close()
    assert calls == ["first", "second"]
    for rel in ("first/model/weights.bin", f"first/{MARKER}", "second/table.parquet", f"second/{MARKER}"):
        assert (remote_root / "run-a" / rel).is_file(), rel
    # a driver on another node: empty staging, everything pulled back, nothing recomputed
    monkeypatch.setenv("LEAKRAY_CACHE", str(tmp_path / "other-node"))
    storage._SENT.clear()
    again = RunStore(uri, "run-a")
    assert again.local != store.local
    assert (again.local / "first/model/weights.bin").read_bytes() == (remote_root / "run-a/first/model/weights.bin").read_bytes()
    calls2 = []
    info = StageRunner(again.local, Quiet(), again).run(two_stages(calls2))
    assert calls2 == [] and info["second"]["rows_out"] == 3


def test_push_uploads_markers_after_the_files_they_vouch_for(tmp_path):
    order = []

    class Recording(pafs.FSSpecHandler):
        def open_output_stream(self, path, metadata):
            order.append(path)
            return super().open_output_stream(path, metadata)

    import fsspec

    store = RunStore(f"file://{tmp_path / 'shared'}", "run-b")
    store.fs = pafs.PyFileSystem(Recording(fsspec.filesystem("file")))
    StageRunner(store.local, Quiet(), store).run(two_stages([]))
    names = [p.rsplit("/", 2)[-2] + "/" + p.rsplit("/", 1)[-1] for p in order]
    assert names.index(f"first/{MARKER}") > names.index("model/weights.bin")
    assert names.index(f"second/{MARKER}") > names.index("second/table.parquet")
    n = len(order)
    store.push()  # nothing changed: nothing sent again
    assert len(order) == n


def test_a_killed_pull_never_leaves_a_marker_without_files(tmp_path, monkeypatch):
    uri = f"file://{tmp_path / 'shared'}"
    store = RunStore(uri, "run-c")
    StageRunner(store.local, Quiet(), store).run(two_stages([]))
    monkeypatch.setenv("LEAKRAY_CACHE", str(tmp_path / "node2"))
    storage._SENT.clear()
    fetched = []

    class Dying(pafs.FSSpecHandler):
        def open_input_stream(self, path):
            if fetched and path.endswith("table.parquet"):
                raise OSError("connection reset")
            fetched.append(path)
            return super().open_input_stream(path)

    import fsspec

    monkeypatch.setattr(storage, "filesystem", lambda u: (pafs.PyFileSystem(Dying(fsspec.filesystem("file"))),
                                                          str(tmp_path / "shared")))
    with pytest.raises(OSError):
        RunStore(uri, "run-c")
    local = storage.staging_dir(uri) / "run-c"
    assert not (local / "second" / MARKER).exists() and not (local / "first" / MARKER).exists()


def test_a_bad_uri_is_refused_in_one_line():
    with pytest.raises(BadInput, match="cannot open output URI"):
        RunStore("nosuchscheme://bucket/x", "run")


def test_paths_outside_a_mirrored_run_stay_local(tmp_path):
    path, fs_ = shared_dir(tmp_path / "x" / "parts")
    assert fs_ is None and path == str((tmp_path / "x" / "parts").resolve())
    store = RunStore(str(tmp_path / "local-runs"), "run-d")
    assert not store.mirrored and shared_dir(store.local / "collect")[1] is None


# ---- S3 (moto server) --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_uri():
    moto_server = pytest.importorskip("moto.server")
    old = {k: os.environ.get(k) for k in CREDS}
    os.environ.update(CREDS)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    base = f"s3://leakray-test/runs?endpoint_override={host}:{port}&scheme=http&region=us-east-1"
    pafs.FileSystem.from_uri(base + "&allow_bucket_creation=true")[0].create_dir("leakray-test")
    try:
        yield base
    finally:
        server.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def ray_with_creds(s3_uri):
    import ray

    if ray.is_initialized():  # an earlier in-process run's Ray: this fixture's workers need the credentials
        from leakray.executor.runtime import shutdown_ray

        shutdown_ray()
    # workers resolve S3 credentials from their own environment (a pickled S3FileSystem carries none)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": CREDS})
    yield
    ray.shutdown()


def s3_files(uri: str) -> dict[str, int]:
    fs_, path = pafs.FileSystem.from_uri(uri)
    return {i.path[len(path) + 1:]: i.size for i in fs_.get_file_info(pafs.FileSelector(path, recursive=True))
            if i.type == pafs.FileType.File}


def test_s3_run_mirrors_and_resumes(s3_uri, tmp_path, monkeypatch):
    store = RunStore(s3_uri, "run-s3")
    StageRunner(store.local, Quiet(), store).run(two_stages([]))
    (store.local / "report.json").write_text(json.dumps({"ok": True}))
    store.close()
    files = s3_files(join(s3_uri, "run-s3"))
    assert {f"first/{MARKER}", "first/model/weights.bin", f"second/{MARKER}", "second/table.parquet",
            "report.json"} <= set(files)
    monkeypatch.setenv("LEAKRAY_CACHE", str(tmp_path / "node2"))
    storage._SENT.clear()
    calls = []
    again = RunStore(s3_uri, "run-s3")
    StageRunner(again.local, Quiet(), again).run(two_stages(calls))
    assert calls == [] and json.loads((again.local / "report.json").read_text()) == {"ok": True}


def test_ray_data_workers_write_parts_to_s3_and_every_row_comes_back(s3_uri, ray_with_creds):
    import ray

    from leakray.executor.batches import write_parts

    store = RunStore(s3_uri, "run-parts")
    stage = store.local / "collect_target"
    stage.mkdir()
    ds = ray.data.range(40, override_num_blocks=4).map_batches(lambda b: {"id": b["id"], "sq": b["id"] ** 2})
    table = write_parts(ds, stage)
    assert sorted(table.column("id").to_pylist()) == list(range(40))
    assert not (stage / "parts").exists()  # nothing on the driver's disk
    parts = [p for p in s3_files(join(s3_uri, "run-parts")) if p.startswith("collect_target/parts/")]
    assert len(parts) >= 2 and all(p.endswith(".parquet") for p in parts)
    # a second attempt (a resumed stage) clears the first attempt's parts: no row twice
    assert sorted(write_parts(ds, stage).column("id").to_pylist()) == list(range(40))


@pytest.mark.parametrize("ray_train", [True, False], ids=["ray-train", "ray-task"])
def test_ray_train_results_and_a_worker_written_model_reach_s3(s3_uri, ray_with_creds, monkeypatch, ray_train):
    """On Ray Train, and as the one Ray task a CPU fine-tune runs in (``ray.use_ray_train: auto``)."""
    import sys

    from ray import cloudpickle

    from leakray.executor import train
    from leakray.executor.train import fit_on_ray

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Train workers cannot import tests/
    name = f"run-train-{ray_train}"
    store = RunStore(s3_uri, name)
    model = store.local / "model"
    # rank 0 "on another node" than the driver: it publishes the model, the driver fetches it
    monkeypatch.setattr(train, "_driver_node", lambda: "the-driver's-node")
    out = fit_on_ray(_loop, {"x": 2, "out_dir": str(model)}, name="tiny", storage=store.local / "ray_train",
                     num_workers=1, use_gpu=False, cpus=1, out_dir=model, ray_train=ray_train)
    assert out == {"y": 4, "device": "cpu"}  # where a worker trains (no GPU reserved: the CPU)
    files = s3_files(join(s3_uri, name))
    # Train's own storage on the URI; a task has none
    assert any(p.startswith("ray_train/tiny/") for p in files) == ray_train
    assert files.get("model/weights.txt") == 2 and (model / "weights.txt").read_text() == "w4"


def _loop(config):
    from leakray.executor.train import worker_hooks

    Path(config["out_dir"]).mkdir(parents=True, exist_ok=True)
    Path(config["out_dir"], "weights.txt").write_text(f"w{config['x'] * 2}")
    return {"y": config["x"] * 2, "device": worker_hooks(config)["device"]}


def test_screen_writes_its_outputs_to_s3(s3_uri, tmp_path):
    from leakray.protocols.screen import run_screen

    bench = tmp_path / "bench.jsonl"
    code = "def add(a, b):\n    total = a + b\n    return total\n"
    bench.write_text(json.dumps({"task_id": "T/0", "prompt": "def add(a, b):\n", "canonical_solution":
                                 "    total = a + b\n    return total\n", "entry_point": "add",
                                 "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}) + "\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "copy.py").write_text(code * 3)
    uri = join(s3_uri, "screen-out")
    summary = run_screen([("humaneval", str(bench))], str(corpus / "*.py"), uri, engine="local", log=lambda m: None)
    files = s3_files(uri)
    assert "summary.json" in files, files
    assert summary["benchmarks"]["humaneval"]["n_samples"] == 1


def test_a_corpus_in_s3_is_screened_where_it_is_as_on_disk(s3_uri, tmp_path):
    """The planted corpus (every form: code, JSON, markdown, notebooks, parquet, Arrow, compressed
    shards, a tarball and a zip) uploaded to S3 and screened there by URI, with a glob: the same
    files, documents, texts and pairs as the same corpus on disk, each pair naming its object's
    URI. In-process: a Ray Data worker runs the same reader on the same URI strings (checked once
    with engine="ray" and this module's `ray_with_creds`: the same result; it costs a local Ray
    of its own, ~17 s of the suite, where this test lands on another worker than that fixture)."""
    import sys
    from urllib.parse import urlsplit

    from leakray.protocols.screen import run_screen

    sys.path.insert(0, str(Path(__file__).parent))
    import screen_corpus as SC

    planted = SC.build(tmp_path / "planted")
    fs_, runs = pafs.FileSystem.from_uri(s3_uri)
    bucket = runs.split("/", 1)[0]
    pafs.copy_files(str(planted.root), f"{bucket}/corpus", destination_filesystem=fs_)
    query = urlsplit(s3_uri).query
    remote = f"s3://{bucket}/corpus/**?{query}"
    bench = [("humaneval", str(planted.benchmark))]
    on_disk = run_screen(bench, str(planted.root), str(tmp_path / "local"), engine="local", log=lambda m: None)
    in_s3 = run_screen(bench, remote, str(tmp_path / "s3"), engine="local", log=lambda m: None)
    for key in ("files", "documents", "texts"):
        assert in_s3["corpus"][key] == on_disk["corpus"][key], key
    assert in_s3["benchmarks"]["humaneval"]["leaked_task_ids"] == on_disk["benchmarks"]["humaneval"]["leaked_task_ids"]

    def pairs(out, root):
        rows = pq.read_table(tmp_path / out / "pairs.parquet").to_pylist()
        return sorted((r["task_id"], r["field"], r["corpus_file"].replace(root, "ROOT"), r["corpus_key"],
                       r["line_start"]) for r in rows)

    got = pairs("s3", f"s3://{bucket}/corpus")
    assert all(r[2].endswith(f"?{query}") or f"?{query}!" in r[2] for r in got)  # each object's own URI
    assert [(*r[:2], r[2].replace(f"?{query}", ""), *r[3:]) for r in got] == pairs("local", str(planted.root))
    assert len(got) > 100
    with pytest.raises(BadInput, match="no corpus file matches"):
        run_screen(bench, f"s3://{bucket}/nothing/**?{query}", str(tmp_path / "none"), engine="local")


def test_a_mirrored_runs_kept_rows_are_read_where_the_workers_wrote_them(tmp_path):
    """A killed collection of a run on a URI: its workers wrote their part files to the URI
    (`shared_dir`), so the next attempt, from any node, reads them back from there; of their rows,
    those that went through."""
    from leakray.protocols.collection import kept_rows
    from leakray.schema import C

    store = RunStore(f"file://{tmp_path / 'shared'}", "run-a")
    kept = store.local / "collect" / "kept" / "k1"
    kept.mkdir(parents=True)
    parts, filesystem = shared_dir(kept / "attempt-1" / "parts")
    assert filesystem is not None and str(tmp_path / "shared") in parts
    filesystem.create_dir(parts, recursive=True)
    pq.write_table(pa.table({C.TASK_ID: ["t/0", "t/1"], C.NOTES: [[], ["failed:endpoint_failed:http_503"]]}),
                   f"{parts}/0.parquet", filesystem=filesystem)
    assert not list(kept.rglob("*.parquet"))  # nothing of it on this node
    assert kept_rows(kept).column(C.TASK_ID).to_pylist() == ["t/0"]
