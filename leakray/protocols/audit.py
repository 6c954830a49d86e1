"""`leakray audit`: has this model seen my benchmark, which samples, how much does it inflate
its score. A list of resumable stages on the same runner as the simulated-leak protocol.

split (shadow half, planted members) -> base -> [shadow -> collect_shadow -> card] unless a card
is reused -> target (planted only) -> collect_target (the whole benchmark) -> control_scores (with
control tasks) -> screen (with a corpus) -> verdicts: calibrated probability, verdict, leaked
fraction, inflation, cleaned export.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from leakray.config import ADVPROMPT_KINDS, LOCAL_MODELS, UNHASHED_SAMPLE, AuditConfig, to_stage
from leakray.console import Console
from leakray.data.registry import benchmark_path
from leakray.detect.card import DetectorCard
from leakray.errors import BadInput
from leakray.protocols.simulate import (base_model, base_stage_info, collect_config, copy_groups_of, load_tasks,
                                        model_path, preflight_isolation, training_text)
from leakray.protocols.stage_keys import audit_keys, with_keys
from leakray.runs import (MARKER, StageRunner, StageSpec, Together, content_hash, machine_cpu, machine_use,
                          write_json_atomic)
from leakray.storage import is_uri, local_copy
from leakray.schema import C, K, R, T

CARD_STAGES = ("shadow", "collect_shadow", "card")




def split_members(ids: list[str], share: float, seed: int, groups: list[list[str]] = (),
                  length: dict[str, int] | None = None) -> list[str]:
    """A seeded share of the task ids (sorted first, so the draw does not depend on file order),
    each of ``groups`` (near-copies) then on one side (`data.folds.keep_together`), the count kept."""
    from leakray.data.folds import keep_together

    ids = sorted(ids)
    n = int(round(share * len(ids)))
    pick = set(np.random.default_rng(seed).permutation(len(ids))[:n].tolist())
    side, _ = keep_together({t: int(i in pick) for i, t in enumerate(ids)}, groups, length)
    return sorted(t for t in ids if side[t])


def with_members(table: pa.Table, members: set[str] | None) -> pa.Table:
    """member 1/0 by the given ids; -1 (unknown) for a target whose training data we cannot see."""
    ids = table.column(C.TASK_ID).to_pylist()
    values = [-1] * len(ids) if members is None else [int(t in members) for t in ids]
    i = table.schema.get_field_index(C.MEMBER)
    return table.set_column(i, table.schema.field(i), pa.array(values, pa.int8()))


def audit_stages(cfg: AuditConfig, tasks: list[dict], runner: StageRunner, isolation: str,
                 card_dir: Path | None, card_only: bool = False) -> list[StageSpec | Together]:
    from leakray.protocols import collection
    from leakray.stages import collect as col

    a = cfg.audit
    planted = a.target == "planted"
    ids = [t[T.TASK_ID] for t in tasks]

    def split() -> dict:
        return json.loads((runner.dir("split") / "split.json").read_text())

    def split_stage(out: Path) -> dict:
        groups, length = copy_groups_of(cfg, tasks), {t[T.TASK_ID]: len(t[T.REFERENCE]) for t in tasks}
        s = {"shadow_members": split_members(ids, 0.5, a.shadow_seed, groups, length),
             "planted_members": split_members(ids, a.member_fraction, a.member_seed, groups, length)
             if planted else None,
             "near_copy_groups": groups}  # the card's halves keep them together too (protocols/card.py)
        write_json_atomic(out / "split.json", s)
        return {"rows_in": len(ids), "rows_out": len(ids), "shadow_members": len(s["shadow_members"]),
                "planted_members": None if s["planted_members"] is None else len(s["planted_members"]),
                "near_copy_groups": len(groups)}

    def base_stage(out: Path) -> dict:
        from leakray.progress import PROGRESS_FILE

        return base_stage_info(*base_model(cfg, progress_file=out / PROGRESS_FILE))

    def finetune(role: str, members_key: str):
        def run(out: Path) -> dict:
            members = set(split()[members_key])
            texts = [training_text(t) for t in tasks if t[T.TASK_ID] in members]
            base = runner.info["base"]["path"] if role == "shadow" else model_path(cfg, planted_base(cfg))
            if not texts:  # a planted fraction of 0: the target is the base itself
                return {"rows_in": 0, "rows_out": 0, "model": base}
            common = {"name": f"audit-{role}-{runner.run_dir.name}", "storage": runner.run_dir / "ray_train",
                      "num_workers": cfg.ray.train_workers, "use_gpu": cfg.ray.use_gpu,
                      "ray_train": cfg.ray.use_ray_train}
            if cfg.leak.mode == "pretrain-mix":  # each member read `leak.dose` times among clean code
                from leakray.executor.leak_train import pretrain_mix_on_ray
                from leakray.leak.corpus import clean_corpus

                corpus, _ = clean_corpus(tasks, cfg.leak.corpus_max_bytes, cfg.leak.seed)
                stats = pretrain_mix_on_ray(base, corpus, texts, cfg.leak.mix(role=role), out / "model",
                                            progress_to=out, **common)
            else:
                from leakray.executor.train import finetune_on_ray

                stats = finetune_on_ray(base, texts, to_stage(getattr(cfg, role)), out / "model", progress_to=out,
                                        **common)
            return {"rows_in": len(texts), "rows_out": len(texts), "model": str(out / "model"), **stats}
        return run

    def collect(model, members, reference: str, served: bool = False):
        def run(out: Path) -> dict:
            table = collection.with_variants(with_members(col.input_table(tasks, {}, set()), members()), cfg,
                                             runner.dir("perturb"))
            from leakray.models.vllm_sampler import sampling_source

            base, path = runner.info["base"]["path"], model()
            ccfg = collect_config(cfg, base)
            if not served:  # the shadow: a model this audit made
                ccfg.sample = sampled_here(ccfg.sample)
            if cfg.columns.reference_model is not None:  # never the target's own pre-leak checkpoint by default
                ccfg.extra.reference_model = model_path(cfg, reference)
            # the fine-tune stage (shadow, planted target) that made this model, if one did: vLLM
            # serves a LoRA fine-tune as base engine + its adapter (unless merge_adapters)
            made = next((runner.info[r] for r in ("shadow", "target")
                         if runner.info.get(r, {}).get("model") == path), {})
            path, ccfg.sample.lora_adapter = sampling_source(path, made, base, ccfg.sample)
            stats = collection.collect_to(table, path, ccfg, out)
            return {**stats, "isolation": isolation, "reference_model": reference}
        return run

    def rewrite_stage(out: Path) -> dict:
        from leakray.executor.runtime import run_task
        from leakray.parts import timed
        from leakray.protocols.rewrite_scores import rewrite_scores, scoring_parts, write_rewrite_scores

        ref = target_reference(cfg)
        args = (tasks, target_model(), to_stage(cfg.sample), model_path(cfg, ref), a.rewrites, a.rewrite_seed)
        # the driver may have no GPU: then one Ray task holds both models in turn
        table, clocked = run_task(timed, rewrite_scores, *args, engine="ray" if cfg.ray.use_gpu else "local",
                                  num_gpus=1)
        write_rewrite_scores(table, out)
        tested = sum(1 for r in table.column(R.REASON).to_pylist() if not r)
        return {"rows_in": len(tasks), "rows_out": tested, "reference_model": ref, **scoring_parts(clocked)}

    def control_stage(out: Path) -> dict:
        from leakray.executor.runtime import run_task
        from leakray.parts import timed
        from leakray.protocols.control_scores import control_scores, load_control, write_control_scores
        from leakray.protocols.rewrite_scores import scoring_parts

        control, copies = load_control(a.control, tasks)
        ref = target_reference(cfg)
        args = (tasks, control, target_model(), to_stage(cfg.sample), model_path(cfg, ref))
        # as the rewrite test: the driver may have no GPU, then one Ray task holds both models in turn
        table, clocked = run_task(timed, control_scores, *args, engine="ray" if cfg.ray.use_gpu else "local",
                                  num_gpus=1)
        write_control_scores(table, out)
        scored = sum(1 for r, s in zip(table.column(K.REASON).to_pylist(), table.column(K.SET).to_pylist())
                     if not r and s == "control")
        return {"rows_in": len(tasks) + len(control), "rows_out": table.num_rows, "control_tasks": len(control),
                "control_scored": scored, "reference_model": ref, **scoring_parts(clocked),
                "near_copies_left_out": copies}  # control tasks nearly copying a benchmark task (load_control)

    def card_stage(out: Path) -> dict:
        from leakray.progress import PROGRESS_FILE, JobTally
        from leakray.protocols.card import build_card

        shadow = pq.read_table(runner.dir("collect_shadow") / "collection.parquet")
        card = build_card(shadow, cfg, out, storage=runner.run_dir / "ray_train",
                          meta=card_meta(cfg, tasks, runner.info["base"]["path"]),
                          groups=split().get("near_copy_groups", []),
                          tally=JobTally(out / PROGRESS_FILE, unit="detector jobs"))  # the progress lines
        return {"rows_in": shadow.num_rows, "rows_out": card.meta["n_val"], "card_id": card.id,
                "detectors": card.names, **card.stage_parts}

    def screen_stage(out: Path) -> dict:
        from leakray.protocols.screen import run_screen

        summary = run_screen([(cfg.benchmark.name, benchmark_path(cfg.benchmark.name, cfg.benchmark.path))], a.corpus, str(out),
                             address=cfg.ray.address, log=lambda msg: None)
        b = summary["benchmarks"][cfg.benchmark.name]
        return {"rows_in": b["n_samples"], "rows_out": b["n_leaked"], "pairs": b["n_pairs"]}

    def target_model() -> str:
        if not planted:
            return a.target
        return runner.info["target"]["model"]

    def planted_members():
        return set(split()["planted_members"]) if planted else None

    stages = [  # the base is cheap when cached, and every path needs it: shadow, planted target, reference model
        StageSpec("split", split_stage, lambda i: f"shadow sees {i['shadow_members']} tasks"
                  + ("" if i["planted_members"] is None else f", planted target {i['planted_members']}")
                  + (f"; {i['near_copy_groups']} group(s) of near-copies kept on one side"
                     if i.get("near_copy_groups") else "")),
        StageSpec("base", base_stage, lambda i: f"{i['path']}"),
        *([collection.perturb_spec(cfg, tasks)] if collection.wants_advprompt(cfg) else []),
    ]
    shadow = StageSpec("shadow", finetune("shadow", "shadow_members"),
                       lambda i: f"{leak_kind(cfg)} on {i['rows_in']} tasks, final loss {i.get('final_loss')}")
    target = StageSpec("target", finetune("target", "planted_members"),
                       lambda i: f"planted leak: {leak_kind(cfg)} on {i['rows_in']} tasks")
    # a planted target reads only the base and its own members: it trains beside the shadow (one
    # thread each, each waiting on its own Ray work), as simulate's two fine-tunes do
    together = card_dir is None and planted and not card_only
    if card_dir is None:
        stages += [
            Together((shadow, target)) if together else shadow,
            StageSpec("collect_shadow", collect(lambda: runner.info["shadow"]["model"],
                                                lambda: set(split()["shadow_members"]),
                                                reference_for(cfg, cfg.model.base)),
                      collection.summary_line, resumable=True),
            StageSpec("card", card_stage, lambda i: f"card {i['card_id']}: {len(i['detectors'])} detectors"),
        ]
    if card_only:
        return stages
    if planted and not together:
        stages.append(target)
    stages.append(StageSpec("collect_target",
                            collect(target_model, planted_members, target_reference(cfg), served=True),
                            collection.summary_line, resumable=True))
    if a.rewrites:
        stages.append(StageSpec("rewrite_scores", rewrite_stage,
                                lambda i: f"{i['rows_out']} tasks scored against their rewrites "
                                          f"(reference model {i['reference_model']})"))
    if a.control:
        stages.append(StageSpec("control_scores", control_stage,
                                lambda i: f"{i['control_scored']} of {i['control_tasks']} control tasks scored beside the "
                                          f"benchmark (reference model {i['reference_model']})"))
    if a.corpus:
        stages.append(StageSpec("screen", screen_stage, lambda i: f"{i['rows_out']} samples with a near-duplicate"))
    return stages


def card_run_name(cfg: AuditConfig, digest: str) -> str:
    """`card build`'s run directory: a card depends on the shadow's side only, so the same card serves any target."""
    hashed = cfg.model_dump(include={"benchmark", "model", "shadow", "sample", "columns", "embed", "detect"})
    for key in UNHASHED_SAMPLE:  # how often a failed row is tried again: not what the card is made of
        hashed["sample"].pop(key, None)
    hashed["audit"] = cfg.audit.model_dump(include={"shadow_seed", "validation_share", "calibration", "fpr",
                                                    "reference_model"})
    if cfg.leak.mode != "finetune":  # (fine-tune cards keep the names they had before leak kinds)
        hashed["leak"] = cfg.leak.model_dump()
    return f"card-{cfg.benchmark.name}-{content_hash(hashed, digest)}"


def check_endpoint(cfg: AuditConfig, console: Console) -> None:
    """The served model answers one tiny request (`EndpointSampler.check`), or the audit stops here."""
    from leakray.models.endpoint_sampler import EndpointSampler

    sampler = EndpointSampler(cfg.audit.target, to_stage(cfg.sample))
    sampler.check()
    console.say(f"endpoint {sampler.settings.completions_url} answers for model {sampler.model!r}")


def sampled_here(sample):
    """How a model this audit made (the shadow) is sampled: where the model under audit sits behind
    an endpoint (`sample.backend=openai`), the endpoint serves that model only, so the shadow is
    sampled here (the HF backend) with the same settings, as the reference models are."""
    from dataclasses import replace

    return replace(sample, backend="hf") if sample.backend == "openai" else sample


def leak_kind(cfg: AuditConfig) -> str:
    return f"pretraining mixture, each member {cfg.leak.dose}x" if cfg.leak.mode == "pretrain-mix" else "fine-tuned"


def shadow_leak(cfg: AuditConfig) -> dict:
    """How the shadow (and a planted target) saw its members: the strength of leak a card knows."""
    if cfg.leak.mode == "pretrain-mix":
        return {"mode": "pretrain-mix", "dose": cfg.leak.dose, "steps": cfg.leak.steps}
    return {"mode": "finetune", "epochs": cfg.shadow.epochs}


def reference_for(cfg: AuditConfig, base: str) -> str:
    """The reference model for a model built on ``base``: audit.reference_model, or with "auto" a
    local model that is not ``base`` (tiny <-> tiny-alt), else the shadow's base."""
    ref = cfg.audit.reference_model
    if ref != "auto":
        return ref
    if base in LOCAL_MODELS:
        return LOCAL_MODELS[1 - LOCAL_MODELS.index(base)]
    return cfg.model.base if cfg.model.base != base else LOCAL_MODELS[0]


def planted_base(cfg: AuditConfig) -> str:
    return cfg.audit.planted_base or cfg.model.base


def target_reference(cfg: AuditConfig) -> str:
    """The target's reference model: for a planted target one that is not its base; for a given
    target, chosen from the shadow's base (the audit cannot know the target's checkpoints)."""
    return reference_for(cfg, planted_base(cfg) if cfg.audit.target == "planted" else cfg.model.base)


def _tasks_digest(tasks: list[dict]) -> str:
    """The benchmark's tasks as a card records them (ids and references)."""
    return content_hash([[t[T.TASK_ID], t[T.REFERENCE]] for t in tasks])


def card_meta(cfg: AuditConfig, tasks: list[dict], base_path: str) -> dict:
    """What a card records of how it was made (so a reuse can be checked against it)."""
    return {
        "benchmark": {"name": cfg.benchmark.name, "n_tasks": len(tasks), "digest": _tasks_digest(tasks)},
        "shadow": {"base": cfg.model.base, "base_path": base_path, "finetune": cfg.shadow.model_dump(),
                   "shadow_seed": cfg.audit.shadow_seed, "leak": shadow_leak(cfg)},
        "collection": collection_settings(cfg, reference_for(cfg, cfg.model.base)),
        "validation_share": cfg.audit.validation_share, "calibration_method": cfg.audit.calibration,
        "fpr": cfg.audit.fpr, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def collection_settings(cfg: AuditConfig, reference: str) -> dict:
    """The settings a detector's features depend on: a card applied to a collection made
    otherwise sees other feature distributions."""
    s = cfg.sample
    return {"k": s.k, "temperature": s.temperature, "top_p": s.top_p, "max_new_tokens": s.max_new_tokens,
            "embed": cfg.embed.model_dump(),
            "reference_model": None if cfg.columns.reference_model is None else reference,
            "upper_case": cfg.columns.upper_case,
            # the memory probes' statistics depend on their generation budget (text-only audits use them)
            "probes": list(cfg.columns.probes), "probe_tokens": cfg.columns.probe_tokens,
            "next_cuts": cfg.columns.next_cuts, "next_draws": cfg.columns.next_draws,
            # AdvPrompt's features of a kind not completed are missing slots
            "advprompt_kinds": list(cfg.columns.advprompt_kinds)}


# settings a card made before they were recorded was made with (its defaults then)
UNRECORDED = {"advprompt_kinds": list(ADVPROMPT_KINDS)}


def run_audit(cfg: AuditConfig, console: Console | None = None, card_only: bool = False) -> Path:
    """Run (or resume) an audit; returns its directory (report.json, report.md, report.html).
    ``card_only``: stop once the detector card is built (`leakray card build`)."""
    from leakray.protocols.engine import open_run, stage_runner, time_line, broken_references_line
    from leakray.report.audit import write_audit_report

    console = console or Console()
    t_start, cpu_start = time.perf_counter(), machine_cpu()
    tasks = load_tasks(cfg)
    isolation = preflight_isolation(cfg)
    if cfg.audit.corpus:  # a corpus that cannot be screened is refused now, not after the fine-tunes
        from leakray.screen.corpus import screenable_plan
        from leakray.screen.index import ScreenConfig

        screenable_plan(cfg.audit.corpus, ScreenConfig().max_file_bytes, ScreenConfig().max_parse_bytes)
    card = cfg.audit.card
    card_dir = (local_copy(card) if is_uri(card) else Path(card).expanduser().resolve()) if card else None
    card_id = DetectorCard(card_dir).id if card_dir else None
    digest = tasks_digest = content_hash([[t[T.TASK_ID], t[T.PROMPT], t[T.REFERENCE], t[T.TESTS]] for t in tasks])
    control_digest = None
    if cfg.audit.control and not card_only:  # read before any work: a bad control set fails now, not hours later
        from leakray.protocols.control_scores import load_control

        control, _ = load_control(cfg.audit.control, tasks)
        # the run is keyed by the control set's content too: another file at the same path is another audit
        control_rows = [[t[T.TASK_ID], t[T.PROMPT], t[T.REFERENCE]] for t in control]
        digest, control_digest = content_hash(digest, control_rows), content_hash(control_rows)
    if card_only:  # a card depends on the shadow's side only: the same card serves any target
        if card_dir:
            raise BadInput("card build makes a card; it cannot reuse one", field="audit.card")
        name = card_run_name(cfg, digest)
    else:
        name = f"audit-{cfg.benchmark.name}-{content_hash(cfg.hashed(), digest, card_id)}"
    store = open_run(cfg, name, len(tasks), console, label="audit directory")
    run_dir = store.local
    if warning := broken_references_line(tasks):  # said once the run's log exists: it goes there too
        console.warn(warning)
    if card_dir:
        card = DetectorCard(card_dir)
        console.say(f"reusing detector card {card.id} ({card_dir}): no shadow fine-tuning")
        for line in card_mismatches(card, cfg, tasks):
            console.warn(line)
    if cfg.sample.backend == "openai" and not card_only and not (run_dir / "collect_target" / MARKER).exists():
        from leakray.protocols.audit_plan import check_budget

        check_budget(cfg, tasks, console)  # what it will ask, before it asks; over audit.max_requests: refused
        check_endpoint(cfg, console)  # a wrong URL, model name or key: refused now, not after the card
    runner = stage_runner(cfg, store, console)
    keys = audit_keys(cfg, tasks_digest, card_id, control_digest)
    runner.run(with_keys(audit_stages(cfg, tasks, runner, isolation, card_dir, card_only), keys))
    card = DetectorCard(card_dir or runner.dir("card"))
    if card_only:
        store.close()
        console.say(f"detector card {card.id}: {store.location}/card (reuse it: leakray audit --card {card.path})")
        console.say(time_line({n: runner.info[n] for n in runner.ran}, time.perf_counter() - t_start,
                              machine_use(cpu_start, machine_cpu())))
        return card.path
    report = write_audit_report(run_dir, cfg, tasks, card, isolation,
                                {"total_this_invocation": round(time.perf_counter() - t_start, 1)})
    store.close()
    lf = report["summary"]["leaked_fraction"]
    if lf["estimate"] is None:
        console.warn(lf["statement"])
    else:
        console.say(f"leaked fraction {lf['estimate']:.1%} (95% CI {_pct(lf['ci'][0])}–{_pct(lf['ci'][1])}, "
                    f"{lf['route']} route); verdicts {report['summary']['verdicts']}"
                    + (f"; {lf['caveat']}" if lf.get("caveat") else ""))
    console.say(f"report: {store.location}/report.html")
    console.say(time_line({n: runner.info[n] for n in runner.ran}, time.perf_counter() - t_start,
                          machine_use(cpu_start, machine_cpu())))
    return run_dir


def card_mismatches(card: DetectorCard, cfg: AuditConfig, tasks: list[dict]) -> list[str]:
    """What differs between how a card was made and this audit: the benchmark's tasks (by their
    content where the card recorded it: a benchmark under another label is the same benchmark, and
    another file under the same name is not) and the collection settings."""
    out = []
    made_on = card.meta["benchmark"]
    name = made_on["name"]
    if made_on.get("digest") is not None and tasks:
        if made_on["digest"] != _tasks_digest(tasks):
            out.append(f"the card was built on {'other tasks of ' if name == cfg.benchmark.name else ''}{name} "
                       f"({made_on.get('n_tasks', '?')} tasks; this audit has {len(tasks)} of {cfg.benchmark.name}): "
                       "its calibration transfers only as far as the benchmarks resemble each other")
    elif name != cfg.benchmark.name:
        out.append(f"the card was built on {name}, not {cfg.benchmark.name}: "
                   "its calibration transfers only as far as the benchmarks resemble each other")
    mine, theirs = collection_settings(cfg, target_reference(cfg)), card.meta.get("collection", {})
    differ = sorted(k for k in mine if theirs.get(k, UNRECORDED.get(k)) != mine[k])
    if differ:
        out.append(f"collection settings differ from the card's ({', '.join(differ)}): features may shift")
    return out


def _pct(v) -> str:
    return "–" if v is None else f"{v:.1%}"





