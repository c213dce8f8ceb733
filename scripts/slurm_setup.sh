#!/usr/bin/env bash
# Brings up a one-node Slurm cluster with accounting on this machine, as root, without systemd:
# munge -> mariadb -> slurmdbd -> slurmctld -> slurmd. Idempotent: installs only what is missing,
# rewrites a config only when its content changed (and then restarts the daemons that read it),
# starts only daemons that are not answering. Exits 0 once `sinfo` shows the node idle and `sacct`
# answers; non-zero with the failing step and its log otherwise.
#
#   sudo scripts/slurm_setup.sh            # ~30-40 s cold (apt install), ~1 s when already up
#
# Why accounting: TorchX 0.7's Slurm scheduler reads job state only through `sacct`, so
# `torchx run --wait` / `torchx status` need slurmdbd (backed by MariaDB).
# Why these plugins: containers have no cgroups, hence proctrack/linuxproc + task/none.
set -euo pipefail

CLUSTER=${SLURM_CLUSTER_NAME:-arctic}
PARTITION=${SLURM_PARTITION:-debug}
DB_PASS=${SLURM_DB_PASS:-arctic-slurmdbd}
LOG_DIR=/var/log/slurm
HOST=$(hostname -s)
t0=$(date +%s)

say() { echo "[slurm-setup +$(($(date +%s) - t0))s] $*"; }
die() { echo "[slurm-setup] ERROR: $*" >&2; exit 1; }

# Waits until "$@" succeeds, polling every 0.5 s; on timeout prints the log tail and fails.
wait_for() {
  local what=$1 timeout=$2 log=$3; shift 3
  local deadline=$(($(date +%s) + timeout))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "[slurm-setup] ERROR: $what not ready after ${timeout}s; last lines of $log:" >&2
      tail -n 20 "$log" >&2 2>/dev/null || true
      exit 1
    fi
    sleep 0.5
  done
}

# Writes $2 (content) to $1 when different; returns 0 when the file changed.
write_if_changed() {
  local path=$1 content=$2
  if [ -f "$path" ] && [ "$(cat "$path")" = "$content" ]; then return 1; fi
  printf '%s\n' "$content" >"$path"
  return 0
}

# Runs a daemon detached from our stdout/stderr so that a caller reading our output (pytest's
# subprocess pipe) does not wait for the daemon to exit.
spawn() { local log=$1; shift; setsid "$@" </dev/null >>"$log" 2>&1 & }

stop_pidfile() {
  local pidfile=$1
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill "$(cat "$pidfile")"
    for _ in $(seq 40); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.25; done
  fi
  rm -f "$pidfile"
}

[ "$(id -u)" -eq 0 ] || die "run as root (found uid $(id -u)): the daemons and apt-get need it"

# 1. packages ----------------------------------------------------------------------------------
need=()
for pair in slurmctld:slurm-wlm slurmdbd:slurmdbd munged:munge mariadbd:mariadb-server; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]} (apt-get) ..."
  # policy-rc.d blocks the packages' postinst from trying to start services (no init system here).
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq slurm-wlm slurmdbd munge mariadb-server >/tmp/slurm-setup-apt.log 2>&1 \
    || { tail -n 20 /tmp/slurm-setup-apt.log >&2; die "apt-get install failed (log: /tmp/slurm-setup-apt.log)"; }
fi
mkdir -p "$LOG_DIR" /var/spool/slurmctld /var/spool/slurmd /etc/slurm /run/munge /run/mysqld
chown munge:munge /run/munge && chown mysql:mysql /run/mysqld

# 2. munge --------------------------------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
  say "creating the munge key ..."
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
# `munge -n` (not pgrep) is the reliable liveness probe: a stale pid file or socket fools pgrep.
if ! munge -n >/dev/null 2>&1; then
  say "starting munged ..."
  rm -f /run/munge/munge.socket.2*
  runuser -u munge -- /usr/sbin/munged --force >>"$LOG_DIR/munged.log" 2>&1
  wait_for munged 15 /var/log/munge/munged.log munge -n
fi

# 3. mariadb + the slurmdbd database user --------------------------------------------------------
if ! mariadb-admin ping >/dev/null 2>&1; then
  if [ ! -d /var/lib/mysql/mysql ]; then
    say "initialising the MariaDB data directory ..."
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql >>"$LOG_DIR/mariadb.log" 2>&1
  fi
  say "starting mariadbd ..."
  spawn "$LOG_DIR/mariadb.log" /usr/sbin/mariadbd --user=mysql --datadir=/var/lib/mysql \
    --socket=/run/mysqld/mysqld.sock --bind-address=127.0.0.1
  wait_for mariadbd 60 "$LOG_DIR/mariadb.log" mariadb-admin ping
fi
# Root logs in over the unix socket; slurmdbd connects over TCP with its own password.
mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"

# 4. configs --------------------------------------------------------------------------------------
# The node line comes from `slurmd -C` so sockets/cores/memory match what slurmd detects (a mismatch
# drains the node with "Low socket*core*thread count").
node_line=$(slurmd -C | head -n 1)
[[ $node_line == NodeName=* ]] || die "slurmd -C printed '$node_line', expected a NodeName= line"
slurm_conf="# Written by scripts/slurm_setup.sh (one-node cluster for CI and laptops).
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=300
KillWait=10
JobRequeue=1
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
$node_line State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
dbd_conf="# Written by scripts/slurm_setup.sh.
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=/run/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db"
slurm_changed=0; dbd_changed=0
write_if_changed /etc/slurm/slurm.conf "$slurm_conf" && slurm_changed=1
write_if_changed /etc/slurm/slurmdbd.conf "$dbd_conf" && dbd_changed=1
# slurmdbd refuses a config readable by others (it holds the DB password).
chmod 600 /etc/slurm/slurmdbd.conf

# 5. slurmdbd + the cluster record ------------------------------------------------------------------
[ $dbd_changed -eq 1 ] && stop_pidfile /run/slurmdbd.pid
if ! sacctmgr -n show cluster >/dev/null 2>&1; then
  stop_pidfile /run/slurmdbd.pid
  say "starting slurmdbd ..."
  spawn "$LOG_DIR/slurmdbd.log" /usr/sbin/slurmdbd
  wait_for slurmdbd 60 "$LOG_DIR/slurmdbd.log" sacctmgr -n show cluster
fi
if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER"; then
  say "registering cluster '$CLUSTER' in accounting ..."
  sacctmgr -i add cluster "$CLUSTER" >/dev/null
fi

# 6. slurmctld + slurmd ---------------------------------------------------------------------------
if [ $slurm_changed -eq 1 ]; then stop_pidfile /run/slurmd.pid; stop_pidfile /run/slurmctld.pid; fi
if ! scontrol ping 2>/dev/null | grep -q UP; then
  stop_pidfile /run/slurmctld.pid
  say "starting slurmctld ..."
  spawn "$LOG_DIR/slurmctld.log" /usr/sbin/slurmctld
  wait_for slurmctld 60 "$LOG_DIR/slurmctld.log" bash -c 'scontrol ping | grep -q UP'
fi
if ! { [ -f /run/slurmd.pid ] && kill -0 "$(cat /run/slurmd.pid)" 2>/dev/null; }; then
  say "starting slurmd ..."
  spawn "$LOG_DIR/slurmd.log" /usr/sbin/slurmd
fi
# A node left DOWN/DRAIN by an earlier run (e.g. slurmd killed) comes back with RESUME.
state=$(sinfo -h -n "$HOST" -o %T 2>/dev/null || true)
case $state in down*|drain*|fail*) scontrol update NodeName="$HOST" State=RESUME || true ;; esac
# A busy node (jobs still running from an earlier test) also counts as up.
wait_for "node $HOST idle" 60 "$LOG_DIR/slurmd.log" \
  bash -c "sinfo -h -n '$HOST' -o %T | grep -Eq '^(idle|mixed|allocated|completing)'"
wait_for sacct 30 "$LOG_DIR/slurmdbd.log" sacct -n -X --starttime=now-1hour

say "ready: cluster=$CLUSTER partition=$PARTITION node=$HOST ($(sinfo -h -n "$HOST" -o %T)), sacct answers"
