"""Submitting a benchmark tool's work to Slurm as one array job (`run.py --slurm`, `tune.py --slurm N`).

- the options clusters differ in (partition, time limit, CPUs and GPUs a task, extra `sbatch` arguments), shared by
  both tools, and the way to take them back out of a command line (a task runs the tool without them);
- the job script: one array task per command, each task's console in `<logs>/<job>_<task>.out` and its exit code in
  `<logs>/<job>_<task>.rc` (none when Slurm killed it: a time limit, a cancel, a lost node), so what went wrong can be
  told after the job has left the queue, without Slurm's accounting database;
- `sbatch` and `squeue`, each failure one line.

The tasks run the tools with the same interpreter and the same code paths the submitting machine sees, so the
repository, its `.venv` and the results must be on a filesystem every node mounts at the same path.
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import common

POLL_SECONDS = 2.0  # how often --wait asks squeue whether the job's tasks are still there


def add_options(p: argparse.ArgumentParser, cpus_default: str) -> None:
    """The options of the array job, shared by run.py and tune.py."""
    g = p.add_argument_group("Slurm (with --slurm)")
    g.add_argument("--partition", help="sbatch --partition (default: the cluster's default partition)")
    g.add_argument("--time", help="time limit of each task, as sbatch --time takes it (e.g. 2:00:00, 1-00:00:00)")
    g.add_argument("--cpus-per-task", type=int, help=f"CPUs of each task (default: {cpus_default})")
    g.add_argument("--gpus-per-task", type=int, default=0, help="GPUs of each task, as --gres=gpu:N (default: 0)")
    g.add_argument(
        "--sbatch-args",
        default="",
        metavar="'ARGS'",
        help="more sbatch options, one string written into the job script, e.g. --sbatch-args='--account=lab --qos=long'",
    )
    g.add_argument("--wait", action="store_true", help="wait for the job to end, then report (and, for run.py, merge)")


# Options of the tools that concern only the submission: a task's command line goes without them.
SUBMIT_ONLY = {
    "--slurm": 0,  # store_true in run.py; tune.py's takes N (handled by `strip_options`' nargs below)
    "--partition": 1,
    "--time": 1,
    "--cpus-per-task": 1,
    "--gpus-per-task": 1,
    "--sbatch-args": 1,
    "--wait": 0,
    "--dry-run": 0,
    "--merge": 0,  # run.py's
}


def strip_options(own: Sequence[str], slurm_takes_value: bool) -> list[str]:
    """`own` (a tool's arguments before `--`) without the submission's options, in order, as argparse reads them
    (`--time 1:00:00` and `--time=1:00:00`, and unique prefixes such as `--part`; the tool's own parser has already
    refused an ambiguous one)."""
    p = argparse.ArgumentParser(add_help=False)
    for name, n in SUBMIT_ONLY.items():
        if name == "--slurm" and slurm_takes_value:
            n = 1
        p.add_argument(name, **({"action": "store_true"} if n == 0 else {}))
    _, rest = p.parse_known_args(list(own))
    return rest


def validate(opts: argparse.Namespace, submitting: bool) -> None:
    """Bad values as one line; an option of the array job without `--slurm` is refused (it would do nothing)."""
    if not submitting:
        given = [
            name
            for name, value in [
                ("--partition", opts.partition),
                ("--time", opts.time),
                ("--cpus-per-task", opts.cpus_per_task),
                ("--gpus-per-task", opts.gpus_per_task or None),
                ("--sbatch-args", opts.sbatch_args or None),
                ("--wait", opts.wait or None),
            ]
            if value is not None
        ]
        if given:
            raise common.BenchmarkError(f"{' '.join(given)}: options of the Slurm job, given without --slurm")
    if opts.cpus_per_task is not None and opts.cpus_per_task < 1:
        raise common.BenchmarkError(f"--cpus-per-task must be at least 1, got {opts.cpus_per_task}")
    if opts.gpus_per_task < 0:
        raise common.BenchmarkError(f"--gpus-per-task must be at least 0, got {opts.gpus_per_task}")
    try:
        shlex.split(opts.sbatch_args)
    except ValueError as e:
        raise common.BenchmarkError(f"--sbatch-args {opts.sbatch_args!r}: {e}") from None


def log_file(logs: Path, job: str, task: int) -> Path:
    """Slurm's output of one task: the tool's own console (the scripts' consoles go to their runs' log.txt)."""
    return logs / f"{job}_{task}.out"


def exit_code(logs: Path, job: str, task: int) -> int | None:
    """The exit code a task's command returned, or None when the task never wrote one (killed, or not yet ended)."""
    try:
        return int((logs / f"{job}_{task}.rc").read_text().strip())
    except (OSError, ValueError):
        return None


def job_script(
    name: str,
    head: Sequence[str],
    per_task: Sequence[Sequence[str]],
    tail: Sequence[str],
    opts: argparse.Namespace,
    cpus: int,
    logs: Path,
    notes: Sequence[str],
) -> str:
    """One array job of `len(per_task)` tasks; task i runs `head + per_task[i] + tail`."""
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={q(name)}",
        f"#SBATCH --array=0-{len(per_task) - 1}",
        "#SBATCH --ntasks=1",
        f"#SBATCH --cpus-per-task={cpus}",
        f"#SBATCH --output={q(str(logs / '%A_%a.out'))}",
        f"#SBATCH --chdir={q(os.getcwd())}",
    ]
    if opts.partition:
        lines.append(f"#SBATCH --partition={q(opts.partition)}")
    if opts.time:
        lines.append(f"#SBATCH --time={q(opts.time)}")
    if opts.gpus_per_task:
        lines.append(f"#SBATCH --gres=gpu:{opts.gpus_per_task}")
    if opts.sbatch_args.strip():
        lines.append(f"#SBATCH {shlex.join(shlex.split(opts.sbatch_args))}")
    lines += [f"# {note}" for note in notes]
    lines.append("export PYTHONUNBUFFERED=1")
    if any(per_task):
        lines.append('case "$SLURM_ARRAY_TASK_ID" in')
        lines += [f"  {i}) task=({shlex.join(args)}) ;;" for i, args in enumerate(per_task)]
        lines += ['  *) echo "this job has no task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;', "esac"]
        lines.append(f'{shlex.join(head)} "${{task[@]}}" {shlex.join(tail)}'.rstrip())
    else:
        lines.append(shlex.join([*head, *tail]))
    lines += [
        "rc=$?",
        f'echo "$rc" > {q(str(logs))}/"${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}.rc"',
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise common.BenchmarkError(f"{tool} not found: --slurm submits from a machine with Slurm's commands (a login node)")
    return path


def submit(script: str, logs: Path) -> str:
    """Write the job script under `logs` and submit it; the job id. The script is kept as `<logs>/<job>.sh`."""
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"job-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.sh"
    path.write_text(script)
    proc = subprocess.run([need("sbatch"), "--parsable", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        detail = " ".join(proc.stderr.split()) or f"exit code {proc.returncode}"
        raise common.BenchmarkError(f"sbatch refused the job ({detail}); the job script is {path}")
    job = proc.stdout.strip().split(";")[0]
    if not re.fullmatch(r"\d+", job):
        raise common.BenchmarkError(f"sbatch printed {proc.stdout.strip()!r}, not a job id; the job script is {path}")
    path.rename(logs / f"{job}.sh")
    return job


def active_tasks() -> set[tuple[str, int]]:
    """(job, task) of every array task of this user that Slurm still holds: pending, running or completing."""
    proc = subprocess.run(
        [need("squeue"), "--noheader", "--array", "--user", getpass.getuser(), "--format", "%i"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise common.BenchmarkError(f"squeue failed: {' '.join(proc.stderr.split()) or f'exit code {proc.returncode}'}")
    active = set()
    for line in proc.stdout.split():
        job, _, task = line.partition("_")
        if task.isdigit():
            active.add((job, int(task)))
    return active


def wait(jobs: Sequence[str], poll: float = POLL_SECONDS, tries: int = 5) -> None:
    """Until none of the jobs' tasks is left in the queue (a busy controller may fail a few squeue calls in a row)."""
    print(f"waiting for job {', '.join(jobs)} ...", flush=True)
    failures = 0
    while True:
        try:
            if not any(j in jobs for j, _ in active_tasks()):
                return
            failures = 0
        except common.BenchmarkError:
            failures += 1
            if failures >= tries:
                raise
        time.sleep(poll)


def task_failure(logs: Path, job: str, task: int, log: Path | None = None) -> str:
    """Why a task that left the queue failed, and where to look: '<job>_<task> exit code 1, log PATH: <its last line>'."""
    rc = exit_code(logs, job, task)
    how = f"exit code {rc}" if rc is not None else "ended without an exit code (cancelled, past its time limit, or node lost)"
    out = log_file(logs, job, task)
    where = f"log {log} (Slurm's output: {out})" if log is not None and log.exists() else f"log {out}"
    for path in (log, out):
        if path is not None and path.exists():
            last = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
            if last:
                return f"Slurm task {job}_{task} {how}, {where}: {last[-1]}"
    return f"Slurm task {job}_{task} {how}, {where}"
