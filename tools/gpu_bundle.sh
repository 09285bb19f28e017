#!/usr/bin/env bash
# Pack what a lent GPU machine lacks into .gpu/site.tar.xz (ignored by git), for the `device` tool's carry.
#
# That machine has Python 3.12 with torch, numpy, scipy, pytest, tensorboard, imageio and the like, and none of the
# env packages. This installs the pinned env stack (versions from .venv, so `make .venv/.installed` first) for
# CPython 3.12 into one folder, drops what the scripts never load there (EnvPool's engines but its control suite and
# gymnasium MuJoCo ports, dm_control's locomotion assets, MuJoCo's experimental and Filament modules: the whole stack
# is near 500 MB, the carry limit 64 MiB with the repository), and compresses it. Then, on the device, in one call:
# `bash tools/gpu_check.sh` (CONTRIBUTING.md).
set -euo pipefail
cd "$(dirname "$0")/.."
NAMES="gymnasium farama-notifications dm-control dm-env dm-tree labmaze mujoco glfw pyopengl websockets shimmy
tyro docstring-parser typeguard envpool optree types-protobuf"
FREEZE=$(.venv/bin/python -m pip freeze)
PINS=()
for name in $NAMES; do
  pin=$(grep -i "^${name//-/[-_]}==" <<<"$FREEZE") || { echo "gpu_bundle: $name is not in .venv; run make first" >&2; exit 1; }
  PINS+=("$pin")
done
rm -rf .gpu/site && mkdir -p .gpu
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
.venv/bin/python -m pip install -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" --target .gpu/site "${PINS[@]}"
for engine in atari box2d classic_control gfootball highway minigrid procgen toy_text vizdoom \
  mujoco/robotics mujoco/metaworld; do
  rm -rf ".gpu/site/envpool/$engine"
done
# `import envpool` imports every engine's registration: keep the two MuJoCo ones, whose envs the scripts use.
sed -i '/^import envpool\./{/envpool\.mujoco\.\(dmc\|gym\)\.registration/!d}' .gpu/site/envpool/entry.py
rm -rf .gpu/site/envpool/mujoco/robotics_envpool.so .gpu/site/dm_control/locomotion .gpu/site/mujoco/experimental
rm -f .gpu/site/mujoco/_render_filament*
find .gpu/site -name __pycache__ -prune -exec rm -rf {} +
tar -cJf .gpu/site.tar.xz -C .gpu site
rm -rf .gpu/site
echo "gpu_bundle: $(du -h .gpu/site.tar.xz | cut -f1) in .gpu/site.tar.xz (${#PINS[@]} packages); carry .gpu"
