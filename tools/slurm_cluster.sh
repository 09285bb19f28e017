#!/usr/bin/env bash
# A one-node Slurm cluster on this machine for `make test-slurm`: slurmctld and slurmd on localhost with 2 CPUs,
# MUNGE for their authentication, everything (config, key, sockets, state, logs, pid files) under one folder.
#
#   bash tools/slurm_cluster.sh start DIR   # installs Slurm and MUNGE from Debian's packages where missing (as root,
#                                           # with apt-get), starts the daemons, waits for the node to be idle
#   SLURM_CONF=DIR/slurm.conf sbatch ...    # the cluster's clients find it through SLURM_CONF
#   bash tools/slurm_cluster.sh stop DIR    # cancels its jobs, stops the daemons it started (by their pid files)
#
# Nothing is written outside DIR but the packages: no /etc/slurm, no system MUNGE key, no service enabled, so a
# machine's own Slurm (a login node's) is left alone. Any step that fails ends the script with a line saying why and
# a non-zero exit code: the tests that need the cluster never run against a cluster that did not start.
set -euo pipefail

ACTION=${1:-}
DIR=${2:-/tmp/rl-bench-slurm}
CPUS=${SLURM_TEST_CPUS:-2}
CTLD_PORT=${SLURM_TEST_CTLD_PORT:-26817}
SLURMD_PORT=${SLURM_TEST_SLURMD_PORT:-26818}
PACKAGES=(slurmctld slurmd slurm-client munge)
BINARIES=(slurmctld slurmd sbatch squeue sinfo scontrol scancel munged mungekey)

die() {
  echo "slurm_cluster.sh: $*" >&2
  exit 1
}

find_binary() {  # munged and the daemons live in /usr/sbin, which a non-login root shell may lack on its PATH
  command -v "$1" 2>/dev/null || { [ -x "/usr/sbin/$1" ] && echo "/usr/sbin/$1"; } || true
}

install_missing() {
  local missing=()
  for b in "${BINARIES[@]}"; do
    [ -n "$(find_binary "$b")" ] || missing+=("$b")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    die "Slurm or MUNGE is missing (${missing[*]}) and this machine cannot install it (that needs root and apt-get): install Debian's ${PACKAGES[*]}, or their equivalents"
  fi
  echo "slurm_cluster.sh: installing ${PACKAGES[*]} (missing: ${missing[*]})"
  # Debian's packages start their services on install where a policy allows it; this cluster runs its own daemons.
  local policy=/usr/sbin/policy-rc.d added=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added=1
  fi
  local rc=0
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${PACKAGES[@]}" >/dev/null; } || rc=$?
  [ "$added" -eq 1 ] && rm -f "$policy"
  [ "$rc" -eq 0 ] || die "apt-get install ${PACKAGES[*]} failed (exit code $rc)"
  for b in "${BINARIES[@]}"; do
    [ -n "$(find_binary "$b")" ] || die "installed ${PACKAGES[*]}, but $b is still not found"
  done
}

alive() {  # alive PID: the process runs (a zombie waiting for its parent to reap it has stopped)
  [ -n "$1" ] && kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

pid_of() {  # pid_of FILE: the pid a daemon wrote, or nothing
  cat "$1" 2>/dev/null || true
}

log_tail() {
  [ -f "$1" ] && { echo "--- last lines of $1:"; tail -n 15 "$1"; } >&2 || true
}

write_config() {
  local host
  host=$(hostname -s)
  cat >"$DIR/slurm.conf" <<EOF
# A one-node test cluster written by tools/slurm_cluster.sh (make test-slurm); every path under $DIR.
ClusterName=rlbench
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=$(id -un)
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/slurmd
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerParameters=sched_interval=2
MinJobAge=60
KillWait=5
InactiveLimit=0
NodeName=localhost NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
  install_missing
  if alive "$(pid_of "$DIR/slurmctld.pid")" || alive "$(pid_of "$DIR/slurmd.pid")" \
    || alive "$(pid_of "$DIR/munge/munged.pid")"; then
    die "a cluster from $DIR is already running; stop it first: bash tools/slurm_cluster.sh stop $DIR"
  fi
  trap 'stop >/dev/null 2>&1 || true' EXIT  # a start that fails halfway leaves no daemon behind
  if [ -d "$DIR" ] && [ -n "$(ls -A "$DIR")" ] && ! grep -qs "written by tools/slurm_cluster.sh" "$DIR/slurm.conf"; then
    die "$DIR is not empty and holds no cluster of this script's; give another folder"
  fi
  rm -rf "$DIR"
  mkdir -p "$DIR/ctld" "$DIR/slurmd" "$DIR/munge"
  chmod 700 "$DIR/munge"
  export SLURM_CONF="$DIR/slurm.conf"
  write_config

  "$(find_binary mungekey)" --create --keyfile="$DIR/munge/munge.key" 2>"$DIR/munge/mungekey.log" \
    || { log_tail "$DIR/munge/mungekey.log"; die "mungekey could not create a key in $DIR/munge"; }
  chmod 400 "$DIR/munge/munge.key"
  "$(find_binary munged)" --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed" \
    || { log_tail "$DIR/munge/munged.log"; die "munged did not start"; }

  "$(find_binary slurmctld)" -f "$SLURM_CONF" \
    || { log_tail "$DIR/slurmctld.log"; die "slurmctld did not start"; }
  "$(find_binary slurmd)" -f "$SLURM_CONF" -N localhost \
    || { log_tail "$DIR/slurmd.log"; die "slurmd did not start"; }

  local state="" i name fatal
  for i in $(seq 1 60); do
    for name in slurmctld slurmd; do  # a daemon that stopped (a fatal error) will not come back: say why now
      if [ "$i" -gt 3 ] && ! alive "$(pid_of "$DIR/$name.pid")"; then
        log_tail "$DIR/$name.log"
        fatal=$(grep -h "fatal:" "$DIR/$name.log" 2>/dev/null | tail -n 1 | sed 's/^\[[^]]*\] //')
        die "$name exited${fatal:+ ($fatal)}; its log: $DIR/$name.log; the cluster is stopped"
      fi
    done
    state=$(sinfo -h -n localhost -o %T 2>/dev/null || true)
    case "$state" in
      idle) break ;;
      drain* | down*) break ;;
    esac
    sleep 1
  done
  if [ "$state" != idle ]; then
    log_tail "$DIR/slurmctld.log"
    log_tail "$DIR/slurmd.log"
    reason=$(sinfo -h -n localhost -o %E 2>/dev/null || true)
    die "the node did not become idle within 60 s (state: '${state:-no answer from slurmctld}'${reason:+, reason: $reason}); the cluster is stopped"
  fi
  trap - EXIT
  echo "slurm_cluster.sh: one-node cluster up ($CPUS CPUs, slurmctld on 127.0.0.1:$CTLD_PORT); clients: SLURM_CONF=$SLURM_CONF"
}

stop_pid() {  # stop_pid PID NAME: SIGTERM, up to 20 s for it to end, then SIGKILL
  local pid=$1 name=$2 i
  alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 40); do
    alive "$pid" || return 0
    sleep 0.5
  done
  echo "slurm_cluster.sh: $name (pid $pid) did not stop on SIGTERM; killing it" >&2
  kill -KILL "$pid" 2>/dev/null || true
}

stop() {
  [ -f "$DIR/slurm.conf" ] || { echo "slurm_cluster.sh: no cluster in $DIR"; return 0; }
  export SLURM_CONF="$DIR/slurm.conf"
  local ctld slurmd munged i
  ctld=$(pid_of "$DIR/slurmctld.pid")
  slurmd=$(pid_of "$DIR/slurmd.pid")
  munged=$(pid_of "$DIR/munge/munged.pid")
  if alive "$ctld"; then
    scancel --full --quiet --user "$(id -un)" 2>/dev/null || true  # this cluster's jobs only (SLURM_CONF)
    for i in $(seq 1 40); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  stop_pid "$slurmd" slurmd
  stop_pid "$ctld" slurmctld
  stop_pid "$munged" munged
  echo "slurm_cluster.sh: cluster in $DIR stopped"
}

case "$ACTION" in
  start) start ;;
  stop) stop ;;
  *) die "usage: bash tools/slurm_cluster.sh start|stop [DIR] (default DIR: /tmp/rl-bench-slurm)" ;;
esac
