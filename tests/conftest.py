"""Shared test set-up: the repository root on sys.path, wandb offline, MKL's strict mode.

The scripts choose MuJoCo's GL backend themselves (the user's MUJOCO_GL wins); in-process
runs set it for this process, so `helpers.script_env` gives each CLI run the environment
the test session started with.

In-process runs (`module.train(args)`) use the MKL mode each script's command line sets
(`MKL_CBWR=AUTO,STRICT`, set here before any matrix product, as an importer must), so an
in-process run repeats a CLI run to the bit (a resumed Ctrl-C run, say); CLI runs get the
session's own MKL_CBWR back from `helpers.script_env`, so each script sets its own.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WANDB_MODE", "offline")
if "MKL_CBWR" not in os.environ:
    os.environ["MKL_CBWR"] = "AUTO,STRICT"
    os.environ["TESTS_MKL_CBWR_FROM_CONFTEST"] = "1"
