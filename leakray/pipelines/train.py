"""Fine-tuning on Ray Train: `models.finetune` inside a TorchTrainer worker group."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from leakray.models.finetune import FinetuneConfig


def _loop(config: dict) -> dict:
    import ray.train
    import ray.train.torch

    from leakray.models.finetune import finetune

    ctx = ray.train.get_context()
    distributed = ctx.get_world_size() > 1
    return finetune(
        config["base"], config["texts"], FinetuneConfig(**config["finetune"]), config["out_dir"],
        progress=ctx.get_world_rank() == 0, is_writer=ctx.get_world_rank() == 0,
        wrap_model=ray.train.torch.prepare_model if distributed else None,
        wrap_loader=ray.train.torch.prepare_data_loader if distributed else None,
        desc=config["desc"],
    )


def finetune_on_ray(base: str | Path, texts: list[str], cfg: FinetuneConfig, out_dir: str | Path, *,
                    name: str, storage: str | Path, num_workers: int = 1, use_gpu: bool = False) -> dict:
    """Fine-tune on a Ray Train worker group; rank 0 saves the model and its stats come back."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        _loop,
        train_loop_config={"base": str(base), "texts": list(texts), "finetune": asdict(cfg),
                           "out_dir": str(Path(out_dir).resolve()), "desc": f"finetune {name}"},
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                     resources_per_worker={"CPU": max(1, cfg.threads)}),
        run_config=RunConfig(name=name, storage_path=str(Path(storage).resolve())),
    )
    # Train V2 keeps no metrics reported without a checkpoint: rank 0's return value carries them.
    return trainer.fit().return_value
