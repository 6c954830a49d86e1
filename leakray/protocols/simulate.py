"""The simulated-leakage protocol (CGMIA paper, RQ1) as a list of resumable stages.

folds (D1..D4 by task) -> base LM -> target = base + D1, shadow = base + D3 (Ray Train)
-> collections: shadow on D3 u D4, target on D1 u D2 (Ray Data) -> detectors trained on
the shadow, scored on the target -> report. `StageRunner` owns markers, timings, stats and
resumption; the run directory is keyed by a hash of the config and the benchmark's content.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from leakray.config import LOCAL_MODELS, SimulateConfig, to_stage
from leakray.console import Console
from leakray.data.folds import assign_folds, keep_together
from leakray.data.registry import load_benchmark
from leakray.data.tasks import continuation, program_of
from leakray.errors import BadInput
from leakray.runs import (StageRunner, StageSpec, Together, content_hash, machine_cpu, machine_use,
                          write_json_atomic)
from leakray.schema import T

ROLES = {"target": (0, 1), "shadow": (2, 3)}  # role -> (member fold, non-member fold): D1/D2, D3/D4


CONSOLE_TOP = 5  # detectors by AUC printed at the end of a run


def load_tasks(cfg: SimulateConfig) -> list[dict]:
    bench = cfg.benchmark
    tasks = load_benchmark(bench.name, bench.path)
    if bench.limit:
        tasks = sorted(tasks, key=lambda t: t[T.TASK_ID])[: bench.limit]
    if len(tasks) < bench.folds:
        raise BadInput(f"{len(tasks)} tasks cannot fill {bench.folds} folds", field="benchmark.limit")
    return tasks


def tasks_digest(tasks: list[dict]) -> str:
    """The benchmark's content as the run sees it (ids, prompts, references, tests)."""
    return content_hash([[t[T.TASK_ID], t[T.PROMPT], t[T.REFERENCE], t[T.TESTS]] for t in tasks])


def run_id(cfg: SimulateConfig, tasks: list[dict]) -> str:
    return content_hash(cfg.hashed(), tasks_digest(tasks))


def training_text(task: dict) -> str:
    """What a model that saw the sample saw: the prompt and its reference solution."""
    return program_of(task[T.PROMPT], continuation(task[T.PROMPT], task[T.REFERENCE]))


def collect_config(cfg: SimulateConfig, base_path: str | None = None):
    from leakray.protocols.collection import wanted_probes, wants_advprompt, wants_upper_case
    from leakray.stages.base import StageResources
    from leakray.stages.collect import CollectConfig
    from leakray.stages.sample import ExtraColumns

    r, gpu = cfg.ray, cfg.ray.use_gpu
    ref_model = base_path if cfg.columns.reference_model == "base" else cfg.columns.reference_model
    return CollectConfig(
        extra=ExtraColumns(reference_model=ref_model, alt_reference_model=nonoracle_reference(cfg),
                           upper_case=wants_upper_case(cfg),
                           advprompt=wants_advprompt(cfg), probes=wanted_probes(cfg),
                           probe_tokens=cfg.columns.probe_tokens, next_cuts=cfg.columns.next_cuts,
                           next_draws=cfg.columns.next_draws),
        sample=to_stage(cfg.sample), execute_timeout_s=cfg.execute.timeout_s, execute_threads=cfg.execute.threads,
        allow_weak_isolation=cfg.execute.allow_weak_isolation,
        embed_model=cfg.embed.model, embed_max_tokens=cfg.embed.max_tokens, embed_stride=cfg.embed.stride,
        embed_batch_size=cfg.embed.batch_size,
        sample_resources=StageResources(r.sample_actors, 1.0, 1.0 if gpu else 0.0, reuse_workers=r.reuse_workers),
        execute_resources=StageResources(r.execute_actors, 0.0),
        embed_resources=StageResources(max(1, r.embed_actors), 0.0, 0.25 if gpu else 0.0),
        embed_with_sampler=r.embed_actors == 0,
        batch_size=cfg.sample.batch_size,
    )


def nonoracle_reference(cfg: SimulateConfig) -> str | None:
    """The second reference model's path, when the first is the oracle (the target's own pre-leak
    checkpoint) and a requested detector reads it: "auto" = the other local architecture."""
    from leakray.protocols.collection import wants_second_reference

    name = cfg.columns.nonoracle_reference
    if name is None or cfg.columns.reference_model != "base" or not wants_second_reference(cfg):
        return None
    if name == "auto":
        if cfg.model.base not in LOCAL_MODELS:
            return None
        name = LOCAL_MODELS[1 - LOCAL_MODELS.index(cfg.model.base)]
    return model_path(cfg, name)


def base_model(cfg: SimulateConfig, which: str = "base", progress_file: Path | None = None) -> tuple[str, dict]:
    """(path, stats) of the target's base ("base") or the shadow's ("shadow_base"). ``progress_file``:
    where a local base that has to be pretrained keeps its count of steps (`leakray.progress`)."""
    from leakray.models.offline import ensure_base_model

    ref = cfg.model.base if which == "base" else (cfg.model.shadow_base or cfg.model.base)
    if ref not in ("tiny", "tiny-alt"):
        return ref, {"name": ref}
    path, stats = ensure_base_model(to_stage(cfg.model.tiny if ref == "tiny" else cfg.model.shadow_tiny),
                                    progress_file=progress_file)
    return str(path), stats


def base_stage_info(path: str, stats: dict) -> dict:
    """A base stage's marker: the model and its stats, and where the time went when this stage
    pretrained it (a cached or shipped base's stats are its build's: their parts are not this stage's)."""
    built_now = stats.get("cached") is False and "part_seconds" in stats
    return {"path": path, "stats": stats,
            **({k: stats[k] for k in ("part_seconds", "throughput")} if built_now else {})}


def model_path(cfg: SimulateConfig, name: str) -> str:
    """Any model name as a loadable path: a local one (tiny, tiny-alt: built and cached here), an HF
    id or a path as it is."""
    if name not in ("tiny", "tiny-alt"):
        return name
    from leakray.models.offline import ensure_base_model

    return str(ensure_base_model(to_stage(cfg.model.tiny if name == "tiny" else cfg.model.shadow_tiny))[0])


def evaluated_members(members: list[dict], non_members: list[dict], fraction: float, seed: int):
    """Subsample the larger side so members are ``fraction`` of the evaluated tasks (seeded,
    by task); 0.5 keeps both folds whole."""
    rng = np.random.default_rng([seed, 17])
    n_mem, n_non = len(members), len(non_members)
    if fraction <= 0.5:
        n_mem = min(n_mem, max(1, round(fraction / (1 - fraction) * n_non)))
    else:
        n_non = min(n_non, max(1, round((1 - fraction) / fraction * n_mem)))
    pick = lambda rows, n: [rows[i] for i in sorted(rng.permutation(len(rows))[:n])]  # noqa: E731
    return pick(members, n_mem), pick(non_members, n_non)


def copy_groups_of(cfg, tasks: list[dict]) -> list[list[str]]:
    """The benchmark's near-copy groups that every split keeps on one side (`benchmark.near_copies`)."""
    if cfg.benchmark.near_copies != "together":
        return []
    from leakray.screen.siblings import task_copy_groups

    return task_copy_groups(tasks)


def preflight_isolation(cfg: SimulateConfig) -> str:
    """Refuse to run generated code without real isolation unless the user opted in."""
    from leakray.sandbox import isolation as iso

    level = iso.detect("auto", quiet=True)  # we refuse or warn ourselves, once
    if level != iso.BWRAP and not cfg.execute.allow_weak_isolation:
        raise BadInput(f"bubblewrap is not available (isolation would be '{level}'): generated code would run "
                       "without mount/pid namespaces. Install it (apt-get install bubblewrap) or opt in with "
                       "--set execute.allow_weak_isolation=true", field="execute.allow_weak_isolation")
    return level


def simulate_stages(cfg: SimulateConfig, tasks: list[dict], runner: StageRunner,
                    isolation: str) -> list[StageSpec | Together]:
    """The protocol, one StageSpec per step; each reads what earlier stages wrote in their dirs."""
    from leakray.protocols import collection
    from leakray.stages import collect as col

    def by_fold() -> dict[int, list[dict]]:
        folds = json.loads((runner.dir("folds") / "folds.json").read_text())
        return {i: [t for t in tasks if folds[t[T.TASK_ID]] == i] for i in range(cfg.benchmark.folds)}

    def folds_stage(out: Path) -> dict:
        folds = assign_folds(tasks, cfg.benchmark.folds, cfg.benchmark.fold_seed, cfg.benchmark.fold_balance)
        groups = copy_groups_of(cfg, tasks)
        folds, moved = keep_together(folds, groups, {t[T.TASK_ID]: len(t[T.REFERENCE]) for t in tasks})
        write_json_atomic(out / "folds.json", folds)
        sizes = [sum(1 for f in folds.values() if f == i) for i in range(cfg.benchmark.folds)]
        return {"rows_in": len(tasks), "rows_out": len(folds), "sizes": sizes,
                "near_copy_groups": groups, "moved_to_their_copies": [list(m) for m in moved]}

    def base_stage(which: str):
        def run(out: Path) -> dict:
            from leakray.progress import PROGRESS_FILE

            return base_stage_info(*base_model(cfg, which, progress_file=out / PROGRESS_FILE))
        return run

    def base_of(role: str) -> str:
        return runner.info["shadow_base" if role == "shadow" and cfg.model.shadow_base else "base"]["path"]

    def corpus_stage(out: Path) -> dict:
        from leakray.leak.corpus import clean_corpus

        texts, stats = clean_corpus(tasks, cfg.leak.corpus_max_bytes, cfg.leak.seed)
        stats["build_seconds"] = stats.pop("seconds", None)  # the marker's own `seconds` is this stage's
        return {"rows_in": stats.get("files_seen"), "rows_out": len(texts), **stats}

    def pretrain_mix_stage(role: str):
        def run(out: Path) -> dict:
            from leakray.leak.corpus import clean_corpus
            from leakray.executor.leak_train import pretrain_mix_on_ray

            corpus, _ = clean_corpus(tasks, cfg.leak.corpus_max_bytes, cfg.leak.seed)  # cached by the corpus stage
            texts = [training_text(t) for t in by_fold()[ROLES[role][0]]]
            stats = pretrain_mix_on_ray(base_of(role), corpus, texts, cfg.leak.mix(role=role), out / "model",
                                        name=f"{role}-{runner.run_dir.name}", storage=runner.run_dir / "ray_train",
                                        num_workers=cfg.ray.train_workers, use_gpu=cfg.ray.use_gpu,
                                        ray_train=cfg.ray.use_ray_train, progress_to=out)
            return {"rows_in": len(texts), "rows_out": len(texts), **stats}
        return run

    def finetune_stage(role: str):
        if cfg.leak.mode == "pretrain-mix":
            return pretrain_mix_stage(role)

        def run(out: Path) -> dict:
            from leakray.executor.train import finetune_on_ray

            texts = [training_text(t) for t in by_fold()[ROLES[role][0]]]
            stats = finetune_on_ray(base_of(role), texts, to_stage(getattr(cfg, role)), out / "model",
                                    name=f"{role}-{runner.run_dir.name}", storage=runner.run_dir / "ray_train",
                                    num_workers=cfg.ray.train_workers, use_gpu=cfg.ray.use_gpu,
                                    ray_train=cfg.ray.use_ray_train, progress_to=out)
            return {"rows_in": len(texts), "rows_out": len(texts), **stats}
        return run

    def collect_stage(role: str):
        def run(out: Path) -> dict:
            member, other = ROLES[role]
            folds = json.loads((runner.dir("folds") / "folds.json").read_text())
            groups = by_fold()
            mem, non = groups[member], groups[other]
            if role == "target" and cfg.leak.member_fraction != 0.5:
                mem, non = evaluated_members(mem, non, cfg.leak.member_fraction, cfg.benchmark.fold_seed)
            members = {t[T.TASK_ID] for t in mem}
            table = collection.with_variants(col.input_table(mem + non, folds, members), cfg, runner.dir("perturb"))
            from leakray.models.vllm_sampler import sampling_source

            ccfg = collect_config(cfg, base_of(role))
            # vLLM serves a LoRA fine-tune as base engine + the role's adapter (unless merge_adapters)
            model_path, ccfg.sample.lora_adapter = sampling_source(
                str(runner.dir(role) / "model"), runner.info[role], base_of(role), ccfg.sample)
            stats = collection.collect_to(table, model_path, ccfg, out)
            return {**stats, "isolation": isolation, "reference_model": ccfg.extra.reference_model,
                    "nonoracle_reference": ccfg.extra.alt_reference_model}
        return run

    def detect_stage(out: Path) -> dict:
        from leakray.executor.runtime import submit_tasks
        from leakray.protocols.advprompt_eval import advprompt_part
        from leakray.parts import PartClock
        from leakray.progress import PROGRESS_FILE, JobTally
        from leakray.protocols.detectors import detect_parts, evaluate_detectors

        shadow = pq.read_table(runner.dir("collect_shadow") / "collection.parquet")
        target = pq.read_table(runner.dir("collect_target") / "collection.parquet")
        # AdvPrompt's gray-box setting and its ablation (MLP fits, tens of seconds) start first, as
        # Ray tasks beside the detectors' own when detect.parallel; their results join below
        parts = []
        if collection.wants_advprompt(cfg) and (cfg.detect.detectors == "all" or "advprompt" in cfg.detect.detectors):
            parts = ["graybox"] + (["ablation"] if cfg.detect.advprompt_ablation else [])
        # the folds' own near-copy groups (none in a run drawn before them)
        copy_groups = runner.info["folds"].get("near_copy_groups", [])
        tally = JobTally(out / PROGRESS_FILE, unit="detector jobs")  # the console's progress lines
        tally.add(len(parts))
        extras = submit_tasks(advprompt_part, parts, shadow, target, cfg.detect.seeds, cfg.detect.threshold_rule,
                              cfg.detect.bootstrap, copy_groups,
                              engine="ray" if cfg.detect.parallel and parts else "local", on_done=tally.finished)
        result = evaluate_detectors(shadow, target, cfg.detect.cgmia_config(), cfg.detect.seeds,
                                    use_ray_train=cfg.detect.ray_train(), storage_path=runner.run_dir / "ray_train",
                                    save_dir=out, threshold_rule=cfg.detect.threshold_rule,
                                    bootstrap=cfg.detect.bootstrap, detectors=learned_detectors(cfg),
                                    detector_params=cfg.detect.params, trace_memory=cfg.detect.trace_memory,
                                    parallel=cfg.detect.parallel,
                                    expert_ablation=cfg.detect.expert_ablation,
                                    copy_groups=copy_groups, tally=tally)
        clock = PartClock()
        clock.merge(result.pop("part_seconds", None))
        for part, done in zip(parts, extras()):
            clock.add(f"advprompt_{part}", done["seconds"])
            if part == "graybox":
                merge_results(result, done, "advprompt_graybox")
            elif "result" in done and "advprompt" in result.get("median", {}):  # the ablation of a detector that ran
                result["advprompt_ablation"] = done["result"]
        pq.write_table(result.pop("scores"), out / "scores.parquet")
        write_json_atomic(out / "metrics.json", result)
        return {"rows_in": shadow.num_rows + target.num_rows, "rows_out": target.num_rows,
                "detectors": sorted(result["median"]), **detect_parts(clock, result)}

    stages = [
        StageSpec("folds", folds_stage, lambda i: f"D1..D4 sizes {i['sizes']}" + (
            f"; {len(i['near_copy_groups'])} group(s) of near-copies each in one fold "
            f"({len(i['moved_to_their_copies'])} task(s) traded)" if i.get("near_copy_groups") else "")),
        *([collection.perturb_spec(cfg, tasks)] if collection.wants_advprompt(cfg) else []),
        StageSpec("base", base_stage("base"), lambda i: f"{i['path']} (val loss {i['stats'].get('val_loss', '?')})"),
        *([StageSpec("shadow_base", base_stage("shadow_base"), lambda i: f"shadow's own base {i['path']} "
                     f"(val loss {i['stats'].get('val_loss', '?')})")] if cfg.model.shadow_base else []),
        *([StageSpec("corpus", corpus_stage, lambda i: f"clean corpus: {i['rows_out']} files, "
                     f"{i['removed_by_screen']['files']} removed by the screener")]
          if cfg.leak.mode == "pretrain-mix" else []),
        # the two fine-tunes read only the base and their own fold: side by side, one core each
        Together(tuple(StageSpec(role, finetune_stage(role), lambda i, role=role: _leak_line(role, i))
                       for role in ("target", "shadow"))),
        *(StageSpec(f"collect_{role}", collect_stage(role),
                   lambda i: collection.summary_line(i, parse_failures=True), resumable=True)
          for role in ("shadow", "target")),
        StageSpec("detect", detect_stage, lambda i: f"{', '.join(i['detectors'])}"),
    ]
    from leakray.protocols.stage_keys import simulate_keys, with_keys

    return with_keys(stages, simulate_keys(cfg, tasks_digest(tasks)))


def _leak_line(role: str, i: dict) -> str:
    where = f"D{ROLES[role][0] + 1} ({i['rows_in']} tasks)" + (f" on {i['device']}" if i.get("device") else "")
    if "dose" in i:
        return (f"pretrain-mix: {where} x{i['dose']} in {i.get('n_tokens')} tokens "
                f"(member share {i.get('member_token_share', 0):.2%}), final loss {i.get('final_loss')}")
    return f"fine-tuned on {where}, final loss {i.get('final_loss')}"


def learned_detectors(cfg: SimulateConfig):
    """detect.detectors: every one is a registry detector (AdvPrompt's gray-box setting, which
    needs target labels, is evaluated apart by the detect stage)."""
    return cfg.detect.detectors


def merge_results(result: dict, done: dict, name: str) -> None:
    """Fold a separately evaluated detector family (``advprompt_part``'s {"result" | "skipped",
    "seconds"}) into `evaluate_detectors`' result; an unusable input skips it with the reason
    (never a 0.5)."""
    if "skipped" in done:
        result.setdefault("skipped", {})[name] = done["skipped"]
        return
    for key in ("per_seed", "median", "thresholds", "skipped"):
        result.setdefault(key, {}).update(done["result"].get(key, {}))
    result.setdefault("seconds", {})[name] = done["seconds"]


def run_simulation(cfg: SimulateConfig, console: Console | None = None) -> Path:
    """Run (or resume) the protocol; returns the run directory holding report.json/report.md.
    With ``benchmark.names`` it runs once per benchmark under one directory and compares them;
    with ``leak.mode=dose-sweep`` once per dose, with the detectability curve."""
    from leakray.protocols import dose_sweep, fanout

    console = console or Console()
    if cfg.benchmark.names:
        return fanout.fan_out(cfg.output_dir, f"multi-{content_hash(cfg.hashed())}", benchmark_children(cfg),
                              run_one, console, lambda parent, runs: compare_benchmarks(parent, console))
    if cfg.leak.mode == "dose-sweep":
        return fanout.fan_out(cfg.output_dir, f"dose-sweep-{cfg.benchmark.name}-{content_hash(cfg.hashed())}",
                              dose_sweep.dose_children(cfg), run_one, console,
                              lambda parent, runs: dose_sweep.aggregate(parent, runs, console))
    return run_one(cfg, console)


def benchmark_children(cfg: SimulateConfig) -> list:
    def child(name: str):
        bench = cfg.benchmark.model_copy(update={"name": name, "path": cfg.benchmark.paths.get(name), "names": [],
                                                 "paths": {}})
        return lambda output_dir: cfg.model_copy(update={"benchmark": bench, "output_dir": output_dir})

    return [(f"benchmark {name}", child(name)) for name in cfg.benchmark.names]


def compare_benchmarks(parent: Path, console: Console) -> None:
    """The paper-style comparison across the benchmarks' runs (`leakray compare` on ``parent``)."""
    from leakray.report.compare import compare

    try:
        compare([parent], parent / "compare", metrics=["auc", "tpr_at_5fpr", "mcc"])
    except BadInput as exc:  # e.g. the reference detector was not run: the per-benchmark reports stand
        console.warn(f"no comparison across benchmarks: {exc}")
        return
    console.say(f"comparison across benchmarks: {parent}/compare/compare.md")


def run_one(cfg: SimulateConfig, console: Console) -> Path:
    from leakray.protocols.engine import open_run, stage_runner, time_line, broken_references_line
    from leakray.report.simulate import write_report

    t_start, cpu_start = time.perf_counter(), machine_cpu()
    tasks = load_tasks(cfg)
    isolation = preflight_isolation(cfg)
    store = open_run(cfg, f"{cfg.benchmark.name}-{run_id(cfg, tasks)}", len(tasks), console)
    run_dir = store.local
    if warning := broken_references_line(tasks):  # said once the run's log exists: it goes there too
        console.warn(warning)
    if isolation != "bwrap":
        console.warn(f"sandbox isolation is '{isolation}' (opted in with execute.allow_weak_isolation)")
    runner = stage_runner(cfg, store, console)
    runner.run(simulate_stages(cfg, tasks, runner, isolation))

    report = write_report(run_dir, cfg.model_dump(), {"total_this_invocation": round(time.perf_counter() - t_start, 1)})
    store.close()
    ranked = sorted(report["detectors"].items(), key=lambda kv: -(kv[1].get("auc") or 0.0))
    for name, m in ranked[:CONSOLE_TOP]:  # the full table is in the report
        console.say(f"{name:<15} AUC {_num(m.get('auc'))}  MCC {_num(m.get('mcc'))}  "
                    f"TPR@5%FPR {_num(m.get('tpr_at_5fpr'))}")
    console.say(f"report: {store.location}/report.md")
    console.say(time_line({n: runner.info[n] for n in runner.ran}, time.perf_counter() - t_start,
                          machine_use(cpu_start, machine_cpu())))
    return run_dir


def _num(v) -> str:
    return "–" if v is None else f"{v:.3f}"
