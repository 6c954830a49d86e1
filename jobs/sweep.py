"""Entry point for `ray job submit --working-dir . -- python jobs/sweep.py SWEEP.yaml [--set k=v] [--quick]`.

Inside a submitted job RAY_ADDRESS points at the cluster, so every cell joins it. A relative
sweep output_dir lands under $LEAKRAY_HOME (default ~/leakray) on the driver's node, not in
Ray's temporary copy of the working dir; the catalog's path is printed at the end."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the uploaded working dir

from leakray.cli import main

if __name__ == "__main__":
    sys.exit(main(["sweep", *sys.argv[1:]]))
