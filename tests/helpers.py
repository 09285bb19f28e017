"""Utilities shared by the tests: run a script's real CLI, read TensorBoard files back,
check a trained agent against a probe's expected outcomes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# The rendering variables as the test session found them: in-process runs set MUJOCO_GL
# for the pytest process, and a CLI run must choose its backend as a user's run would.
GL_VARIABLES = {name: os.environ.get(name) for name in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}


def script_env(extra: dict | None = None) -> dict:
    """os.environ with the session's own rendering and MKL variables, unbuffered output, and ``extra``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if env.pop("TESTS_MKL_CBWR_FROM_CONFTEST", None):  # conftest's MKL mode, not the session's: each script sets its own
        env.pop("MKL_CBWR", None)
    for name, value in GL_VARIABLES.items():
        env.pop(name, None)
        if value is not None:
            env[name] = value
    return {**env, **(extra or {})}


def run_cli(
    script: str,
    args: Sequence[str],
    cwd: Path | str | None = None,
    timeout: float = 600,
    script_dir: Path = ROOT,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run ``python <script_dir>/<script> <args>`` as a user would; return the finished process."""
    return subprocess.run(
        [sys.executable, str(Path(script_dir) / script), *args],
        cwd=cwd,
        env=script_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_interruptible(cmd: Sequence[str], env: dict | None = None, **popen_kwargs) -> subprocess.Popen:
    """Popen a training run that a test will SIGINT. A shell without job control starts
    background jobs (`make test &`, `nohup ...`) with SIGINT ignored, and Python keeps it
    ignored; the child gets the default handler back so Ctrl-C reaches it as a user's would."""
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=script_env(env),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **popen_kwargs,
    )


def wait_for_iteration(
    proc: subprocess.Popen, output_dir: Path | str, name: str, iteration: int, timeout: float = 300
) -> None:
    """Wait until the run under ``output_dir`` has saved ``<name>_last.pt`` at ``iteration`` or later. The console
    prints a line only every 5% of a run in a pipe, so the checkpoint (replaced atomically) is the clock."""
    import torch

    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        for path in Path(output_dir).glob(f"*/{name}_last.pt"):
            try:
                if torch.load(path, weights_only=True)["iteration"] >= iteration:
                    return
            except (OSError, RuntimeError, EOFError):  # replaced while we read it
                pass
        time.sleep(0.05)
    raise AssertionError(f"{name} did not reach iteration {iteration} (exit code {proc.poll()})")


def single_run_dir(output_dir: Path | str) -> Path:
    """The one run directory a single training run created under ``output_dir``."""
    dirs = [d for d in Path(output_dir).iterdir() if d.is_dir()]
    assert len(dirs) == 1, f"expected one run directory under {output_dir}, found {dirs}"
    return dirs[0]


def read_scalars(run_dir: Path | str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files of ``run_dir``: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def check_probe(
    env_id: str,
    gamma: float,
    value_fn: Callable[[np.ndarray], np.ndarray],
    action_fn: Callable[[np.ndarray], np.ndarray],
    policy_return_fn: Callable[[float], float],
    value_tol: float,
    action_tol: float,
) -> None:
    """Assert a trained agent matches ``probe_envs.expected_outcomes(env_id, gamma)``.

    value_fn / action_fn map raw observations ``(n, 1)`` to values ``(n,)`` and
    deterministic actions ``(n,)`` (discrete index or continuous value).
    policy_return_fn(obs) is the stochastic policy's expected reward from that
    observation, the target of the value where the table says ``None``.
    """
    import probe_envs

    for check in probe_envs.expected_outcomes(env_id, gamma):
        obs = np.array([[check.obs]], dtype=np.float32)
        value = float(np.asarray(value_fn(obs)).reshape(-1)[0])
        target = policy_return_fn(check.obs) if check.value is None else check.value
        assert abs(value - target) < value_tol, f"{env_id}: V({check.obs}) = {value:.4f}, expected {target:.4f} ± {value_tol}"
        if check.action is not None:
            action = float(np.asarray(action_fn(obs)).reshape(-1)[0])
            assert abs(action - check.action) <= action_tol, (
                f"{env_id}: action at obs {check.obs} = {action:.4f}, expected {check.action} ± {action_tol}"
            )
