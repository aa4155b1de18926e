#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for tests/test_slurm.py and for
# trying `hydra/launcher=slurm` on a laptop (docs/sweeps.md, "Slurm on one machine").
#
# Run as root.  Idempotent: installs Debian's packages if they are missing,
# writes /etc/slurm/slurm.conf (unless one not written by this script exists),
# starts munged, slurmctld and slurmd if they are not running, and waits until
# the node is idle.  The daemons it started are listed in $STATE/started so
# .ci/slurm-down.sh stops only those.
set -euo pipefail

STATE=/run/replaysim-slurm
CONF=/etc/slurm/slurm.conf
MARK="# written by replaysim .ci/slurm-up.sh"

log() { echo "slurm-up: $*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "slurm-up: run as root (it installs packages and starts system daemons)" >&2
    exit 2
fi

# ---------------------------------------------------------------- packages
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
        || ! command -v sinfo >/dev/null || ! command -v munged >/dev/null; then
    log "installing slurmctld slurmd slurm-client munge"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
fi

# ---------------------------------------------------------------- configuration
host=$(hostname -s)
if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    log "keeping the existing $CONF (not written by this script)"
else
    # The node line is slurmd's own view of the hardware, so slurmd never
    # drains the node for a CPU or memory count that differs from the real one.
    node=$(slurmd -C | head -n 1)
    cat >"$CONF.tmp" <<EOF
$MARK
ClusterName=replaysim
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# No cgroups: processes are tracked by parent pid, tasks are not confined
# (works in containers and on laptops without a cgroup setup for Slurm).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
$node
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    mv "$CONF.tmp" "$CONF"
fi
mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm "$STATE"
touch "$STATE/started"

started() { grep -qx "$1" "$STATE/started" || echo "$1" >>"$STATE/started"; }
running() { pgrep -x "$1" >/dev/null; }

# ---------------------------------------------------------------- daemons
if ! running munged; then
    log "starting munged"
    [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile=/etc/munge/munge.key; chown munge:munge /etc/munge/munge.key; chmod 600 /etc/munge/munge.key; }
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    started munged
fi
if ! running slurmctld; then
    log "starting slurmctld"
    /usr/sbin/slurmctld
    started slurmctld
fi
if ! running slurmd; then
    log "starting slurmd"
    /usr/sbin/slurmd
    started slurmd
fi

# ---------------------------------------------------------------- wait for the node
for _ in $(seq 60); do
    node_state=$(sinfo -h -N -n "$host" -o %T 2>/dev/null | head -n 1 || true)
    case "$node_state" in
        idle|mixed|allocated) log "node $host is $node_state"; sinfo; exit 0 ;;
        down*|drain*|fail*) scontrol update nodename="$host" state=resume 2>/dev/null || true ;;
    esac
    sleep 1
done
echo "slurm-up: node $host did not come up (state: ${node_state:-none}); see /var/log/slurm/" >&2
exit 1
