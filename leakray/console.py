"""What a run prints: one summary line per stage, warnings that matter, the report path.

Everything else (Ray's and the workers' logs, INFO records) goes to `<run>/logs/`; `--verbose`
brings it back to the console."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

LOG = logging.getLogger("leakray.console")  # the run's log file only: the console gets print()
LOG.propagate = False
# Loggers that flood a console at INFO: quiet unless --verbose, always kept in the run's log file.
NOISY = ("ray", "ray.data", "ray.train", "ray.tune", "ray.air", "transformers", "datasets", "codebleu")


class Console:
    def __init__(self, verbose: bool = False, stream=None):
        self.verbose = verbose
        self.stream = stream or sys.stdout

    def say(self, msg: str) -> None:
        print(f"[leakray] {msg}", file=self.stream, flush=True)
        LOG.info(msg)

    def warn(self, msg: str) -> None:
        print(f"[leakray] WARNING: {msg}", file=self.stream, flush=True)
        LOG.warning(msg)

    def progress(self, name: str, line: str) -> None:
        """A running stage's progress (`leakray.progress`), in the stage lines' columns."""
        self.say(f"{name:<15} {'running':>11}  {line}")

    def stage(self, name: str, info: dict, summary: str, cached: bool | str) -> None:
        """One line per stage; ``cached``: True (done by an earlier invocation), "reused" (adopted
        from another run now), False (run now)."""
        when = "reused" if cached == "reused" else "done before" if cached else f"{info.get('seconds', 0):.1f} s"
        self.say(f"{name:<15} {when:>11}  {summary}".rstrip())
        errors = {k: v for k, v in (info.get("errors") or {}).items() if v and any(w in k for w in SERIOUS)}
        if errors and not cached:
            self.warn(f"{name}: {errors} (rows in {name}/errors.parquet; counts in {name}/_DONE.json)")


# Row notes worth a console line: lost rows, cut inputs, unscorable references.
SERIOUS = ("failed", "truncated", "too_long", "unscorable")


def setup_logging(log_dir: Path, verbose: bool) -> Path:
    """INFO and up from every logger into `log_dir/leakray.log`; the console only sees WARNING
    (INFO with --verbose)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / "leakray.log"
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_leakray", False):
            root.removeHandler(h)
    fh = logging.FileHandler(path)
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    fh.setLevel(logging.INFO)
    fh._leakray = True
    ch = logging.StreamHandler(sys.stderr)
    ch.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    ch.setLevel(logging.INFO if verbose else logging.WARNING)
    ch._leakray = True
    root.addHandler(fh)
    root.addHandler(ch)
    root.setLevel(logging.INFO)
    for h in list(LOG.handlers):
        LOG.removeHandler(h)
    LOG.addHandler(fh)
    LOG.setLevel(logging.INFO)
    logging.captureWarnings(True)  # library warnings (sklearn convergence, ...) into the file
    warnings_log = logging.getLogger("py.warnings")
    warnings_log.propagate = verbose
    warnings_log.addHandler(fh)
    if not verbose:
        # say-once notices that would read as problems on a quiet console
        logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name in NOISY:
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        if not logger.propagate:  # Ray's loggers keep their own console handlers
            logger.addHandler(fh)
            for h in logger.handlers:
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                    h.setLevel(logging.INFO if verbose else logging.WARNING)
    return path
