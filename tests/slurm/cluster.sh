#!/usr/bin/env bash
# A real single-node Slurm on this machine for the job-script tests (tests/slurm/run.sh):
#   tests/slurm/cluster.sh start DIR   starts munged, slurmctld, slurmd with state under DIR and
#                                      prints the SLURM_CONF to export; the node has
#                                      2 CPUs and one stand-in GPU (GRES gpu:1)
#   tests/slurm/cluster.sh start DIR 2 the same with two nodes, fakenode1 and fakenode2, of 2 CPUs
#                                      each: two slurmd (slurmd -N NAME, one port each), each in its
#                                      own UTS namespace with its node's host name, so that the ranks
#                                      of a job see two hosts (MPI's shared-memory split included),
#                                      and its own mount namespace with a tmpfs as TmpFS; no GPU
#   tests/slurm/cluster.sh stop DIR    stops what start started, by process id
# Needs root and the packages slurm-wlm and munge (tools/install-deps.sh --slurm).
set -euo pipefail
cmd=${1:?start|stop}; T=${2:?state directory}; nodes=${3:-1}
host=$(hostname -s)
case $cmd in
start)
  mkdir -p "$T"/{state,spool,log}
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  fi
  # munged runs as the munge user: its socket, pid, log and seed live in a directory it owns.
  mkdir -p "$T/munge"; chown munge:munge "$T/munge"; chmod 755 "$T"
  sock="$T/munge/munge.socket"
  runuser -u munge -- /usr/sbin/munged --socket="$sock" --pid-file="$T/munge/munged.pid" \
    --log-file="$T/munge/munged.log" --seed-file="$T/munge/munge.seed"
  port=$(( 20000 + RANDOM % 20000 ))
  cat > "$T/slurm.conf" <<CONF
ClusterName=meshmoetest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd-%n.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd-%n.log
SlurmctldPort=$port
SlurmdPort=$((port + 1))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
KillWait=10
InactiveLimit=0
MinJobAge=600
GresTypes=gpu
CONF
  if [ "$nodes" = 2 ]; then
    cat >> "$T/slurm.conf" <<CONF
TmpFS=$T/tmp
NodeName=fakenode1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 2)) CPUs=2 State=UNKNOWN
NodeName=fakenode2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 3)) CPUs=2 State=UNKNOWN
PartitionName=test Nodes=fakenode1,fakenode2 Default=YES MaxTime=INFINITE State=UP
CONF
  else
    cat >> "$T/slurm.conf" <<CONF
NodeName=$host CPUs=2 Gres=gpu:1 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
  fi
  # One stand-in GPU (this machine has none; /dev/null as its device file), so that GPU jobs
  # (--gpus-per-task=1) are scheduled here and Slurm sets CUDA_VISIBLE_DEVICES for them.
  printf 'AutoDetect=off\nNodeName=%s Name=gpu File=/dev/null Count=1\n' "$host" > "$T/gres.conf"
  export SLURM_CONF="$T/slurm.conf"
  /usr/sbin/slurmctld -f "$SLURM_CONF"
  if [ "$nodes" = 2 ]; then
    for n in fakenode1 fakenode2; do
      mkdir -p "$T/spool/$n" "$T/tmp"
      # and its own TmpFS (PMIx's per-step directories there have the same names on both nodes)
      unshare --uts --mount sh -c "hostname $n && mount -t tmpfs $n-tmp '$T/tmp' && exec /usr/sbin/slurmd -f '$SLURM_CONF' -N $n"
    done
  else
    mkdir -p "$T/spool/$host"
    /usr/sbin/slurmd -f "$SLURM_CONF"
  fi
  for _ in $(seq 60); do
    state=$(sinfo -h -o %T 2>/dev/null | sort -u | tr '\n' ' ')
    [ "$state" = "idle " ] && { echo "$SLURM_CONF"; exit 0; }
    sleep 0.5
  done
  echo "slurm did not come up; logs in $T/log" >&2
  tail -20 "$T"/log/*.log >&2 || true
  exit 1
  ;;
stop)
  for f in $(cd "$T" && ls slurmd-*.pid 2>/dev/null) slurmctld.pid munge/munged.pid; do
    [ -s "$T/$f" ] || continue
    pid=$(cat "$T/$f")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
  done
  ;;
*) echo "usage: cluster.sh start|stop DIR" >&2; exit 2 ;;
esac
