#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for tests/test_slurm.py and for
# trying `hydra/launcher=slurm` on a laptop (docs/sweeps.md, "Slurm on one machine").
#
# Run as root.  Idempotent: installs Debian's packages if they are missing,
# writes /etc/slurm/slurm.conf and slurmdbd.conf (unless files not written by
# this script exist), starts munged, mariadbd, slurmdbd, slurmctld and slurmd
# if they are not running, and waits until the node is idle.  The daemons it
# started are listed in $STATE/started so .ci/slurm-down.sh stops only those.
set -euo pipefail

STATE=/run/replaysim-slurm
CONF=/etc/slurm/slurm.conf
DBD_CONF=/etc/slurm/slurmdbd.conf
MARK="# written by replaysim .ci/slurm-up.sh"

log() { echo "slurm-up: $*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "slurm-up: run as root (it installs packages and starts system daemons)" >&2
    exit 2
fi

# ---------------------------------------------------------------- packages
# slurmdbd and MariaDB give accounting: submitit reads job states with sacct,
# and without it a cancelled job looks pending forever and the sweep never ends.
need=()
for pair in slurmctld:slurmctld slurmd:slurmd sinfo:slurm-client munged:munge \
            slurmdbd:slurmdbd mariadbd:mariadb-server; do
    command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# ---------------------------------------------------------------- configuration
ours() { [ ! -f "$1" ] || grep -qF "$MARK" "$1"; }
host=$(hostname -s)
if ours "$CONF"; then
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
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
$node
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    if cmp -s "$CONF.tmp" "$CONF"; then
        rm "$CONF.tmp"
    else
        mv "$CONF.tmp" "$CONF"
        # running daemons keep the configuration they started with
        if pgrep -x slurmctld >/dev/null; then
            log "$CONF changed: restart the daemons (slurm-down.sh, then slurm-up.sh) to use it"
        fi
    fi
else
    log "keeping the existing $CONF (not written by this script)"
fi
if ours "$DBD_CONF"; then
    # slurmdbd runs as root and reaches MariaDB through its unix socket as root:
    # no database password to create or keep.
    cat >"$DBD_CONF" <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
PidFile=/run/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
EOF
    chmod 600 "$DBD_CONF"
else
    log "keeping the existing $DBD_CONF (not written by this script)"
fi
mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm "$STATE"
touch "$STATE/started"

started() { grep -qx "$1" "$STATE/started" || echo "$1" >>"$STATE/started"; }
running() { pgrep -x "$1" >/dev/null; }
wait_for() {  # wait_for WHAT COMMAND...: up to 30 s for COMMAND to succeed
    local what=$1; shift
    for _ in $(seq 30); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
    echo "slurm-up: $what did not start; see /var/log/slurm/" >&2
    exit 1
}

# ---------------------------------------------------------------- daemons
if ! running munged; then
    log "starting munged"
    if [ ! -s /etc/munge/munge.key ]; then
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
        chmod 600 /etc/munge/munge.key
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    started munged
fi
if ! running mariadbd; then
    log "starting mariadbd"
    install -d -o mysql -g mysql /run/mysqld
    setsid /usr/sbin/mariadbd --user=mysql --pid-file=/run/mysqld/mysqld.pid \
        >>/var/log/slurm/mariadbd.log 2>&1 </dev/null &
    started mariadbd
    wait_for mariadbd mariadb -e 'select 1'
fi
if ! running slurmdbd; then
    log "starting slurmdbd"
    /usr/sbin/slurmdbd
    started slurmdbd
    wait_for slurmdbd sacctmgr -n list cluster
fi
if ! running slurmctld; then
    log "starting slurmctld"
    /usr/sbin/slurmctld
    started slurmctld
    wait_for slurmctld scontrol ping
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
