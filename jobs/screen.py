"""`ray job submit --working-dir . -- python jobs/screen.py --benchmark NAME=PATH ... --corpus ... --output DIR`

Same arguments as `leakray screen`; inside a job, Ray joins the cluster through RAY_ADDRESS."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the working dir

from leakray.commands.screen import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
