#!/usr/bin/env bash
# Two (or more) fake nodes on this machine, for the multi-node tests (docs/cluster.md "Several nodes
# on one machine"):
#   tools/fake-nodes.sh [--nodes N] [--ranks-per-node R] [--state DIR] [--private NODE:DIR]... [--]
#                       COMMAND [ARG...]
# runs `mpirun -np N*R COMMAND ARG...` with R ranks on each of the fake nodes fakenode1..fakenodeN.
# Open MPI starts each node's daemon (orted) through this script as its rsh agent (plm_rsh_agent,
# as it would run ssh), which runs the daemon in its own UTS namespace (`unshare --uts`) with the
# node's host name, so MPI sees N hosts: shared memory between the ranks of a node, TCP over the
# loopback interface between nodes. The hostfile names the nodes by address, 127.0.0.2,
# 127.0.0.3, ... (all on lo), so nothing needs /etc/hosts.
#   --state DIR       writes DIR/fakenodeK.pid: the pid of node K's daemon (its ranks are its
#                     children), to stop a node as a test does
#   --private K:DIR   node K gets its own mount namespace with an empty tmpfs over DIR (a directory
#                     that differs per node, as a node-local disk does)
# Every other option of mpirun goes in MPIRUN_ARGS. Needs root or user namespaces (unshare) and
# Open MPI's rsh launcher. Exit code: mpirun's.
set -euo pipefail

if [ "${1:-}" = --agent ]; then
  # Open MPI calls: AGENT HOST COMMAND... (the daemon's command line, for a shell).
  shift
  host=$1; shift
  k=$(( ${host##*.} - 1 ))
  name=fakenode$k
  [ -z "${FAKE_NODES_STATE:-}" ] || echo $$ >"$FAKE_NODES_STATE/$name.pid"
  private=""
  for p in ${FAKE_NODES_PRIVATE:-}; do
    [ "${p%%:*}" = "$k" ] && private+="mount -t tmpfs fakenode-private '${p#*:}' && "
  done
  if [ -n "$private" ]; then
    exec unshare --uts --mount sh -c "hostname $name && ${private} exec sh -c \"\$0\"" "$*"
  fi
  exec unshare --uts sh -c "hostname $name && exec sh -c \"\$0\"" "$*"
fi

nodes=2 per_node=2 state="" private=""
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --ranks-per-node) per_node=$2; shift 2 ;;
    --state) state=$2; shift 2 ;;
    --private) private+="$2 "; shift 2 ;;
    --) shift; break ;;
    -*) echo "fake-nodes.sh: unknown option $1 (see the comment at the top of $0)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "fake-nodes.sh: no command to run (usage: tools/fake-nodes.sh [options] COMMAND...)" >&2; exit 2; }
case "$nodes$per_node" in *[!0-9]*) echo "fake-nodes.sh: --nodes and --ranks-per-node take numbers" >&2; exit 2 ;; esac
if [ "$nodes" -lt 1 ] || [ "$nodes" -gt 200 ] || [ "$per_node" -lt 1 ]; then
  echo "fake-nodes.sh: --nodes 1..200, --ranks-per-node >= 1" >&2; exit 2
fi
command -v unshare >/dev/null || { echo "fake-nodes.sh: needs unshare (util-linux)" >&2; exit 2; }
unshare --uts true 2>/dev/null || { echo "fake-nodes.sh: cannot make a UTS namespace here (needs root or user namespaces)" >&2; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d "${TMPDIR:-/tmp}/fake-nodes.XXXXXX")
trap 'rm -rf "$dir"' EXIT
for k in $(seq 1 "$nodes"); do echo "127.0.0.$((k + 1)) slots=$per_node"; done >"$dir/hostfile"
[ -z "$state" ] || mkdir -p "$state"
export FAKE_NODES_STATE=${state:+$(cd "$state" && pwd)} FAKE_NODES_PRIVATE=$private
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck disable=SC2086
mpirun --hostfile "$dir/hostfile" --mca plm_rsh_agent "$here/fake-nodes.sh --agent" \
  --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --mca btl self,vader,tcp \
  -np $((nodes * per_node)) --map-by ppr:"$per_node":node ${MPIRUN_ARGS:-} "$@"
