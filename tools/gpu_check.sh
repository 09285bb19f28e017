#!/usr/bin/env bash
# The device checks, in one call on a lent GPU machine (`device` tool: carry [".gpu"], command `bash tools/gpu_check.sh`,
# timeout_s 600). Unpacks tools/gpu_bundle.sh's archive, then: the GPU resume tests, and the flagship's training SPS
# with --cuda and --no-cuda alternating on one machine. Logs and CSVs go to $OUT (or .gpu/out elsewhere).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-.gpu/out}
mkdir -p "$OUT" /tmp/gpu
tar -xJf .gpu/site.tar.xz -C /tmp/gpu || exit 1
export PYTHONPATH=/tmp/gpu/site PYTHONUNBUFFERED=1 MKL_CBWR=AUTO,STRICT
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 --version; } 2>&1 |
  tee "$OUT/machine.txt"
# A package that does not import would send the scripts to another backend (gymnasium's envs, not EnvPool's): stop.
python3 -c "import torch, gymnasium, dm_control, shimmy, envpool, tyro, mujoco; print('torch', torch.__version__)" \
  2>&1 | tee -a "$OUT/machine.txt"
if [ "${PIPESTATUS[0]}" -ne 0 ]; then
  echo "gpu_check: the env stack does not import; rebuild it with tools/gpu_bundle.sh"
  exit 1
fi
timeout 240 python3 -m pytest -q -k resumed_gpu_run tests/test_cli_contract.py 2>&1 | tee "$OUT/pytest.log"
for round in 1 2; do
  for device in --cuda --no-cuda; do
    timeout 120 python3 benchmarks/throughput.py --algo vmpo_continuous --steps 40960 --random-steps 10000 \
      --tag "flagship $device, round $round" --csv "$OUT/throughput.csv" -- --env-id dm_control/walker/walk "$device" \
      2>&1 | tail -4 | tee -a "$OUT/throughput.log"
  done
done
