"""What the three scripts promise alike, checked once for each script.

Bad checkpoints, output directories and video requests end in one line; resume extends a run
to a new total; Ctrl-C keeps the last trained step; video works on classic-control envs; a
machine without any GL library still trains, and says what to install when asked for video.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import imageio
import numpy as np
import pytest
import torch
import tyro

from tests.helpers import ROOT, read_scalars, run_cli, script_env, single_run_dir, start_interruptible, wait_for_iteration

# Per script: a cheap env it accepts, its tiny-run flags (rollout of BATCH steps), a probe it accepts.
BATCH = 128
SCRIPTS = {
    "ppo_discrete": dict(
        env="CartPole-v1",
        probe="Probe1Discrete-v0",
        tiny=["--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "1"],
    ),
    "ppo_continuous": dict(
        env="Pendulum-v1",
        probe="Probe1Continuous-v0",
        tiny=["--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "1"],
    ),
    "vmpo_continuous": dict(
        env="Pendulum-v1",
        probe="Probe1Continuous-v0",
        tiny=[
            "--num-envs",
            "2",
            "--num-steps",
            "64",
            "--m-steps",
            "2",
            "--policy-hidden-sizes",
            "32",
            "32",
            "--value-hidden-sizes",
            "32",
            "32",
        ],
    ),
}
NAMES = list(SCRIPTS)


def tiny_cli(name: str, *extra: str, env: str | None = None) -> list[str]:
    return ["--env-id", env or SCRIPTS[name]["env"], *SCRIPTS[name]["tiny"], "--eval-episodes", "1", "--no-cuda", *extra]


def train(name: str, *cli: str) -> dict:
    """The script's own `train`, in this process, with arguments parsed as its command line parses them."""
    module = importlib.import_module(name)
    return module.train(tyro.cli(module.Args, args=list(cli)))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A real `_last.pt` of each script (128 steps, resumable)."""
    out = tmp_path_factory.mktemp("checkpoints")
    paths = {}
    for name in NAMES:
        result = train(
            name, *tiny_cli(name, "--total-timesteps", str(BATCH), "--eval-interval", "0", "--output-dir", str(out / name))
        )
        paths[name] = Path(result["run_dir"]) / f"{name}_last.pt"
    return paths


def one_error_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return lines[0]


# ---------------------------------------------------------------------------------
# Checkpoints that are not this script's: one line, no torch advice
# ---------------------------------------------------------------------------------


def bad_checkpoint(kind: str, name: str, checkpoints: dict[str, Path], tmp_path: Path) -> tuple[Path, str]:
    """A file of the given kind and the words the error must contain."""
    path = tmp_path / f"{kind}.pt"
    if kind == "garbage":
        path.write_bytes(b"this is not a checkpoint\n" * 10)
        return path, "is not a readable checkpoint"
    if kind == "truncated":
        data = checkpoints[name].read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return path, "is not a readable checkpoint"
    if kind in ("no-args", "nan-weight"):  # this script's own, but without its options, or with a weight gone NaN
        ckpt = torch.load(checkpoints[name], weights_only=True)
        if kind == "no-args":
            del ckpt["args"]
        else:
            next(iter(ckpt["agent"].values())).view(-1)[0] = math.nan
        torch.save(ckpt, path)
        return path, "has no saved options ('args')" if kind == "no-args" else "holds NaN or inf values"
    if kind == "other-version":  # an option this version lacks (an older one had it), and one of its own missing
        ckpt = torch.load(checkpoints[name], weights_only=True)
        del ckpt["args"]["gamma"]
        torch.save(ckpt | {"args": ckpt["args"] | {"optimizer": "sgd"}}, path)
        return path, f"was written by a {name}.py with other options (--gamma, --optimizer; see CHANGELOG.md)"
    other = NAMES[(NAMES.index(name) + 1) % len(NAMES)]
    path.write_bytes(checkpoints[other].read_bytes())
    return path, f"was written by {other}.py, not {name}.py"


@pytest.mark.parametrize("kind", ["garbage", "truncated", "other-script", "other-version", "no-args", "nan-weight"])
@pytest.mark.parametrize("flag", ["--checkpoint", "--resume"])
@pytest.mark.parametrize("name", NAMES)
def test_a_checkpoint_that_is_not_this_scripts_is_one_clear_error(name, flag, kind, checkpoints, tmp_path):
    path, words = bad_checkpoint(kind, name, checkpoints, tmp_path)
    mode = ["--eval-only", "--checkpoint", str(path)] if flag == "--checkpoint" else ["--resume", str(path)]
    module = importlib.import_module(name)
    with pytest.raises(module.ConfigError) as err:
        train(name, *tiny_cli(name, *mode, "--output-dir", str(tmp_path / "runs")))
    message = str(err.value)
    assert f"{flag} {str(path)!r}" in message and words in message, message
    assert "weights_only" not in message and "\n" not in message
    assert not (tmp_path / "runs").exists()  # rejected before any work


@pytest.mark.parametrize("kind,mode", [("garbage", "--resume"), ("no-args", "--resume"), ("nan-weight", "--resume"),
                                       ("nan-weight", "--eval-only")])  # fmt: skip
@pytest.mark.parametrize("name", NAMES)
def test_bad_checkpoint_on_the_command_line_is_one_line_and_exit_1(name, kind, mode, checkpoints, tmp_path):
    """A NaN weight is refused before any work: it is neither evaluated nor trained, nor saved again as `_last.pt`."""
    path, words = bad_checkpoint(kind, name, checkpoints, tmp_path)
    flags = ["--eval-only", "--checkpoint", str(path)] if mode == "--eval-only" else ["--resume", str(path)]
    line = one_error_line(run_cli(f"{name}.py", [*flags, "--no-cuda", "--output-dir", str(tmp_path / "runs")]))
    assert words in line and "weights_only" not in line
    assert not (tmp_path / "runs").exists()


def bad_inputs() -> list:
    """(script, flags, extra environment, the start of its one line), for every script that has the flags."""
    cases = [
        (["--seed", "-1"], {}, "--seed must be in [0, 2**32) (numpy's seeds), got -1"),
        (["--seed", "4294967296"], {}, "--seed must be in [0, 2**32) (numpy's seeds), got 4294967296"),
        (["--eval-episodes", "1000000000"], {}, "--eval-episodes must be in [1, 1000] (one env each), got 1000000000"),
        (["--output-dir", "/sys/kernel"], {}, "--output-dir '/sys/kernel' cannot be created or written ("),
        (["--env-id", "dm_control/cartpole/balance"], {"MUJOCO_GL": "nonsense"}, "dm_control does not import with "),
        (["--ent-coef", "-1"], {}, "--ent-coef must be >= 0, got -1.0"),
        (["--vf-coef", "-1"], {}, "--vf-coef must be >= 0, got -1.0"),
        (["--target-kl", "-1"], {}, "--target-kl must be > 0 (or left unset), got -1.0"),
    ]
    fields = {name: {f.name for f in dataclasses.fields(importlib.import_module(name).Args)} for name in NAMES}
    return [(name, *case) for name in NAMES for case in cases if case[0][0][2:].replace("-", "_") in fields[name]]


@pytest.mark.parametrize("name,flags,env,message", bad_inputs())
def test_a_bad_input_on_the_command_line_is_one_line_before_any_work(name, flags, env, message, tmp_path):
    proc = run_cli(f"{name}.py", tiny_cli(name, "--output-dir", str(tmp_path / "runs"), *flags), env=env)
    assert one_error_line(proc).startswith(f"error: {message}")
    assert not list(tmp_path.glob("runs/*"))  # no run directory


@pytest.mark.parametrize("name", NAMES)
def test_a_learning_rate_that_sends_the_weights_to_nan_stops_in_one_line_under_either_family(name, tmp_path):
    """Pendulum trains the Beta under `--policy auto`, whose NaN concentrations torch.distributions would refuse."""
    lr = "--policy-lr" if name == "vmpo_continuous" else "--learning-rate"
    proc = run_cli(f"{name}.py", tiny_cli(name, "--total-timesteps", str(2 * BATCH), lr, "inf", "--output-dir", str(tmp_path)))
    last = single_run_dir(tmp_path) / f"{name}_last.pt"
    line = one_error_line(proc)
    assert line.startswith("error: non-finite ") and line.endswith(
        f"at global step {BATCH}; stopped. Last good checkpoint: {last} (step 0)"
    )


# ---------------------------------------------------------------------------------
# Output directory, video
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["proc", "under-a-file"])
@pytest.mark.parametrize("name", NAMES)
def test_an_output_dir_that_cannot_be_created_is_one_clear_error(name, where, tmp_path):
    if where == "proc":
        output_dir, reason = "/proc/no-such-dir/runs", "No such file or directory"
    else:
        (tmp_path / "a-file").write_text("")
        output_dir, reason = str(tmp_path / "a-file" / "runs"), "Not a directory"
    module = importlib.import_module(name)
    with pytest.raises(module.ConfigError, match=rf"--output-dir '{output_dir}' cannot be created or written \({reason}\)"):
        train(name, *tiny_cli(name, "--total-timesteps", str(BATCH), "--output-dir", output_dir))


@pytest.mark.parametrize("name", NAMES)
def test_video_of_an_env_that_cannot_render_is_one_clear_error(name, tmp_path):
    module = importlib.import_module(name)
    probe = SCRIPTS[name]["probe"]
    with pytest.raises(module.ConfigError, match=rf"--capture-video: {probe} cannot render"):
        train(name, *tiny_cli(name, "--capture-video", "--output-dir", str(tmp_path / "runs"), env=probe))
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", NAMES)
def test_video_of_a_classic_control_env(name, tmp_path):
    """CartPole-v1 (discrete) and Pendulum-v1 (continuous) render through pygame."""
    proc = run_cli(
        f"{name}.py",
        tiny_cli(
            name, "--total-timesteps", str(BATCH), "--eval-interval", "0", "--capture-video", "--output-dir", str(tmp_path)
        ),
        env={"XDG_RUNTIME_DIR": ""},  # as on a machine without a desktop session, where SDL complains in a line of its own
    )
    assert proc.returncode == 0 and "error" not in proc.stderr, proc.stderr[-3000:]  # pygame's SDL prints none either
    videos = list((single_run_dir(tmp_path) / "videos").glob("*.mp4"))
    assert videos, "no mp4 written"
    frames = imageio.mimread(videos[0], memtest=False)
    assert len(frames) >= 8 and frames[0].ndim == 3 and frames[0].std() > 0


# A machine with no GL library at all: every GL library fails to load, as it would there.
HIDE_GL = """import ctypes
_load = ctypes.CDLL.__init__
def _no_gl(self, name, *args, **kwargs):
    if name and any(lib in str(name) for lib in ("libEGL", "libOSMesa", "libGL", "libOpenGL")):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")
    _load(self, name, *args, **kwargs)
ctypes.CDLL.__init__ = _no_gl
"""


@pytest.mark.parametrize("name", NAMES)
def test_without_any_gl_library_training_works_and_video_names_the_package(name, tmp_path):
    (tmp_path / "nogl").mkdir()
    (tmp_path / "nogl" / "sitecustomize.py").write_text(HIDE_GL)
    no_gl = {"PYTHONPATH": str(tmp_path / "nogl")}
    # Training and evaluation need no GL (a dm_control task where the script takes one).
    env = "CartPole-v1" if name == "ppo_discrete" else "dm_control/cartpole/balance"
    proc = run_cli(
        f"{name}.py",
        tiny_cli(
            name, "--total-timesteps", str(BATCH), "--eval-interval", "0", "--output-dir", str(tmp_path / "train"), env=env
        ),
        env=no_gl,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (single_run_dir(tmp_path / "train") / f"{name}_last.pt").is_file()
    if name == "ppo_discrete":  # no MuJoCo env has Discrete actions; CartPole's video needs no GL
        proc = run_cli(
            f"{name}.py",
            tiny_cli(
                name,
                "--total-timesteps",
                str(BATCH),
                "--eval-interval",
                "0",
                "--capture-video",
                "--output-dir",
                str(tmp_path / "video"),
            ),
            env=no_gl,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert list((single_run_dir(tmp_path / "video") / "videos").glob("*.mp4"))
    else:
        proc = run_cli(
            f"{name}.py", tiny_cli(name, "--capture-video", "--output-dir", str(tmp_path / "video"), env=env), env=no_gl
        )
        line = one_error_line(proc)
        assert "no OpenGL library loads" in line and "apt-get install libegl1" in line and "libosmesa6" in line
        assert not (tmp_path / "video").exists()


# ---------------------------------------------------------------------------------
# Resume and Ctrl-C
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_resume_extends_to_the_new_total_and_says_so(name, checkpoints, tmp_path, capsys):
    resumed = train(
        name,
        *tiny_cli(
            name,
            "--total-timesteps",
            str(3 * BATCH),
            "--eval-interval",
            "0",
            "--resume",
            str(checkpoints[name]),
            "--output-dir",
            str(tmp_path),
        ),
    )
    assert resumed["global_step"] == 3 * BATCH
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resuming")]
    assert lines == [
        f"resuming {checkpoints[name]} at step {BATCH} with its saved hyperparameters; training to step {3 * BATCH}"
    ]
    assert [step for step, _ in read_scalars(resumed["run_dir"])["charts/SPS"]] == [2 * BATCH, 3 * BATCH]
    ckpt = torch.load(Path(resumed["run_dir"]) / f"{name}_last.pt", weights_only=True)
    assert ckpt["global_step"] == 3 * BATCH


@pytest.mark.parametrize("name", NAMES)
def test_resume_to_a_total_at_or_below_the_saved_step_is_an_error(name, checkpoints, tmp_path):
    module = importlib.import_module(name)
    for total in (BATCH // 2, BATCH, BATCH + BATCH // 2):  # the last rounds down to the saved step
        with pytest.raises(
            module.ConfigError,
            match=rf"--total-timesteps {total} leaves nothing to train after the "
            rf"checkpoint's step {BATCH}; pass a larger total",
        ):
            train(
                name,
                *tiny_cli(
                    name, "--total-timesteps", str(total), "--resume", str(checkpoints[name]), "--output-dir", str(tmp_path)
                ),
            )


@pytest.mark.parametrize("name", NAMES)
def test_a_total_that_is_not_whole_rollouts_is_announced(name, tmp_path, capsys):
    result = train(
        name, *tiny_cli(name, "--total-timesteps", str(2 * BATCH + 50), "--eval-interval", "0", "--output-dir", str(tmp_path))
    )
    assert result["global_step"] == 2 * BATCH
    assert (
        f"training to step {2 * BATCH}: --total-timesteps {2 * BATCH + 50} rounded down to whole rollouts of {BATCH} steps"
    ) in capsys.readouterr().out


@pytest.mark.parametrize("name", NAMES)
def test_ctrl_c_keeps_the_last_trained_step_and_resume_repeats_nothing(name, tmp_path):
    """SIGINT a real run mid-training: exit 130, one message, a checkpoint of the last completed
    update. Resuming it trains exactly the rollouts after that step: none twice, none skipped."""
    out = tmp_path / "interrupted"
    proc = start_interruptible(
        [
            sys.executable,
            str(ROOT / f"{name}.py"),
            *tiny_cli(name, "--total-timesteps", "100000000", "--eval-interval", "0", "--output-dir", str(out)),
        ]
    )
    try:
        wait_for_iteration(proc, out, name, 3)  # three updates done, the fourth rollout under way
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    run_dir = single_run_dir(out)
    last = run_dir / f"{name}_last.pt"
    ckpt = torch.load(last, weights_only=True)
    saved = ckpt["global_step"]
    assert saved >= 3 * BATCH and saved % BATCH == 0
    assert f"interrupted; the last trained step's checkpoint is {last} (step {saved})" in stdout
    assert all(torch.isfinite(t).all() for t in ckpt["agent"].values())
    logged = [step for step, _ in read_scalars(run_dir)["charts/SPS"]]
    # Ctrl-C waits for the loop's next check, after the update's save and its logging: every update up to the saved one.
    assert logged == list(range(BATCH, saved + 1, BATCH))

    resumed = train(
        name,
        *tiny_cli(
            name,
            "--total-timesteps",
            str(saved + 2 * BATCH),
            "--eval-interval",
            "0",
            "--resume",
            str(last),
            "--output-dir",
            str(tmp_path / "resumed"),
        ),
    )
    assert [step for step, _ in read_scalars(resumed["run_dir"])["charts/SPS"]] == [saved + BATCH, saved + 2 * BATCH]


@pytest.mark.parametrize("name", NAMES)
def test_ctrl_c_right_after_a_checkpoints_rename_names_the_step_on_disk(name, tmp_path, capsys, monkeypatch):
    """Ctrl-C can land between a save's rename and whatever follows it: the message must still name the step in the file."""
    rename, renames = os.replace, []

    def rename_then_interrupt(src, dst):
        rename(src, dst)
        renames.append(dst)
        if str(dst).endswith("_last.pt") and len(renames) == 3:  # the initial save, two updates, then Ctrl-C
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", rename_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(
            name, *tiny_cli(name, "--total-timesteps", str(10 * BATCH), "--eval-interval", "0", "--output-dir", str(tmp_path))
        )
    monkeypatch.undo()
    last = single_run_dir(tmp_path) / f"{name}_last.pt"
    saved = torch.load(last, weights_only=True)["global_step"]
    assert saved == 2 * BATCH
    assert f"interrupted; the last trained step's checkpoint is {last} (step {saved})" in capsys.readouterr().out


@pytest.mark.parametrize("name", NAMES)
def test_the_first_ctrl_c_waits_for_the_loops_check_and_a_second_stops_at_once(name):
    """Raised inside TensorBoard's writer, Ctrl-C can leave the writer's lock held, and the run then hangs closing it:
    the first press is only noted and raised where the loop checks, a second raises at once, and the handler before
    comes back. Where SIGINT is ignored (`nohup`, a background job), it stays ignored."""
    module = importlib.import_module(name)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as a run from a terminal has it
    try:
        ctrl_c = module.DeferredCtrlC()
        try:
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                pytest.fail("the first Ctrl-C was raised where it was pressed, not at the loop's check")
            with pytest.raises(KeyboardInterrupt):
                ctrl_c.check()
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        finally:
            ctrl_c.restore()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        module.DeferredCtrlC().restore()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


# A Ctrl-C while the script imports its libraries: a real SIGINT, sent as tyro's import starts.
SIGINT_ON_IMPORT = """import os, signal, sys
class SigintOnImport:
    def find_spec(self, name, path=None, target=None):
        if name == "tyro":
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, SigintOnImport())
"""


@pytest.mark.parametrize("name", NAMES)
def test_ctrl_c_during_the_imports_exits_130_without_a_traceback(name, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SIGINT_ON_IMPORT)
    proc = start_interruptible([sys.executable, str(ROOT / f"{name}.py"), "--help"], env={"PYTHONPATH": str(tmp_path)})
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and not stderr.strip() and not stdout, stderr[-2000:]


@pytest.mark.parametrize("name", NAMES)
def test_resuming_a_step_0_checkpoint_says_so(name, checkpoints, tmp_path):
    """What a run interrupted before its first update leaves: `_last.pt` at step 0."""
    ckpt = torch.load(checkpoints[name], weights_only=True)
    torch.save(ckpt | {"global_step": 0, "iteration": 0}, tmp_path / "step0.pt")
    cli = tiny_cli(
        name, "--resume", str(tmp_path / "step0.pt"), "--total-timesteps", str(BATCH), "--output-dir", str(tmp_path)
    )
    proc = run_cli(f"{name}.py", cli)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resuming = f"resuming {tmp_path / 'step0.pt'} at step 0 with its saved hyperparameters; training to step {BATCH}"
    assert resuming in proc.stdout.splitlines()


@pytest.fixture
def small_disk(tmp_path) -> Path:
    """An 8 MiB tmpfs, mounted for the test (root only), so that a disk fills up for real."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no `mount` command to make a small tmpfs")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (root only): {proc.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> None:
    """Write until the disk is full."""
    fd = os.open(disk / f"filler{len(list(disk.glob('filler*')))}", os.O_WRONLY | os.O_CREAT)
    with contextlib.suppress(OSError):
        while True:
            os.write(fd, bytes(1 << 16))
    os.close(fd)


@pytest.mark.parametrize("name", NAMES)
def test_a_disk_that_fills_up_ends_the_run_in_one_line_naming_the_checkpoint_it_kept(name, small_disk):
    """Full before the start: one line before any work. Full mid-run: one line naming `_last.pt`, which still loads at its
    step; no `.tmp` is left behind."""
    fill(small_disk)
    line = one_error_line(run_cli(f"{name}.py", tiny_cli(name, "--output-dir", str(small_disk / "full"))))
    assert "No space left on device" in line and not list(small_disk.glob("full/*")), line
    for filler in small_disk.glob("filler*"):
        filler.unlink()
    out = small_disk / "runs"
    cli = tiny_cli(name, "--total-timesteps", "100000000", "--eval-interval", "0", "--output-dir", str(out))
    proc = start_interruptible([sys.executable, str(ROOT / f"{name}.py"), *cli])
    try:
        wait_for_iteration(proc, out, name, 2)
        fill(small_disk)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    last = single_run_dir(out) / f"{name}_last.pt"
    saved = torch.load(last, weights_only=True)["global_step"]
    line = one_error_line(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    assert line == f"error: [Errno 28] No space left on device; stopped. Last good checkpoint: {last} (step {saved})"
    assert saved >= 2 * BATCH and not list(out.glob("*/*.tmp"))


# ---------------------------------------------------------------------------------
# Copy one file, determinism, documented Args, wandb offline, bad input on the CLI
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_copied_alone_into_an_empty_dir_runs_from_its_cli(name, tmp_path):
    """No other project file, no repository on the path: a dm_control task for the continuous scripts."""
    shutil.copy(ROOT / f"{name}.py", tmp_path / f"{name}.py")
    env = "CartPole-v1" if name == "ppo_discrete" else "dm_control/cartpole/balance"
    proc = run_cli(
        f"{name}.py",
        tiny_cli(name, "--total-timesteps", str(BATCH), "--eval-interval", "0", env=env),
        cwd=tmp_path,
        script_dir=tmp_path,
        env={"PYTHONPATH": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (single_run_dir(tmp_path / "runs") / f"{name}_last.pt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{name}.py", "runs"])


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_numbers_and_another_seed_differs(name, tmp_path):
    def run(seed: int, sub: str):
        result = train(
            name,
            *tiny_cli(
                name,
                "--seed",
                str(seed),
                "--total-timesteps",
                str(4 * BATCH),
                "--eval-interval",
                "0",
                "--output-dir",
                str(tmp_path / sub),
            ),
        )
        scalars = read_scalars(result["run_dir"])
        weights = torch.load(Path(result["run_dir"]) / f"{name}_last.pt", weights_only=True)["agent"]
        return result["final_eval_return"], scalars, weights

    (eval_a, scalars_a, weights_a), (eval_b, scalars_b, weights_b) = run(3, "a"), run(3, "b")
    assert eval_a == eval_b
    for tag in ("losses/policy_loss", "losses/value_loss", "charts/episodic_return"):
        assert scalars_a[tag] == scalars_b[tag], tag
    assert all(torch.equal(weights_a[key], weights_b[key]) for key in weights_a)
    _, scalars_c, _ = run(4, "c")
    assert scalars_c["losses/value_loss"] != scalars_a["losses/value_loss"]  # and the seed matters


@pytest.mark.parametrize("name", NAMES)
def test_every_args_field_has_a_docstring(name):
    import ast
    import dataclasses
    import inspect

    module = importlib.import_module(name)
    body = ast.parse(inspect.getsource(module.Args)).body[0].body
    fields = [node.target.id for node in body if isinstance(node, ast.AnnAssign)]
    assert fields == [f.name for f in dataclasses.fields(module.Args)]
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign):
            doc = body[i + 1] if i + 1 < len(body) else None
            assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), f"{node.target.id} has no help"
            assert len(doc.value.value.strip()) > 10, f"{node.target.id}: help too short"


@pytest.mark.parametrize("name", NAMES)
def test_track_writes_an_offline_wandb_run(name, tmp_path):
    proc = run_cli(
        f"{name}.py",
        tiny_cli(name, "--total-timesteps", str(BATCH), "--eval-interval", "0", "--track", "--output-dir", str(tmp_path)),
        env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((single_run_dir(tmp_path) / "wandb").glob("offline-run-*/*.wandb")), "no offline wandb run"


@pytest.mark.parametrize("name", NAMES)
def test_an_env_of_the_wrong_action_space_on_the_cli_is_one_line_naming_the_right_script(name, tmp_path):
    env, right = ("Pendulum-v1", "ppo_continuous.py") if name == "ppo_discrete" else ("CartPole-v1", "ppo_discrete.py")
    line = one_error_line(run_cli(f"{name}.py", ["--env-id", env, "--output-dir", str(tmp_path / "runs")]))
    assert env in line and right in line
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------------
# Same seed, same numbers: any thread count, any device
# ---------------------------------------------------------------------------------

# Builds the script's run (checks, seeds, envs, agent) and saves the freshly initialised weights.
INITIAL_WEIGHTS = (
    "import importlib, sys, torch, tyro; m = importlib.import_module(sys.argv[1]); "
    "torch.save(m.set_up(tyro.cli(m.Args, args=sys.argv[3:])).agent.state_dict(), sys.argv[2])"
)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_weights_under_one_and_two_threads(name, tmp_path):
    """The initial weights, and the checkpoint of a short run whose update uses every thread it is given, with its final
    evaluation's return: the command line puts MKL in its strict mode, so a product's sums do not depend on the thread
    count, and the evaluation runs on one thread (two envs, whose products a second thread would split)."""
    # Walker's six actions: a 6-row head, whose gradient is the product MKL splits (cartpole's one row is not split).
    env = "CartPole-v1" if name == "ppo_discrete" else "dm_control/walker/walk"  # EnvPool for the continuous ones
    initial, trained = {}, {}
    for threads in ("1", "2"):
        out = tmp_path / threads
        cli = tiny_cli(name, "--total-timesteps", str(4 * BATCH), "--eval-interval", "0", "--output-dir", str(out), env=env)
        cli += ["--eval-episodes", "2"]
        proc = run_cli("-c", [INITIAL_WEIGHTS, name, str(tmp_path / f"init{threads}.pt"), *cli], cwd=ROOT, script_dir=Path(""),
                       env={"OMP_NUM_THREADS": threads})  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        initial[threads] = torch.load(tmp_path / f"init{threads}.pt", weights_only=True)
        proc = run_cli(f"{name}.py", [*cli, "--output-dir", str(out / "trained")], env={"OMP_NUM_THREADS": threads})
        assert proc.returncode == 0, proc.stderr[-3000:]
        trained[threads] = torch.load(single_run_dir(out / "trained") / f"{name}_last.pt", weights_only=True)
    assert trained["1"]["eval_return"] == trained["2"]["eval_return"]
    trained = {threads: ckpt["agent"] for threads, ckpt in trained.items()}
    for key in initial["1"]:
        assert torch.equal(initial["1"][key], initial["2"][key]), f"initial {key}"
        assert torch.equal(trained["1"][key], trained["2"][key]), f"trained {key}"
    assert not torch.equal(initial["1"][key], trained["1"][key])  # and training moved them


HEAD_GRADIENT = (
    "import sys, torch; torch.set_num_threads(int(sys.argv[1])); torch.manual_seed(0); "
    "net = torch.nn.Sequential(torch.nn.Linear(24, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(), "
    "torch.nn.Linear(64, 6)); x, y = torch.randn(256, 24), torch.randn(256, 6); ((net(x) - y) ** 2).mean().backward(); "
    "torch.save([p.grad for p in net.parameters()], sys.argv[2])"
)


def test_the_mkl_mode_of_the_command_lines_makes_a_backward_pass_thread_count_invariant(tmp_path):
    """The mechanism under the test above: MKL splits the sum over the batch of a small gradient (a 6x64 policy head's,
    here) across threads, so its rounding depends on the thread count on some CPUs (AVX-512 ones); its strict mode, which
    every script's command line sets, fixes the order. One backward pass under one thread and two, bitwise equal."""
    found = [re.search(r'os\.environ\.setdefault\("MKL_CBWR", "([^"]+)"\)', (ROOT / f"{n}.py").read_text()) for n in NAMES]
    assert all(found) and len({m[1] for m in found}) == 1, "every script sets one MKL_CBWR in its __main__ block"
    grads = []
    for threads in ("1", "2"):
        path = tmp_path / f"{threads}.pt"
        env = {"OMP_NUM_THREADS": threads, "MKL_CBWR": found[0][1]}
        proc = run_cli("-c", [HEAD_GRADIENT, threads, str(path)], cwd=ROOT, script_dir=Path(""), env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        grads.append(torch.load(path, weights_only=True))
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


@pytest.mark.parametrize("name", NAMES)
def test_a_checkpoint_written_on_a_gpu_resumes_on_a_cpu_with_a_one_line_note(name, checkpoints, tmp_path):
    """What a GPU's checkpoint holds beyond a CPU's: its device and the CUDA generator's state (16 bytes of Philox)."""
    ckpt = torch.load(checkpoints[name], weights_only=True)
    assert ckpt["device"] == "cpu" and "cuda" not in ckpt["rng"]
    ckpt["device"], ckpt["rng"]["cuda"] = "cuda", torch.zeros(16, dtype=torch.uint8)
    gpu_checkpoint = tmp_path / f"{name}_last.pt"
    torch.save(ckpt, gpu_checkpoint)
    proc = run_cli(
        f"{name}.py",
        tiny_cli(name, "--total-timesteps", str(2 * BATCH), "--resume", str(gpu_checkpoint), "--output-dir", str(tmp_path)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note: ")]
    assert notes == [
        f"note: {gpu_checkpoint} was written on cuda and resumes on cpu: the same state, but the two devices round "
        "floating point differently, so the run will not repeat an uninterrupted one bit for bit"
    ]


def checkpoint_entries(ckpt, prefix: str = ""):
    """(path, value) of every leaf of a checkpoint: tensors, numbers and strings, nested dicts and lists walked."""
    if isinstance(ckpt, dict | list | tuple):
        for key, value in ckpt.items() if isinstance(ckpt, dict) else enumerate(ckpt):
            yield from checkpoint_entries(value, f"{prefix}/{key}")
    else:
        yield prefix, ckpt


def straight_and_resumed(name: str, tmp_path: Path, device_flag: str, reseed) -> tuple[dict, dict]:
    """A run of 4 rollouts, and one of 2 resumed to 4, on probe 4 (one-step episodes: a resumed run restarts the
    episodes in flight, and these carry nothing) with a learning rate that does not depend on the total (PPO's linear
    anneal follows the total, so a run to 2 rollouts would anneal faster). `reseed()` runs before the resume: the
    resumed run must restore its generators, not inherit the process's."""
    probe4 = SCRIPTS[name]["probe"].replace("Probe1", "Probe4")
    cli = [a for a in tiny_cli(name, env=probe4) if a != "--no-cuda"] + [device_flag, "--eval-interval", "0"]
    cli += ["--no-anneal-lr"] if name.startswith("ppo") else []  # V-MPO's --lr-horizon schedule ignores the total
    straight = train(name, *cli, "--total-timesteps", str(4 * BATCH), "--output-dir", str(tmp_path / "straight"))
    first = train(name, *cli, "--total-timesteps", str(2 * BATCH), "--output-dir", str(tmp_path / "first"))
    reseed()
    resumed = train(name, *cli, "--total-timesteps", str(4 * BATCH), "--resume", str(Path(first["run_dir"]) / f"{name}_last.pt"),
                    "--output-dir", str(tmp_path / "resumed"))  # fmt: skip
    return tuple(torch.load(Path(r["run_dir"]) / f"{name}_last.pt", weights_only=True) for r in (straight, resumed))


def assert_resume_repeats(straight: dict, resumed: dict) -> None:
    """Everything equal to the bit but the run's own paths and the observation statistics (the resume's first reset
    counts its observations once more)."""
    a, b = dict(checkpoint_entries(straight)), dict(checkpoint_entries(resumed))
    assert a.keys() == b.keys()
    differ = [key for key in a if not (torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key])]
    expected = {"/args/output_dir", "/args/resume", "/obs_rms/var", "/obs_rms/count"}
    assert set(differ) <= expected, sorted(set(differ) - expected)
    assert any(key.startswith("/agent/") for key in a) and any("optimizer" in key and "exp_avg" in key for key in a)


@pytest.mark.parametrize("name", NAMES)
def test_a_resumed_cpu_run_continues_like_an_uninterrupted_one(name, tmp_path):
    """Weights, optimizer moments, duals, reward scaler, generators and step: a resume restores all the learner carries."""
    assert_resume_repeats(*straight_and_resumed(name, tmp_path, "--no-cuda", lambda: torch.manual_seed(12345)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here: the CUDA generator is saved and restored only on one")
@pytest.mark.parametrize("name", NAMES)
def test_a_resumed_gpu_run_continues_like_an_uninterrupted_one(name, tmp_path):
    """The CPU test's run on a GPU: the optimizers' state on the device and the CUDA generator come back too."""
    straight, resumed = straight_and_resumed(name, tmp_path, "--cuda", lambda: torch.cuda.manual_seed_all(12345))
    assert "cuda" in straight["rng"] and straight["device"] == "cuda"
    assert_resume_repeats(straight, resumed)


# ---------------------------------------------------------------------------------
# The console: one line in place on a terminal, a line every 5% in a file or pipe
# ---------------------------------------------------------------------------------


def progress_lines(text: str) -> list[str]:
    return [line for line in text.replace("\r", "\n").splitlines() if line.startswith("step ")]


@pytest.mark.parametrize("name", NAMES)
def test_progress_in_a_pipe_is_a_line_every_5_percent_and_on_a_terminal_one_line_in_place(name, tmp_path):
    import os
    import pty
    import subprocess

    iterations = 40
    cli = tiny_cli(name, "--total-timesteps", str(iterations * BATCH), "--eval-interval", str(20 * BATCH))
    cli += ["--train-episode-steps", "None"] if name == "vmpo_continuous" else []  # Pendulum's own 200-step episodes
    piped = run_cli(f"{name}.py", [*cli, "--output-dir", str(tmp_path / "pipe")])
    assert piped.returncode == 0, piped.stderr[-3000:]
    lines = progress_lines(piped.stdout)
    assert [line.split()[1] for line in lines] == [f"{k * 2 * BATCH}/{iterations * BATCH}" for k in range(1, 21)]
    assert "nan" not in piped.stdout and "\r" not in piped.stdout
    if name != "ppo_discrete":  # Pendulum's episodes last 200 steps: none has ended after the first 2 x 128 steps
        assert lines[0].endswith("| return - | eval -") and "| eval " in lines[-1] and not lines[-1].endswith("eval -")

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, str(ROOT / f"{name}.py"), *cli, "--output-dir", str(tmp_path / "tty")],
                            stdout=slave, stderr=subprocess.DEVNULL, env=script_env(), cwd=tmp_path)  # fmt: skip
    os.close(slave)
    output = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        output += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0
    text = output.decode()
    assert text.count("\rstep ") == iterations and text.count("\x1b[K") == iterations  # rewritten after every update
    progress_block = text[text.index("\rstep ") : text.rindex("\rstep ")]
    assert "\n" not in progress_block, "a new line before the run ended"
    assert "nan" not in text


# ---------------------------------------------------------------------------------
# One concept, one behaviour: the same inputs through each script's own function
# ---------------------------------------------------------------------------------
ENV_IDS = [
    ("CartPole-v1", "CartPole-v1"),
    ("dm_control/walker/walk", "dm_control/walker-walk-v0"),
    ("dm_control/ball_in_cup-catch-v0", "dm_control/ball_in_cup-catch-v0"),
    ("Probe1Continuous-v0", "Probe1Continuous-v0"),
]
BAD_ENV_IDS = [
    ("dm_control/walker", "malformed dm_control id 'dm_control/walker'; accepted forms: dm_control/<domain>/<task> or"),
    ("dm_control/walker-walk", "malformed dm_control id 'dm_control/walker-walk'"),
    ("dm_control/nowhere/walk", "unknown dm_control domain 'nowhere' in 'dm_control/nowhere/walk'; valid domains: acrobot,"),
    ("dm_control/walker/fly", "unknown task 'fly' for dm_control domain 'walker'; valid tasks: run, stand, walk"),
    ("NoSuchEnv-v0", "unknown env id 'NoSuchEnv-v0'; accepted: a registered gymnasium id, dm_control/<domain>/<task>"),
]


@pytest.mark.parametrize("name", NAMES)
def test_resolve_env_id_maps_and_rejects_the_same_ids_in_every_script(name):
    module = importlib.import_module(name)
    assert [module.resolve_env_id(env_id) for env_id, _ in ENV_IDS] == [gym_id for _, gym_id in ENV_IDS]
    for env_id, message in BAD_ENV_IDS:
        with pytest.raises(module.ConfigError) as info:
            module.resolve_env_id(env_id)
        assert str(info.value).startswith(message), (env_id, str(info.value))


@pytest.mark.parametrize("name", NAMES)
def test_explained_variance_is_the_same_formula_in_every_script(name):
    module = importlib.import_module(name)
    rng = np.random.default_rng(0)
    returns = rng.normal(size=50)
    values = returns + rng.normal(scale=0.5, size=50)
    expected = 1.0 - np.var(returns - values) / np.var(returns)  # population variances, as numpy's default
    as_t = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    assert module.explained_variance(as_t(values), as_t(returns)) == pytest.approx(expected, rel=1e-5)
    assert module.explained_variance(as_t(returns), as_t(returns)) == pytest.approx(1.0)
    assert math.isnan(module.explained_variance(as_t(values), torch.full((50,), 3.0)))  # constant returns: undefined


@pytest.mark.parametrize("name", NAMES)
def test_importing_a_script_changes_no_environment_variable_and_help_opens_with_what_it_is(name):
    check = f"import os; before = dict(os.environ); import {name}; assert dict(os.environ) == before, set(os.environ) ^ set(before)"
    proc = subprocess.run([sys.executable, "-c", check], cwd=ROOT, env=script_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = importlib.import_module(name).Args.__doc__
    assert "\n" not in doc.strip() and "in one file" in doc, doc
    help_text = run_cli(f"{name}.py", ["--help"], cwd=ROOT).stdout
    assert doc.strip() in help_text.split("╭")[0], help_text[:500]


@pytest.mark.parametrize("name", NAMES)
def test_without_observation_normalization_the_checkpoint_still_holds_its_statistics(name, tmp_path):
    result = train(name, *tiny_cli(name, "--total-timesteps", str(BATCH), "--no-norm-obs", "--output-dir", str(tmp_path)))
    ckpt = torch.load(Path(result["run_dir"]) / f"{name}_last.pt", weights_only=True)
    assert ckpt["args"]["norm_obs"] is False and set(ckpt["obs_rms"]) == {"mean", "var", "count"}
    assert not ckpt["obs_rms"]["mean"].any() and bool((ckpt["obs_rms"]["var"] == 1).all())  # never updated


BOUNDED, UNBOUNDED = gym.spaces.Box(-1.0, 1.0, (2,)), gym.spaces.Box(-np.inf, np.inf, (2,))


@pytest.mark.parametrize("name", ["ppo_continuous", "vmpo_continuous"])
def test_policy_auto_trains_the_gaussian_on_the_control_suite_or_an_unbounded_box_and_the_beta_elsewhere(name):
    """--policy auto by the env id's suite and the action box; unset --rpo-alpha and --init-log-std take the family's;
    explicit flags win; the Beta refuses an unbounded box and a Gaussian's flag."""
    module = importlib.import_module(name)
    choose = lambda space=BOUNDED, **kw: module.choose_policy(module.Args(**kw), space)[:3]  # noqa: E731
    log_std = {"ppo_continuous": 0.0, "vmpo_continuous": 1.0}[name]  # the Gaussian's start: std 1, V-MPO's e
    assert choose(env_id="dm_control/walker/walk") == ("gaussian", 0.5, log_std)
    assert choose(env_id="dm_control/cartpole-swingup-v0", init_log_std=-0.5) == ("gaussian", 0.5, -0.5)
    for env_id in ("Ant-v5", "Pendulum-v1", "Probe4Continuous-v0", "MyCompany/Arm-v0"):
        assert choose(env_id=env_id) == ("beta", 0.2, None), env_id
        assert choose(UNBOUNDED, env_id=env_id) == ("gaussian", 0.5, log_std), env_id
    assert choose(env_id="Ant-v5", policy="gaussian") == ("gaussian", 0.5, log_std)
    assert choose(env_id="dm_control/walker/walk", policy="beta", rpo_alpha=0.0) == ("beta", 0.0, None)
    with pytest.raises(module.ConfigError, match=r"^--policy beta needs a bounded action box; Foo-v0 has low \[-inf -inf\]"):
        choose(UNBOUNDED, env_id="Foo-v0", policy="beta")
    with pytest.raises(module.ConfigError, match=r"^--init-log-std sets the Gaussian's std; the Beta that --policy auto"):
        choose(env_id="Ant-v5", init_log_std=-1.0)


USER_ENVS = """
import gymnasium as gym
import numpy as np


class OneStep(gym.Env):
    \"\"\"One step, reward -|a|^2: a user's env with the action space it is given.\"\"\"

    def __init__(self, action_space):
        self.observation_space, self.action_space = gym.spaces.Box(-1.0, 1.0, (3,)), action_space

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), -float(np.sum(np.square(action))), True, False, {}


gym.register("User/Unbounded-v0", entry_point=OneStep, kwargs={"action_space": gym.spaces.Box(-np.inf, np.inf, (2,))})
gym.register("User/MultiDiscrete-v0", entry_point=OneStep, kwargs={"action_space": gym.spaces.MultiDiscrete([3, 3])})
"""


def user_env_cli(name: str, tmp_path: Path, env_id: str, *extra: str) -> subprocess.CompletedProcess:
    """The script's command line on an env that a user's module registers (`module:id`, gymnasium's form)."""
    (tmp_path / "user_envs.py").write_text(USER_ENVS)
    cli = tiny_cli(name, "--total-timesteps", str(BATCH), "--output-dir", str(tmp_path / "runs"), *extra, env=env_id)
    return run_cli(f"{name}.py", cli, env={"PYTHONPATH": str(tmp_path)})


@pytest.mark.parametrize("name", ["ppo_continuous", "vmpo_continuous"])
def test_an_unbounded_action_box_trains_the_gaussian_unclipped_and_says_so_first(name, tmp_path):
    proc = user_env_cli(name, tmp_path, "user_envs:User/Unbounded-v0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = proc.stdout.splitlines()[0]
    assert first.startswith("policy: gaussian (--policy auto: user_envs:User/Unbounded-v0's action box is unbounded (low")
    assert "so no clip), RPO shift alpha 0.5" in first, first
    assert math.isfinite(float(re.search(r"final eval return (\S+)", proc.stdout)[1]))


@pytest.mark.parametrize("name", ["ppo_continuous", "vmpo_continuous"])
@pytest.mark.parametrize(
    "env_id,extra,message",
    [
        ("user_envs:User/Unbounded-v0", ["--policy", "beta"], "--policy beta needs a bounded action box; "),
        ("user_envs:User/MultiDiscrete-v0", [], "user_envs:User/MultiDiscrete-v0 has a MultiDiscrete action space; "),
        ("Pendulum-v1", ["--init-log-std", "-1"], "--init-log-std sets the Gaussian's std; the Beta that --policy auto"),
        ("no_such_module:User/Unbounded-v0", [], "env id 'no_such_module:User/Unbounded-v0': its module 'no_such_module'"),
    ],
)
def test_an_action_space_or_flag_the_family_cannot_serve_is_one_line(name, env_id, extra, message, tmp_path):
    line = one_error_line(user_env_cli(name, tmp_path, env_id, *extra))
    assert line.startswith(f"error: {message}"), line
    assert "ppo_discrete.py" not in line and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["ppo_continuous", "vmpo_continuous"])
def test_the_first_line_of_a_run_names_its_policy_and_why_and_the_checkpoint_keeps_it(name, checkpoints, tmp_path):
    proc = run_cli(f"{name}.py", [*tiny_cli(name, "--total-timesteps", str(BATCH), "--output-dir", str(tmp_path))])
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = proc.stdout.splitlines()[0]
    why = "--policy auto: Pendulum-v1 is not a control-suite task; rewards elsewhere mostly charge for torque"
    assert first == f"policy: beta ({why}), RPO shift alpha 0.2", first
    saved = torch.load(checkpoints[name], weights_only=True)["args"]
    assert (saved["policy"], saved["rpo_alpha"]) == ("beta", 0.2)  # resolved: a resume trains what the run trained
    help_text = run_cli(f"{name}.py", ["--help"]).stdout
    help_text = " ".join(help_text.replace("│", " ").split())
    assert "auto: gaussian on dm_control/... tasks or an unbounded box, else beta" in help_text


@pytest.mark.parametrize("name", ["ppo_continuous", "vmpo_continuous"])
def test_evaluation_logs_the_sampled_policy_and_failed_episodes_without_touching_trainings_rng(name, tmp_path):
    module = importlib.import_module(name)
    args = tyro.cli(module.Args, args=tiny_cli(name, "--total-timesteps", str(BATCH), "--output-dir", str(tmp_path)))
    run = module.set_up(args)
    before = torch.get_rng_state()
    returns = module.evaluate(run)
    run.close()
    assert torch.equal(before, torch.get_rng_state())
    scalars = {tag: values[-1][1] for tag, values in read_scalars(run.run_dir).items()}
    assert scalars["eval/return_mean"] == pytest.approx(returns.mean())
    assert scalars["eval/episodes_below_100"] == (returns < 100).sum()  # every Pendulum return is below 100
    assert scalars["eval/sampled_return_mean"] != scalars["eval/return_mean"]  # std 0.78-1 Pendulum actions differ


@pytest.mark.parametrize("name", ["ppo_continuous", "vmpo_continuous"])
@pytest.mark.parametrize("log_std", [2.0, -3.0])
def test_actions_at_bounds_is_the_share_of_samples_the_env_clips(name, log_std, tmp_path):
    """The first rollout's `charts/actions_at_bounds` against P(|u| > 1.96), u ~ N(0, sigma^2): the initial mean is about
    0, Pendulum's bound is 2 and 1% of its width 0.04. Wide (sigma 7.4), about 0.79 of 128 samples are at a bound (1 sd
    0.04); narrow, none."""
    cli = tiny_cli(
        name, "--policy", "gaussian", "--init-log-std", str(log_std), "--total-timesteps", str(BATCH), "--eval-interval", "0"
    )
    result = train(name, *cli, "--output-dir", str(tmp_path))
    [(step, logged)] = read_scalars(result["run_dir"])["charts/actions_at_bounds"]
    expected = 1 - math.erf(1.96 / (math.exp(log_std) * math.sqrt(2)))
    assert step == BATCH and abs(logged - expected) < 0.12, (logged, expected)
