#!/usr/bin/env bash
# A multi-host Slurm cluster on one machine, for tests and for anyone without a cluster (as root):
#
#   sudo scripts/slurm_cluster.sh up [--nodes N]     # default 2; idempotent, ~5 s when packages are in
#   sudo scripts/slurm_cluster.sh down               # stops the slurmds, removes namespaces and bridge
#   sudo scripts/slurm_cluster.sh purge              # down, then every daemon and file these scripts made:
#                                                    # the next `up` starts from nothing (what `make test` does)
#   scripts/slurm_cluster.sh status                  # one line per node
#
# Each compute node is a Linux network namespace with its own address on a bridge this script creates
# and its own hostname (a UTS namespace): arctic-n1 = 10.213.0.11, arctic-n2 = 10.213.0.12, ...
# slurmctld, slurmdbd (MariaDB) and munged run on the host, which holds 10.213.0.1 on the bridge; one
# slurmd per namespace, with its own spool folder and pid file. The file system is shared by all nodes
# as NFS is on a real cluster; munge authenticates over its socket on that shared file system.
# The namespaces get no default route: their traffic stays on the bridge. Names resolve through a
# marked block in /etc/hosts. Namespaces share the PID space: stop processes by pid, never `ray stop`.
#
# slurmd runs under `nsenter --net=... unshare --uts`, not `ip netns exec`: the latter remounts /sys
# and slurmd then dies ("No filesystem mounted on /sys/fs/cgroup").
# Exit codes: 0 up; 3 this kernel refuses network namespaces (one line says why; scripts/slurm_setup.sh
# is the one-node fallback, and the multi-node tests skip naming the reason written to $REFUSED).
set -euo pipefail
SCRIPT=slurm-cluster
source "$(dirname "$0")/slurm_lib.sh"

NET=${ARCTIC_SLURM_NET:-10.213.0}
BRIDGE=arctic-br0
NODE_PREFIX=arctic-n
REFUSED=/run/arctic-slurm-cluster.refused
HOSTS_BEGIN="# arctic-rl slurm_cluster.sh begin"
HOSTS_END="# arctic-rl slurm_cluster.sh end"

node_name() { echo "$NODE_PREFIX$1"; }
node_addr() { echo "$NET.$((10 + $1))"; }
node_pidfile() { echo "$RUN_DIR/slurmd-$(node_name "$1").pid"; }

# The nodes this script made, from the namespaces that exist (so `down` needs no --nodes).
existing_nodes() { ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^$NODE_PREFIX\([0-9]\+\)$/\1/p" | sort -n; }

# Every process inside namespace $1, then SIGKILL after a grace period (a node's Ray, jobs, slurmd).
kill_namespace_procs() {
  local ns=$1 pids
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [ -n "$pids" ] || return 0
  kill $pids 2>/dev/null || true
  for _ in $(seq 20); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true); [ -n "$pids" ] || return 0; sleep 0.25
  done
  kill -9 $pids 2>/dev/null || true
}

write_hosts() {
  local n=$1 i block="$HOSTS_BEGIN"$'\n'"$NET.1 arctic-ctl"
  for i in $(seq 1 "$n"); do block+=$'\n'"$(node_addr "$i") $(node_name "$i")"; done
  block+=$'\n'"$HOSTS_END"
  local rest
  rest=$(sed "/^$HOSTS_BEGIN\$/,/^$HOSTS_END\$/d" /etc/hosts)
  printf '%s\n%s\n' "$rest" "$block" >/etc/hosts.arctic-tmp
  cat /etc/hosts.arctic-tmp >/etc/hosts && rm -f /etc/hosts.arctic-tmp   # in place: /etc/hosts may be a mount
}

network_up() {
  local n=$1 i ns veth err
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    if ! err=$(ip link add "$BRIDGE" type bridge 2>&1); then refuse "cannot create bridge $BRIDGE: $err"; fi
  fi
  # (Captured, not piped into grep -q: under pipefail an early grep exit fails the pipe with SIGPIPE.)
  [[ $(ip addr show dev "$BRIDGE") == *"inet $NET.1/"* ]] || ip addr add "$NET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for i in $(seq 1 "$n"); do
    ns=$(node_name "$i"); veth="arctic-v$i"
    if [ ! -e "/run/netns/$ns" ]; then
      if ! err=$(ip netns add "$ns" 2>&1); then refuse "ip netns add $ns failed: $err"; fi
    fi
    if ! ip link show "$veth" >/dev/null 2>&1; then
      ip link add "$veth" type veth peer name eth0 netns "$ns"
    fi
    ip link set "$veth" master "$BRIDGE" up
    ip -n "$ns" link set lo up
    [[ $(ip -n "$ns" addr show dev eth0) == *"inet $(node_addr "$i")/"* ]] \
      || ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
}

refuse() {
  echo "[$SCRIPT] network namespaces refused here: $*" | tee "$REFUSED" >&2
  exit 3
}

start_slurmd() {
  local i=$1 name pidfile
  name=$(node_name "$i"); pidfile=$(node_pidfile "$i")
  pid_alive "$pidfile" && return 0
  mkdir -p "$STATE/slurmd-$name"
  say "starting slurmd on $name ($(node_addr "$i")) ..."
  # Its own hostname for slurmd and everything it starts (job steps see `hostname` = the node).
  spawn "$LOG_DIR/slurmd-$name.log" nsenter --net="/run/netns/$name" unshare --uts \
    sh -c "hostname $name && exec /usr/sbin/slurmd -N $name"
}

up() {
  local n=$1 i node_lines="" cpus mem pidfiles=()
  require_root
  refuse_foreign_slurm
  install_packages
  network_up "$n"
  rm -f "$REFUSED"
  write_hosts "$n"
  # Every node reports the machine's CPUs and memory (slurmd -C reads no config); they overlap, as the
  # "hosts" do.
  cpus=$(machine_cpus); mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n 1)
  for i in $(seq 1 "$n"); do
    node_lines+="NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") NodeHostname=$(node_name "$i") CPUs=$cpus RealMemory=$mem State=UNKNOWN"$'\n'
  done
  # slurmctld accepts only the machine's own name, reached at the bridge address.
  local conf="# Written by scripts/slurm_cluster.sh ($n nodes, one network namespace each).
$(slurm_conf_common "$(hostname -s)($NET.1)" "$STATE/slurmd-%n" "$RUN_DIR/slurmd-%n.pid" "$LOG_DIR/slurmd-%n.log")
SlurmdTimeout=${ARCTIC_SLURMD_TIMEOUT_S:-20}
${node_lines}PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  # Both configs before any daemon: sacctmgr (slurmdbd's readiness probe) reads slurm.conf.
  local dbd_changed=0
  write_dbd_conf && dbd_changed=1
  for i in $(existing_nodes); do pidfiles+=("$(node_pidfile "$i")"); done
  # (the one-node setup's slurmd too, scripts/slurm_setup.sh)
  write_slurm_conf "$conf" "$RUN_DIR/slurmd.pid" "${pidfiles[@]}" || true
  start_munge
  start_accounting "$dbd_changed"
  start_slurmctld
  for i in $(seq 1 "$n"); do start_slurmd "$i"; done
  for i in $(seq 1 "$n"); do node_ready "$(node_name "$i")" "$LOG_DIR/slurmd-$(node_name "$i").log"; done
  wait_for sacct 30 "$LOG_DIR/slurmdbd.log" sacct -n -X --starttime=now-1hour
  say "ready: cluster=$CLUSTER partition=$PARTITION nodes=$(sinfo -h -o %N) ($n x $cpus CPUs), sacct answers"
}

down() {
  local keep_ctl=$1 i ns
  require_root
  for i in $(existing_nodes); do
    ns=$(node_name "$i")
    stop_pidfile "$(node_pidfile "$i")"
    kill_namespace_procs "$ns"
    ip link del "arctic-v$i" 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  if grep -q "^$HOSTS_BEGIN\$" /etc/hosts 2>/dev/null; then
    sed "/^$HOSTS_BEGIN\$/,/^$HOSTS_END\$/d" /etc/hosts >/etc/hosts.arctic-tmp
    cat /etc/hosts.arctic-tmp >/etc/hosts && rm -f /etc/hosts.arctic-tmp
  fi
  if [ "$keep_ctl" -eq 0 ] && grep -q "slurm_cluster.sh" "$SLURM_CONF_FILE" 2>/dev/null; then
    stop_pidfile "$RUN_DIR/slurmctld.pid"
  fi
  say "down"
}

# down, then every daemon these scripts started and every file they made (and only those): the next `up`
# is a fresh machine's. The packages stay installed; a site's own Slurm config makes this refuse, as `up` does.
purge() {
  local pidfile
  require_root
  refuse_foreign_slurm
  down 0
  for pidfile in "$RUN_DIR"/*.pid "$DB_RUN/mysqld.pid"; do stop_pidfile "$pidfile"; done
  # Daemons of the scripts' earlier layout (pid files in /run, spool in /var/spool), where their config was ours.
  if [ -e "$SLURM_CONF_FILE" ]; then
    for pidfile in /run/slurmctld.pid /run/slurmdbd.pid /run/slurmd.pid /run/slurmd-"$NODE_PREFIX"*.pid; do
      [ -e "$pidfile" ] && stop_pidfile "$pidfile"
    done
    rm -rf /var/spool/slurmctld /var/spool/slurmd /var/spool/slurmd-"$NODE_PREFIX"*
  fi
  if owns munged; then
    pkill -u munge -x munged 2>/dev/null || true
  fi
  if owns munge-key; then rm -f /etc/munge/munge.key; fi
  rm -f "$SLURM_CONF_FILE" "$DBD_CONF_FILE" "$REFUSED"
  rm -rf "$STATE"
  say "purged: daemons stopped, $STATE and the configs removed"
}

status() {
  local i
  for i in $(existing_nodes); do
    printf '%s %s slurmd=%s state=%s\n' "$(node_name "$i")" "$(node_addr "$i")" \
      "$(pid_alive "$(node_pidfile "$i")" && echo up || echo down)" "$(sinfo -h -n "$(node_name "$i")" -o %T 2>/dev/null || echo '?')"
  done
}

action=${1:-}; shift || true
nodes=2; keep_ctl=0
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --nodes=*) nodes=${1#*=}; shift ;;
    --keep-controller) keep_ctl=1; shift ;;
    *) die "unknown argument '$1' (usage: $0 up [--nodes N] | down | purge | status)" ;;
  esac
done
[[ $nodes =~ ^[1-9][0-9]?$ ]] || die "--nodes=$nodes: use a number from 1 to 99"
case $action in
  up) up "$nodes" ;;
  down) down "$keep_ctl" ;;
  purge) purge ;;
  status) status ;;
  *) die "usage: $0 up [--nodes N] | down | purge | status" ;;
esac
