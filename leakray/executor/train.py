"""Fine-tuning on Ray Train: `models.finetune` inside a TorchTrainer worker group."""

from __future__ import annotations

import functools
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
               cpus: int, out_dir: str | Path | None = None) -> dict:
    """Run ``loop(config)`` on a TorchTrainer worker group; rank 0's return value comes back.

    ``out_dir``: what rank 0 writes (a model). Rank 0 may run on another node: when the run is
    mirrored to shared storage, it publishes the directory there and the driver fetches it."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from leakray.storage import fetch_dir, ray_storage, shared_dir

    publish = None
    if out_dir is not None:
        remote, filesystem = shared_dir(out_dir)
        if filesystem is not None:
            publish = {"remote": remote, "fs": filesystem, "local": str(Path(out_dir).resolve()),
                       "driver_node": _driver_node()}
    trainer = TorchTrainer(
        functools.partial(_run_then_publish, loop) if publish else loop,
        train_loop_config={**config, "_publish": publish} if publish else config,
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, resources_per_worker={"CPU": cpus}),
        run_config=RunConfig(name=name, **ray_storage(storage)),
    )
    # Train V2 keeps no metrics reported without a checkpoint: rank 0's return value carries them.
    out = trainer.fit().return_value
    if publish and isinstance(out, dict) and out.pop("_published", False):
        fetch_dir(publish["remote"], publish["fs"], publish["local"])
    return out


def _driver_node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _run_then_publish(loop, config: dict):
    """`loop`, then rank 0 copies its output to shared storage when it ran on another node than
    the driver (on the driver's node the file is already where the driver reads it)."""
    import ray
    import ray.train

    from leakray.storage import publish_dir

    publish = config.pop("_publish")
    out = loop(config)
    if ray.train.get_context().get_world_rank() == 0 and \
            ray.get_runtime_context().get_node_id() != publish["driver_node"]:
        publish_dir(publish["local"], publish["fs"], publish["remote"])
        out = {**out, "_published": True}
    return out


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
                      cpus=max(1, cfg.threads), out_dir=out_dir)
