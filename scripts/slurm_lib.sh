# Shared by scripts/slurm_setup.sh (one node) and scripts/slurm_cluster.sh (one namespace per node):
# packages, munge, MariaDB + slurmdbd, and the helpers both use. Sourced, not run.
# Why accounting: TorchX 0.7's Slurm scheduler reads job state only through `sacct`, so
# `torchx run --wait` / `torchx status` need slurmdbd (backed by MariaDB).

# What the scripts create, and nothing else, is theirs to remove (`scripts/slurm_cluster.sh purge`):
# - under $STATE: the accounting database (its own MariaDB instance, port $DB_PORT, so a site's MariaDB is
#   never touched), the spool and state folders, pid files and logs;
# - outside it: /etc/slurm/slurm.conf and slurmdbd.conf, whose first line is $MARK (a config without it is a
#   site's own Slurm: the scripts refuse to run rather than replace it), and what $OWNED lists (munged, if
#   they started it; the munge key, if they created it).
CLUSTER=${SLURM_CLUSTER_NAME:-arctic}
PARTITION=${SLURM_PARTITION:-debug}
DB_PASS=${SLURM_DB_PASS:-arctic-slurmdbd}
DB_PORT=${SLURM_DB_PORT:-3307}
STATE=/var/lib/arctic-rl-slurm
OWNED=$STATE/owned
LOG_DIR=$STATE/log
RUN_DIR=$STATE/run
DB_DIR=$STATE/mysql
DB_RUN=$STATE/mysqld
DB_SOCK=$DB_RUN/mysqld.sock
MARK="# Written by scripts/slurm_"
SLURM_CONF_FILE=/etc/slurm/slurm.conf
DBD_CONF_FILE=/etc/slurm/slurmdbd.conf
t0=$(date +%s)

say() { echo "[$SCRIPT +$(($(date +%s) - t0))s] $*"; }
die() { echo "[$SCRIPT] ERROR: $*" >&2; exit 1; }

# Waits until "$@" succeeds, polling every 0.5 s; on timeout prints the log tail and fails.
wait_for() {
  local what=$1 timeout=$2 log=$3; shift 3
  local deadline=$(($(date +%s) + timeout))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "[$SCRIPT] ERROR: $what not ready after ${timeout}s; last lines of $log:" >&2
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

# The CPUs a node offers: those this process may run on. Not plain `nproc`, which answers OMP_NUM_THREADS (and
# OMP_THREAD_LIMIT) when set: make test sets OMP_NUM_THREADS=1, and a node written with CPUs=1 refused the jobs
# tests' `--cpus_per_node 2` ("CPU count per node can not be satisfied", seen in CI).
machine_cpus() { env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc; }

# The daemon of pid file $1 is alive: the pid names a live (not zombie) process that is one of the daemons these
# scripts start. `kill -0` alone is not enough: this machine's pid_max can be 32768, and a test run starts enough
# processes to wrap it within the hour (seen: a node's slurmd restarted with a pid below its predecessor's). A dead
# daemon's pid can then name an unrelated process, which `up` took for the daemon (a killed node's slurmd was not
# started again) and `down` or a config change would have killed.
pid_alive() {
  local pid comm state
  [ -f "$1" ] && pid=$(cat "$1" 2>/dev/null) && [[ $pid =~ ^[0-9]+$ ]] || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  case $comm in slurmd | slurmctld | slurmdbd | munged | mariadbd | mysqld) ;; *) return 1 ;; esac
  state=$(sed -n 's/^.*) \(.\).*$/\1/p' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

stop_pidfile() {
  local pidfile=$1 pid
  if pid_alive "$pidfile"; then
    pid=$(cat "$pidfile")  # read once: the daemon removes its pid file as it exits
    kill "$pid"
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

APT_LOCK=/run/arctic-rl-apt.lock
require_root() { [ "$(id -u)" -eq 0 ] || die "run as root (found uid $(id -u)): the daemons and apt-get need it"; }

# A config these scripts wrote (first line $MARK)? Missing counts as ours to write.
conf_is_ours() { [ ! -e "$1" ] || [[ $(head -n 1 "$1") == "$MARK"* ]]; }

# Before anything is installed, written or started: a site's own Slurm config is never replaced.
refuse_foreign_slurm() {
  local f
  for f in "$SLURM_CONF_FILE" "$DBD_CONF_FILE"; do
    conf_is_ours "$f" || die "$f exists and was not written by these scripts (its first line is not '$MARK...'):
  this machine has a Slurm of its own, which the test cluster would replace. Submit the jobs to that Slurm
  (docs/jobs.md), or move $f aside to use the test cluster here."
  done
}

# Records that the scripts created $1 outside $STATE (purge removes only what is recorded).
own() { mkdir -p "$STATE"; grep -qx "$1" "$OWNED" 2>/dev/null || echo "$1" >>"$OWNED"; }
owns() { grep -qx "$1" "$OWNED" 2>/dev/null; }

# 1. packages -------------------------------------------------------------------------------------
install_packages() {
  local need=() pair
  for pair in slurmctld:slurm-wlm slurmdbd:slurmdbd munged:munge mariadbd:mariadb-server; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
  done
  if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]} (apt-get) ..."
    # policy-rc.d blocks the packages' postinst from trying to start services (no init system here).
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    export DEBIAN_FRONTEND=noninteractive
    # `make test` builds SkyRL's environment alongside, which may apt-get too: one apt at a time (APT_LOCK).
    flock "$APT_LOCK" apt-get update -qq >/dev/null
    flock "$APT_LOCK" apt-get install -y -qq slurm-wlm slurmdbd munge mariadb-server >/tmp/slurm-setup-apt.log 2>&1 \
      || { tail -n 20 /tmp/slurm-setup-apt.log >&2; die "apt-get install failed (log: /tmp/slurm-setup-apt.log)"; }
  fi
  mkdir -p "$LOG_DIR" "$RUN_DIR" "$STATE/slurmctld" /etc/slurm /run/munge "$DB_RUN"
  chown munge:munge /run/munge && chown mysql:mysql "$DB_RUN"
}

# 2. munge ----------------------------------------------------------------------------------------
# One munged for every node: its socket is on the file system all "hosts" share, as a cluster's nodes
# share the munge key.
# The key the munge package made at install is the machine's, not ours: used as it is, never removed.
start_munge() {
  if [ ! -s /etc/munge/munge.key ]; then
    say "creating the munge key ..."
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    own munge-key
  fi
  # `munge -n` (not pgrep) is the reliable liveness probe: a stale pid file or socket fools pgrep.
  if ! munge -n >/dev/null 2>&1; then
    say "starting munged ..."
    rm -f /run/munge/munge.socket.2*
    runuser -u munge -- /usr/sbin/munged --force >>"$LOG_DIR/munged.log" 2>&1
    own munged
    wait_for munged 15 /var/log/munge/munged.log munge -n
  fi
}

# 3. The configs, all written before any daemon or client that reads them starts -------------------
# (sacctmgr, which says when slurmdbd is up, reads slurm.conf: on a fresh machine it must exist first.)

# Writes slurmdbd.conf; returns 0 when it changed.
write_dbd_conf() {
  local changed=1
  write_if_changed "$DBD_CONF_FILE" "# Written by scripts/slurm_lib.sh.
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$RUN_DIR/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db" && changed=0
  # slurmdbd refuses a config readable by others (it holds the DB password).
  chmod 600 "$DBD_CONF_FILE"
  return $changed
}

# Writes slurm.conf ($1 = its content); on a change stops the daemons that read it ($2... = slurmd pid
# files) so that they start again on the new one. Returns 0 when it changed.
write_slurm_conf() {
  local conf=$1 pidfile; shift
  write_if_changed "$SLURM_CONF_FILE" "$conf" || return 1
  stop_pidfile "$RUN_DIR/slurmctld.pid"
  for pidfile in "$@"; do stop_pidfile "$pidfile"; done
  return 0
}

# 4. MariaDB (our own instance) + slurmdbd + the cluster record -----------------------------------
db() { mariadb --socket="$DB_SOCK" "$@"; }

start_accounting() {
  local dbd_changed=$1
  if ! mariadb-admin --socket="$DB_SOCK" ping >/dev/null 2>&1; then
    if [ ! -d "$DB_DIR/mysql" ]; then
      say "initialising the accounting database ($DB_DIR) ..."
      mkdir -p "$DB_DIR" && chown mysql:mysql "$DB_DIR"
      mariadb-install-db --user=mysql --datadir="$DB_DIR" --auth-root-authentication-method=socket \
        >>"$LOG_DIR/mariadb.log" 2>&1 || { tail -n 20 "$LOG_DIR/mariadb.log" >&2; die "mariadb-install-db failed"; }
    fi
    say "starting mariadbd (port $DB_PORT) ..."
    spawn "$LOG_DIR/mariadb.log" /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB_DIR" \
      --socket="$DB_SOCK" --pid-file="$DB_RUN/mysqld.pid" --port="$DB_PORT" --bind-address=127.0.0.1 \
      --log-error="$LOG_DIR/mariadb.log"
    wait_for mariadbd 60 "$LOG_DIR/mariadb.log" mariadb-admin --socket="$DB_SOCK" ping
  fi
  # Root logs in over the unix socket; slurmdbd connects over TCP with its own password.
  db -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    FLUSH PRIVILEGES;"
  [ "$dbd_changed" -eq 1 ] && stop_pidfile "$RUN_DIR/slurmdbd.pid"
  if ! sacctmgr -n show cluster >/dev/null 2>&1; then
    stop_pidfile "$RUN_DIR/slurmdbd.pid"
    say "starting slurmdbd ..."
    spawn "$LOG_DIR/slurmdbd.log" /usr/sbin/slurmdbd
    wait_for slurmdbd 60 "$LOG_DIR/slurmdbd.log" sacctmgr -n show cluster
  fi
  if ! grep -qx "$CLUSTER" <<<"$(sacctmgr -n -P show cluster format=cluster)"; then
    say "registering cluster '$CLUSTER' in accounting ..."
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
  fi
}

# slurm.conf's lines common to both shapes; $1 = SlurmctldHost value, $2 = SlurmdSpoolDir, $3 = SlurmdPidFile,
# $4 = slurmd log file.
# Why these plugins: containers have no cgroups, hence proctrack/linuxproc + task/none.
slurm_conf_common() {
  cat <<CONF
ClusterName=$CLUSTER
SlurmctldHost=$1
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
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$2
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$3
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$4
SlurmctldTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=10
JobRequeue=1
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
CONF
}

# Starts slurmctld unless it answers (write_slurm_conf stopped it if its config changed).
start_slurmctld() {
  if [[ $(scontrol ping 2>/dev/null) != *UP* ]]; then
    stop_pidfile "$RUN_DIR/slurmctld.pid"
    say "starting slurmctld ..."
    spawn "$LOG_DIR/slurmctld.log" /usr/sbin/slurmctld
    wait_for slurmctld 60 "$LOG_DIR/slurmctld.log" bash -c 'scontrol ping | grep -q UP'
  fi
}

# Node $1 back to service if an earlier run left it DOWN/DRAIN, then wait until it is usable and answering.
# A node that is DOWN because its slurmd stopped answering comes back by itself once its slurmd registers
# (ReturnToService=2); a RESUME sent before that leaves it idle* (up, not responding), which is no node to give a
# job step. So a down node gets its slurmd's registration first (30 s), and a RESUME only if it is still down;
# drained and failed nodes need the RESUME. Ready means answering: `idle`, not `idle*`.
node_ready() {
  local node=$1 log=$2 state
  state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
  case $state in drain* | fail*) scontrol update NodeName="$node" State=RESUME || true ;; esac
  if [[ $state == down* ]]; then
    for _ in $(seq 60); do
      [[ $(sinfo -h -n "$node" -o %T 2>/dev/null) == down* ]] || break
      sleep 0.5
    done
    [[ $(sinfo -h -n "$node" -o %T 2>/dev/null) == down* ]] && { scontrol update NodeName="$node" State=RESUME || true; }
  fi
  # A busy node (jobs still running from an earlier test) also counts as up.
  wait_for "node $node idle" 60 "$log" \
    bash -c "sinfo -h -n '$node' -o %T | grep -Eq '^(idle|mixed|allocated|completing)\$'"
}
