#!/usr/bin/env bash
# Rehearses a new user on this machine: a clean clone of the committed HEAD in a temp folder, a new empty HOME (no
# uv cache, no built Python 3.12, no converted demo model, no JIT builds), the project's Slurm state removed
# (`scripts/slurm_cluster.sh purge`: only what these scripts created), then the README's two commands, each timed.
#
#   sudo bash scripts/fresh_check.sh              # make demo, then make test (about an hour on 2 cores)
#   sudo bash scripts/fresh_check.sh test         # only make test
#   FRESH_KEEP=1 sudo bash scripts/fresh_check.sh # keep the clone and its logs (their folder is printed)
#
# Each target's output goes to <clone>/runs/fresh-<target>.log, the last lines are printed when it fails; the run
# ends with one summary line: the commit, and each target's exit code and wall time. Uncommitted changes are not
# in the clone (a warning says so). The package registries are still reached (pip, apt): they are a new user's too.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
targets=${*:-demo test}
[ "$(id -u)" -eq 0 ] || { echo "[fresh-check] run as root: make test brings up a Slurm (apt-get, daemons)" >&2; exit 1; }
[ -z "$(git -C "$repo" status --porcelain --untracked-files=no)" ] \
  || echo "[fresh-check] warning: uncommitted changes in $repo are not part of the check"
commit=$(git -C "$repo" rev-parse --short HEAD)
work=$(mktemp -d /tmp/arctic-rl-fresh.XXXXXX)
[ -n "${FRESH_KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
say() { echo "[fresh-check +$(($(date +%s) - t0))s] $*"; }
t0=$(date +%s)

say "clean clone of $commit into $work/arctic-rl"
git clone -q "$repo" "$work/arctic-rl" || exit 1
cd "$work/arctic-rl" && mkdir -p runs "$work/home"
# Before make test (make demo needs no Slurm): the project's Slurm state removed, so `make test` (which purges
# too) is seen to bring it up from nothing.
purge() {
  say "removing the project's Slurm state (scripts/slurm_cluster.sh purge)"
  bash scripts/slurm_cluster.sh purge >runs/fresh-purge.log 2>&1 || { cat runs/fresh-purge.log; exit 1; }
  [ ! -e /etc/slurm/slurm.conf ] || { echo "[fresh-check] /etc/slurm/slurm.conf still there after purge" >&2; exit 1; }
}

summary="fresh-check $commit:"
status=0
for target in $targets; do
  [ "$target" != test ] || purge
  say "make $target (log: runs/fresh-$target.log) ..."
  start=$(date +%s)
  HOME=$work/home make "$target" >"runs/fresh-$target.log" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  say "make $target: exit $rc after $((secs / 60)) min $((secs % 60)) s; its last lines:"
  tail -n 8 "runs/fresh-$target.log"
  [ "$rc" -eq 0 ] || { status=1; tail -n 60 "runs/fresh-$target.log" | head -n 52; }
  summary+=" make $target exit $rc in $((secs / 60))m$((secs % 60))s;"
done
[ -z "${FRESH_KEEP:-}" ] || say "kept $work"
echo "$summary total $(($(date +%s) - t0)) s"
exit $status
