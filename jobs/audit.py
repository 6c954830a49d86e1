"""Entry point for `ray job submit --working-dir . -- python jobs/audit.py [--target M] [--card DIR] [--set k=v]`.

Inside a submitted job RAY_ADDRESS points at the cluster, so the pipeline joins it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the uploaded working dir

from leakray.cli import main

if __name__ == "__main__":
    sys.exit(main(["audit", *sys.argv[1:]]))
