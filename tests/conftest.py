"""Shared test set-up: the repository root on sys.path, wandb offline.

The scripts choose MuJoCo's GL backend themselves (the user's MUJOCO_GL wins); in-process
runs set it for this process, so `helpers.script_env` gives each CLI run the environment
the test session started with.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WANDB_MODE", "offline")
