#!/usr/bin/env bash
# Stops the daemons .ci/slurm-up.sh started (listed in /run/replaysim-slurm/started),
# in reverse order, and nothing else: daemons that were already running are left alone.
set -uo pipefail

STATE=/run/replaysim-slurm
[ -f "$STATE/started" ] || exit 0

pidfile() {
    case "$1" in
        munged) echo /run/munge/munged.pid ;;
        mariadbd) echo /run/mysqld/mysqld.pid ;;
        slurmdbd) echo /run/slurmdbd.pid ;;
        slurmctld) echo /run/slurmctld.pid ;;
        slurmd) echo /run/slurmd.pid ;;
    esac
}

for daemon in $(tac "$STATE/started"); do
    file=$(pidfile "$daemon")
    if [ -n "$file" ] && [ -s "$file" ]; then
        pid=$(cat "$file")
        echo "slurm-down: stopping $daemon (pid $pid)"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    fi
done
rm -f "$STATE/started"
