#!/usr/bin/env bash
# Brings up a one-node Slurm cluster with accounting on this machine, as root, without systemd:
# munge -> mariadb -> slurmdbd -> slurmctld -> slurmd. Idempotent: installs only what is missing,
# rewrites a config only when its content changed (and then restarts the daemons that read it),
# starts only daemons that are not answering. Exits 0 once `sinfo` shows the node idle and `sacct`
# answers; non-zero with the failing step and its log otherwise.
#
#   sudo scripts/slurm_setup.sh            # ~30-40 s cold (apt install), ~1 s when already up
#
# The quick path. For several hosts (one network namespace per node), see scripts/slurm_cluster.sh;
# the two write the same /etc/slurm/slurm.conf, so the last one run decides the cluster's shape.
set -euo pipefail
SCRIPT=slurm-setup
source "$(dirname "$0")/slurm_lib.sh"
HOST=$(hostname -s)

require_root
refuse_foreign_slurm
install_packages
mkdir -p "$STATE/slurmd"

# The node line comes from `slurmd -C` (it reads no config) so sockets/cores/memory match what slurmd detects
# (a mismatch drains the node with "Low socket*core*thread count").
node_line=$(slurmd -C | head -n 1)
[[ $node_line == NodeName=* ]] || die "slurmd -C printed '$node_line', expected a NodeName= line"
slurm_conf="# Written by scripts/slurm_setup.sh (one-node cluster for CI and laptops).
$(slurm_conf_common "$HOST(127.0.0.1)" "$STATE/slurmd" "$RUN_DIR/slurmd.pid" "$LOG_DIR/slurmd.log")
SlurmdTimeout=60
$node_line State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
# Both configs before any daemon: sacctmgr (slurmdbd's readiness probe) reads slurm.conf.
dbd_changed=0
write_dbd_conf && dbd_changed=1
if write_slurm_conf "$slurm_conf" "$RUN_DIR/slurmd.pid"; then
  # A multi-node cluster's slurmds (scripts/slurm_cluster.sh) would keep registering with the new slurmctld.
  [ -x "$(dirname "$0")/slurm_cluster.sh" ] && bash "$(dirname "$0")/slurm_cluster.sh" down --keep-controller
fi
start_munge
start_accounting "$dbd_changed"
start_slurmctld
if ! pid_alive "$RUN_DIR/slurmd.pid"; then
  say "starting slurmd ..."
  spawn "$LOG_DIR/slurmd.log" /usr/sbin/slurmd
fi
node_ready "$HOST" "$LOG_DIR/slurmd.log"
wait_for sacct 30 "$LOG_DIR/slurmdbd.log" sacct -n -X --starttime=now-1hour

say "ready: cluster=$CLUSTER partition=$PARTITION node=$HOST ($(sinfo -h -n "$HOST" -o %T)), sacct answers"
