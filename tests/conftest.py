"""Shared test set-up: the repository root on sys.path, headless MuJoCo rendering."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MUJOCO_GL", "osmesa")
os.environ.setdefault("WANDB_MODE", "offline")
