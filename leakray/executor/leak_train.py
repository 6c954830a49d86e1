"""The `pretrain-mix` leak on the cluster: the mixture is built once in the driver, then
`leak.pretrain.continue_pretrain` runs inside a TorchTrainer worker group, or one Ray task where
Ray Train would add only its start-up (`executor.train.use_ray_train`)."""

from __future__ import annotations

import threading
from dataclasses import asdict
from pathlib import Path

from leakray.leak.mixture import MixConfig, build_mixture
from leakray.executor.train import fit_on_ray, use_ray_train, worker_hooks
from leakray.runs import write_json_atomic


def _loop(config: dict) -> dict:
    from leakray.leak.pretrain import continue_pretrain

    return continue_pretrain(config["base"], config["sequences"], MixConfig(**config["mix"]), config["out_dir"],
                             member_token_share=config["member_token_share"], desc=config["desc"],
                             progress_file=config.get("progress_file"), **worker_hooks(config))


# the target's and the shadow's pretraining run side by side in two threads (runs.Together), and
# transformers resolves its lazy attributes without a lock: a dose sweep's shadow failed with
# "cannot import name 'AutoTokenizer' from 'transformers'" while the target's thread imported it
_IMPORT_LOCK = threading.Lock()


def pretrain_mix_on_ray(base_path: str | Path, corpus_texts: list[str], member_texts: list[str], cfg: MixConfig,
                        out_dir: str | Path, *, name: str, storage: str | Path, num_workers: int = 1,
                        use_gpu: bool = False, ray_train: bool | str = "auto",
                        progress_to: str | Path | None = None) -> dict:
    """Continue pretraining `base_path` on clean text + each member `cfg.dose` times; rank 0 saves
    the model to `out_dir` (with `mixture.json`: where each member copy sits) and stats come back.
    ``progress_to``: the stage directory whose progress lines count its steps (`leakray.progress`)."""
    from leakray.progress import PROGRESS_FILE

    with _IMPORT_LOCK:
        from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_path)
    mix = build_mixture(tok, corpus_texts, member_texts, cfg.dose, cfg.n_tokens, cfg.seq_len, cfg.seed)
    out_dir = Path(out_dir).resolve()
    config = {"base": str(base_path), "sequences": mix.sequences, "mix": asdict(cfg), "out_dir": str(out_dir),
              "member_token_share": mix.member_token_share, "desc": f"pretrain-mix {name}",
              "progress_file": None if progress_to is None else str(Path(progress_to).resolve() / PROGRESS_FILE)}
    stats = fit_on_ray(_loop, config, name=name, storage=storage, num_workers=num_workers, use_gpu=use_gpu,
                       cpus=max(1, cfg.threads), out_dir=out_dir,
                       ray_train=use_ray_train(ray_train, num_workers, use_gpu))
    summary = mix.summary()
    write_json_atomic(out_dir / "mixture.json", {**summary, "occurrences": mix.occurrences})
    return {**stats, "dose": cfg.dose, "member_token_share": mix.member_token_share, "n_tokens": mix.n_tokens,
            "n_members": len(member_texts), "mixture": summary}
