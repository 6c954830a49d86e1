"""Fine-tuning on the cluster: `models.finetune` inside a TorchTrainer worker group, or, where
Ray Train would only add its start-up (one CPU worker), inside one Ray task.

A Train run places its workers on GPUs and spreads data parallelism over several; for a single
CPU worker it buys neither, and its start-up (controller, worker group, process group: 17-24 s on
a quiet 2-core host, 60-70 s on a busy one, `benchmarks/bench_ray_train.py`) is most of a small
fine-tune. Both paths run the same loop on a cluster node and publish what rank 0 wrote."""

from __future__ import annotations

import functools
from dataclasses import asdict
from pathlib import Path

from leakray.models.finetune import FinetuneConfig


TASK = "_in_task"  # set in a loop's config when it runs as a plain Ray task
USE_GPU = "_use_gpu"  # and whether that task holds a GPU (it trains there)


def use_ray_train(setting: bool | str, num_workers: int, use_gpu: bool) -> bool:
    """``ray.train_runs`` resolved: "auto" is Ray Train exactly where it places or spreads work."""
    return (use_gpu or num_workers > 1) if setting == "auto" else bool(setting)


def worker_hooks(config: dict | None = None) -> dict:
    """Inside a Train worker: rank 0 shows progress and writes; DDP wrapping only with several
    workers. In a plain Ray task (``config[TASK]``): the one process shows progress and writes.

    ``device`` is where the loop trains. It is named, not left to ``prepare_model``: a single
    worker is not wrapped (DDP buys nothing there), and the model stayed on the CPU it was
    loaded on, a GPU reserved and idle beside it."""
    if config and config.get(TASK):
        return {"progress": True, "is_writer": True, "wrap_model": None, "wrap_loader": None,
                "device": "cuda" if config.get(USE_GPU) else "cpu"}  # Ray shows a task only its own GPU
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    distributed = ctx.get_world_size() > 1
    return {"progress": ctx.get_world_rank() == 0, "is_writer": ctx.get_world_rank() == 0,
            "wrap_model": ray.train.torch.prepare_model if distributed else None,
            "wrap_loader": ray.train.torch.prepare_data_loader if distributed else None,
            "device": str(ray.train.torch.get_device())}


def fit_on_ray(loop, config: dict, *, name: str, storage: str | Path, num_workers: int, use_gpu: bool,
               cpus: int, out_dir: str | Path | None = None, ray_train: bool = True) -> dict:
    """Run ``loop(config)`` on a TorchTrainer worker group (``ray_train``) or as one Ray task;
    rank 0's return value comes back.

    ``out_dir``: what rank 0 writes (a model). Rank 0 may run on another node: when the run is
    mirrored to shared storage, it publishes the directory there and the driver fetches it."""
    from leakray.storage import fetch_dir, ray_storage, shared_dir

    if not ray_train and num_workers != 1:
        raise ValueError(f"{num_workers} workers need Ray Train (data parallel); a Ray task is one process")

    publish = None
    if out_dir is not None:
        remote, filesystem = shared_dir(out_dir)
        if filesystem is not None:
            publish = {"remote": remote, "fs": filesystem, "local": str(Path(out_dir).resolve()),
                       "driver_node": _driver_node()}
    if ray_train:
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        trainer = TorchTrainer(
            functools.partial(_run_then_publish, loop) if publish else loop,
            train_loop_config={**config, "_publish": publish} if publish else config,
            scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                         resources_per_worker={"CPU": cpus}),
            run_config=RunConfig(name=name, **ray_storage(storage)),
        )
        # Train V2 keeps no metrics reported without a checkpoint: rank 0's return value carries them.
        out = trainer.fit().return_value
    else:
        import ray

        task = ray.remote(num_cpus=cpus, num_gpus=1 if use_gpu else 0, max_retries=0)(_run_then_publish)
        out = ray.get(task.options(name=name).remote(loop, {**config, TASK: True, USE_GPU: use_gpu,
                                                               "_publish": publish}))
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

    from leakray.storage import publish_dir

    publish = config.pop("_publish")
    out = loop(config)
    if publish is None:  # a Ray task on an unmirrored run: the driver reads the directory itself
        return out
    if not config.get(TASK):
        import ray.train

        if ray.train.get_context().get_world_rank() != 0:
            return out
    if ray.get_runtime_context().get_node_id() != publish["driver_node"]:
        publish_dir(publish["local"], publish["fs"], publish["remote"])
        out = {**out, "_published": True}
    return out


def _loop(config: dict) -> dict:
    from leakray.models.finetune import finetune

    return finetune(config["base"], config["texts"], FinetuneConfig(**config["finetune"]), config["out_dir"],
                    desc=config["desc"], progress_file=config.get("progress_file"), **worker_hooks(config))


def finetune_on_ray(base: str | Path, texts: list[str], cfg: FinetuneConfig, out_dir: str | Path, *,
                    name: str, storage: str | Path, num_workers: int = 1, use_gpu: bool = False,
                    ray_train: bool | str = "auto", progress_to: str | Path | None = None) -> dict:
    """Fine-tune on a Ray Train worker group (or one Ray task: ``use_ray_train``); rank 0 saves
    the model and its stats come back. ``progress_to``: the stage directory whose progress lines
    count its steps (`leakray.progress`)."""
    from leakray.progress import PROGRESS_FILE

    config = {"base": str(base), "texts": list(texts), "finetune": asdict(cfg),
              "out_dir": str(Path(out_dir).resolve()), "desc": f"finetune {name}",
              "progress_file": None if progress_to is None else str(Path(progress_to).resolve() / PROGRESS_FILE)}
    return fit_on_ray(_loop, config, name=name, storage=storage, num_workers=num_workers, use_gpu=use_gpu,
                      cpus=max(1, cfg.threads), out_dir=out_dir,
                      ray_train=use_ray_train(ray_train, num_workers, use_gpu))
