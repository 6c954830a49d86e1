"""The simulated-leakage protocol (CGMIA paper, RQ1), stage by stage, resumable.

folds (D1..D4 by task) -> base LM -> target = base + D1, shadow = base + D3 (Ray Train)
-> collections: shadow on D3 u D4, target on D1 u D2 (Ray Data) -> detectors trained on
the shadow, scored on the target -> report. Each stage leaves a completion marker in
the run directory, which is keyed by a hash of the config and the benchmark's content.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq

from leakray.config import build
from leakray.data.folds import assign_folds
from leakray.data.registry import load_benchmark
from leakray.errors import BadInput
from leakray.models.finetune import FinetuneConfig
from leakray.models.offline import TinyLMConfig, ensure_base_model
from leakray.data.tasks import continuation, program_of
from leakray.models.sampler import SampleConfig
from leakray.pipelines.collect import CollectConfig, StageResources
from leakray.runs import Stage, content_hash, write_json_atomic
from leakray.schema import T


# Config sections that change where/how fast it runs, not what it computes.
_NOT_HASHED = ("output_dir", "ray")


def _say(msg: str) -> None:
    print(f"[leakray] {msg}", flush=True)


def load_tasks(cfg: dict) -> list[dict]:
    bench = cfg["benchmark"]
    tasks = load_benchmark(bench["name"], bench.get("path"))
    if bench.get("limit"):
        tasks = sorted(tasks, key=lambda t: t[T.TASK_ID])[: int(bench["limit"])]
    return tasks


def run_id(cfg: dict, tasks: list[dict]) -> str:
    digest = content_hash([[t[T.TASK_ID], t[T.PROMPT], t[T.REFERENCE], t[T.TESTS]] for t in tasks])
    return content_hash({k: v for k, v in cfg.items() if k not in _NOT_HASHED}, digest)


def training_text(task: dict) -> str:
    """What a model that saw the sample saw: the prompt and its reference solution."""
    return program_of(task[T.PROMPT], continuation(task[T.PROMPT], task[T.REFERENCE]))


def collect_config(cfg: dict) -> CollectConfig:
    ray_cfg, embed, execute = cfg.get("ray", {}), cfg.get("embed", {}), cfg.get("execute", {})
    gpu = bool(ray_cfg.get("use_gpu"))
    return CollectConfig(
        sample=build(SampleConfig, cfg.get("sample"), "sample"),
        execute_timeout_s=float(execute.get("timeout_s", 10)), execute_threads=int(execute.get("threads", 4)),
        embed_model=embed.get("model", "minilm"), embed_max_tokens=int(embed.get("max_tokens", 510)),
        embed_stride=int(embed.get("stride", 256)), embed_batch_size=int(embed.get("batch_size", 16)),
        sample_resources=StageResources(int(ray_cfg.get("sample_actors", 2)), 1.0, 1.0 if gpu else 0.0),
        execute_resources=StageResources(int(ray_cfg.get("execute_actors", 1)), 0.0),
        embed_resources=StageResources(int(ray_cfg.get("embed_actors", 1)), 0.0, 0.25 if gpu else 0.0),
        batch_size=int(cfg.get("sample", {}).get("batch_size", 8)),
    )


def validate_config(cfg: dict) -> None:
    """Refuse a bad config before any stage spends time on it."""
    from leakray.detect.cgmia import CGMIAConfig

    for role in ("target", "shadow"):
        build(FinetuneConfig, cfg.get(role), role)
    if cfg["model"]["base"] == "tiny":
        build(TinyLMConfig, cfg["model"].get("tiny"), "model.tiny")
    collect_config(cfg)
    CGMIAConfig.from_dict(cfg.get("detect", {}).get("cgmia") or {})
    if not cfg.get("detect", {}).get("seeds"):
        raise BadInput("detect.seeds must list at least one seed")


def base_model(cfg: dict) -> tuple[str, dict]:
    base = cfg["model"]["base"]
    if base != "tiny":
        return base, {"name": base}
    tiny = build(TinyLMConfig, cfg["model"].get("tiny"), "model.tiny")
    path, stats = ensure_base_model(tiny)
    return str(path), stats


def run_simulation(cfg: dict) -> Path:
    """Run (or resume) the protocol; returns the run directory holding report.json/report.md."""
    from leakray.pipelines.collect import collect_on_ray, collection_stats, input_table, write_collection
    from leakray.pipelines.ray_runtime import ensure_ray
    from leakray.pipelines.train import finetune_on_ray

    t_start = time.perf_counter()
    validate_config(cfg)
    tasks = load_tasks(cfg)
    bench = cfg["benchmark"]
    run_dir = Path(cfg.get("output_dir", "runs")).resolve() / f"{bench['name']}-{run_id(cfg, tasks)}"
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "config.json", cfg)
    _say(f"run directory {run_dir} ({len(tasks)} tasks)")
    ray_cfg = cfg.get("ray", {})
    ensure_ray(ray_cfg.get("address"))
    timings: dict[str, float] = {}  # beyond the per-stage markers

    # 1. folds, by task, seeded
    stage = Stage(run_dir, "folds")
    if not stage.done:
        folds = assign_folds(tasks, bench.get("folds", 4), bench.get("fold_seed", 0))
        write_json_atomic(stage.dir / "folds.json", folds)
        stage.finish(sizes=[sum(1 for f in folds.values() if f == i) for i in range(bench.get("folds", 4))])
    folds = json.loads((stage.dir / "folds.json").read_text())
    by_fold = {i: [t for t in tasks if folds[t[T.TASK_ID]] == i] for i in range(4)}

    # 2. base model (cached across runs)
    stage = Stage(run_dir, "base").start()
    if not stage.done:
        path, stats = base_model(cfg)
        stage.finish(path=path, stats=stats)
    base_info = stage.info()
    _say(f"base model {base_info['path']} ({base_info['stats'].get('val_loss', '?')} val loss)")

    # 3. target (D1 leaked) and shadow (D3) fine-tunes on Ray Train
    models = {}
    for role, fold in (("target", 0), ("shadow", 2)):
        stage = Stage(run_dir, role).start()
        if not stage.done:
            ft = build(FinetuneConfig, cfg.get(role), role)
            stats = finetune_on_ray(base_info["path"], [training_text(t) for t in by_fold[fold]], ft,
                                    stage.dir / "model", name=f"{role}-{run_dir.name}",
                                    storage=run_dir / "ray_train", num_workers=int(ray_cfg.get("train_workers", 1)),
                                    use_gpu=bool(ray_cfg.get("use_gpu")))
            stage.finish(**stats)
        models[role] = stage
        _say(f"{role}: fine-tuned on D{fold + 1} ({len(by_fold[fold])} tasks), "
             f"final loss {stage.info().get('final_loss')}")

    # 4. collections: shadow on D3 u D4, target on D1 u D2
    ccfg = collect_config(cfg)
    for role, member_fold, other in (("shadow", 2, 3), ("target", 0, 1)):
        stage = Stage(run_dir, f"collect_{role}").start()
        if not stage.done:
            members = {t[T.TASK_ID] for t in by_fold[member_fold]}
            table = input_table(by_fold[member_fold] + by_fold[other], folds, members)
            t0 = time.perf_counter()
            coll = collect_on_ray(table, str(models[role].dir / "model"), ccfg, stage.dir)
            stats = collection_stats(coll, time.perf_counter() - t0)
            write_collection(coll, stage.dir / "collection.parquet", stats)
            stage.finish(**stats)
        _say(f"collection {role}: {stage.info()['rows']} tasks, {stage.info()['exec_status']}")

    # 5. detectors: trained on the shadow, scored on the target
    stage = Stage(run_dir, "detect").start()
    if not stage.done:
        from leakray.detect.cgmia import CGMIAConfig
        from leakray.pipelines.detectors import evaluate_detectors

        shadow = pq.read_table(run_dir / "collect_shadow" / "collection.parquet")
        target = pq.read_table(run_dir / "collect_target" / "collection.parquet")
        det = cfg.get("detect", {})
        result = evaluate_detectors(shadow, target, CGMIAConfig.from_dict(det.get("cgmia") or {}),
                                    list(det.get("seeds", [0])), use_ray_train=bool(det.get("use_ray_train", True)),
                                    storage_path=run_dir / "ray_train", save_dir=stage.dir)
        pq.write_table(result.pop("scores"), stage.dir / "scores.parquet")
        write_json_atomic(stage.dir / "metrics.json", result)
        stage.finish()

    # 6. report
    from leakray.report.simulate import write_report

    timings["total_this_invocation"] = round(time.perf_counter() - t_start, 1)
    report = write_report(run_dir, cfg, timings)
    for name in ("cgmia", "detectleak"):
        m = report["detectors"].get(name, {})
        _say(f"{name}: AUC {m.get('auc')}, MCC {m.get('mcc')}, TPR@5%FPR {m.get('tpr_at_5fpr')}")
    _say(f"report: {run_dir / 'report.md'}")
    return run_dir

