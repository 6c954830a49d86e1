"""Fine-tuning on Ray Train: `models.finetune` inside a TorchTrainer worker group."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from leakray.models.finetune import FinetuneConfig


def worker_hooks() -> dict:
    """Inside a Train worker: rank 0 shows progress and writes; DDP wrapping only with several workers."""
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    distributed = ctx.get_world_size() > 1
    return {"progress": ctx.get_world_rank() == 0, "is_writer": ctx.get_world_rank() == 0,
            "wrap_model": ray.train.torch.prepare_model if distributed else None,
            "wrap_loader": ray.train.torch.prepare_data_loader if distributed else None}


def fit_on_ray(loop, config: dict, *, name: str, storage: str | Path, num_workers: int, use_gpu: bool,
               cpus: int) -> dict:
    """Run ``loop(config)`` on a TorchTrainer worker group; rank 0's return value comes back."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        loop, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, resources_per_worker={"CPU": cpus}),
        run_config=RunConfig(name=name, storage_path=str(Path(storage).resolve())),
    )
    # Train V2 keeps no metrics reported without a checkpoint: rank 0's return value carries them.
    return trainer.fit().return_value


def _loop(config: dict) -> dict:
    from leakray.models.finetune import finetune

    return finetune(config["base"], config["texts"], FinetuneConfig(**config["finetune"]), config["out_dir"],
                    desc=config["desc"], **worker_hooks())


def finetune_on_ray(base: str | Path, texts: list[str], cfg: FinetuneConfig, out_dir: str | Path, *,
                    name: str, storage: str | Path, num_workers: int = 1, use_gpu: bool = False) -> dict:
    """Fine-tune on a Ray Train worker group; rank 0 saves the model and its stats come back."""
    config = {"base": str(base), "texts": list(texts), "finetune": asdict(cfg),
              "out_dir": str(Path(out_dir).resolve()), "desc": f"finetune {name}"}
    return fit_on_ray(_loop, config, name=name, storage=storage, num_workers=num_workers, use_gpu=use_gpu,
                      cpus=max(1, cfg.threads))
