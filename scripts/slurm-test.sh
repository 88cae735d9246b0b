#!/usr/bin/env bash
# Runs docs/run-config.md's Slurm workflow on a real one-node Slurm cluster started here: munged,
# slurmctld and slurmd in a temporary folder, the documented job array (`qeval run --shard I/N`)
# and the dependent merge job submitted exactly as the docs write them (the scripts are extracted
# from the docs), then checks that the merged report.json equals an unsharded run's bit for bit
# (fields of timing and invocation aside) and that the images are the same files. Stops the
# daemons on exit. Needs root and Debian's slurm-wlm and munge (scripts/setup.sh installs them).
#   usage: scripts/slurm-test.sh [build folder, default build]   (KEEP=1 keeps the temp folder)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$repo/build}" && pwd)
doc="$repo/docs/run-config.md"
[ -x "$build/qeval" ] || { echo "slurm-test: no $build/qeval (build first)" >&2; exit 2; }
for c in munged slurmctld slurmd sbatch squeue scontrol jq; do
  command -v "$c" >/dev/null || { echo "slurm-test: '$c' not found (scripts/setup.sh installs slurm-wlm, munge, jq)" >&2; exit 2; }
done
start_s=$(date +%s)
t=$(mktemp -d /tmp/qeval-slurm.XXXXXX)
chmod 700 "$t"
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$rc" -ne 0 ]; then
    echo "slurm-test: FAILED (rc $rc); daemon logs:" >&2
    tail -n 20 "$t"/*.log "$t"/work/logs/* 2>/dev/null >&2 || true
  fi
  if [ "${KEEP:-0}" = 1 ] || [ "$rc" -ne 0 ]; then echo "slurm-test: files kept in $t" >&2; else rm -rf "$t"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The docs' scripts: the fenced block after each "<!-- slurm-test: NAME -->" marker, verbatim.
extract() {
  awk -v name="$1" '
    $0 == "<!-- slurm-test: " name " -->" { want = 1; next }
    want && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }' "$doc"
}
mkdir -p "$t/work"
for f in qeval-shard.sh qeval-merge.sh submit.sh; do
  extract "$f" > "$t/work/$f"
  [ -s "$t/work/$f" ] || { echo "slurm-test: $doc has no block marked '<!-- slurm-test: $f -->'" >&2; exit 1; }
done

# munge: its own key, socket, pid and log in the temp folder (no system daemon is touched).
dd if=/dev/urandom of="$t/munge.key" bs=1024 count=1 status=none
chmod 400 "$t/munge.key"
munged -F -f --socket="$t/munge.sock" --key-file="$t/munge.key" --pid-file="$t/munged.pid" \
  --log-file="$t/munged.log" --seed-file="$t/munged.seed" > "$t/munged.out" 2>&1 &
pids+=($!)

host=$(hostname -s)
ctld_port=$((20000 + RANDOM % 20000))
# One node. The documented array asks 16 CPUs a task: the node is declared with 16 (slurmd takes
# the configured count over the hardware's: config_overrides), so the docs' job runs unchanged,
# one task at a time. No cgroups (this may run in a container without systemd).
cat > "$t/slurm.conf" <<CONF
ClusterName=qevaltest
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$((ctld_port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$t/munge.sock
StateSaveLocation=$t/ctld-state
SlurmdSpoolDir=$t/slurmd-spool
SlurmctldPidFile=$t/slurmctld.pid
SlurmdPidFile=$t/slurmd.pid
SlurmctldLogFile=$t/slurmctld.log
SlurmdLogFile=$t/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
MinJobAge=600
NodeName=$host CPUs=16 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
mkdir -p "$t/ctld-state" "$t/slurmd-spool"
export SLURM_CONF="$t/slurm.conf"
for i in $(seq 50); do [ -S "$t/munge.sock" ] && break; sleep 0.2; done
slurmctld -D -c -f "$SLURM_CONF" > "$t/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" > "$t/slurmd.out" 2>&1 &
pids+=($!)
for i in $(seq 60); do
  state=$(sinfo -h -n "$host" -o %t 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 1
done
[ "$state" = idle ] || { echo "slurm-test: the node did not come up (state '$state')" >&2; exit 1; }
echo "slurm-test: one-node cluster up ($host, slurm $(slurmd -V | awk '{print $2}')) in $(( $(date +%s) - start_s )) s"

# The folder the docs submit from: build/qeval, run.json, gate.json. A small tiny-sd run: 8
# prompts, 2 steps, fp16 against fp32, layers of the UNet (one unit per shard).
w="$t/work"
ln -s "$build" "$w/build"
cat > "$w/run.json" <<JSON
{"pipeline": "$repo/models/tiny-sd", "count": 8, "steps": 2, "observe": {"models": ["unet"]},
 "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"}]}
JSON
cp "$repo/models/tiny-sd/gate.json" "$w/gate.json"

(cd "$w" && bash submit.sh) > "$t/submit.out"
cat "$t/submit.out"
jobs=$(squeue -h -o %i | sort -u | tr '\n' ' ')
echo "slurm-test: submitted; waiting for the array and the merge"
for i in $(seq 600); do
  [ -z "$(squeue -h 2>/dev/null)" ] && break
  if squeue -h -o '%r' | grep -q DependencyNeverSatisfied; then
    echo "slurm-test: the merge job can never run (a shard failed)" >&2; exit 1
  fi
  sleep 1
done
[ -z "$(squeue -h)" ] || { echo "slurm-test: jobs still queued after 600 s" >&2; squeue >&2; exit 1; }
# One line a job: id, array task, name, state, exit code (MinJobAge keeps finished jobs listed).
scontrol -o show job | grep -o -E '^JobId=[0-9]+|ArrayTaskId=[0-9]+|JobName=[^ ]+|JobState=[A-Z_]+|ExitCode=[0-9:]+' |
  awk '/^JobId=/ && NR > 1 { print "" } { printf "%s ", $0 } END { print "" }' | sort -V > "$t/jobs.txt"
n_ok=$(grep -c 'JobState=COMPLETED ExitCode=0:0' "$t/jobs.txt" || true)
echo "slurm-test: $n_ok of $(wc -l < "$t/jobs.txt") jobs (8 array tasks and the merge) completed with exit code 0"
[ "$(wc -l < "$t/jobs.txt")" -eq 9 ] && [ "$n_ok" -eq 9 ] || { cat "$t/jobs.txt" >&2; exit 1; }

# The unsharded run, outside Slurm, judged by the same gate.
(cd "$w" && build/qeval run --config run.json --out out/single --gate gate.json > "$t/single.out" 2>&1) || {
  rc=$?; [ "$rc" -eq 1 ] || { cat "$t/single.out" >&2; exit 1; }; }
# Fields that legitimately differ: timings (created_utc, elapsed_s, variants[].summary.timings,
# samples[].results[].elapsed_ms), the invocation (command_line, config.threads, config.shard) and
# `resume` (a merge reads every unit back from the shards: reused_units = all, elapsed_s_before =
# the shards' time).
comparable='del(.created_utc, .elapsed_s, .resume, .command_line, .config.threads, .config.shard)
  | .variants[].summary.timings = [] | del(.samples[].results[].elapsed_ms)'
jq -S "$comparable" "$w/out/merged/report.json" > "$t/merged.json"
jq -S "$comparable" "$w/out/single/report.json" > "$t/single.json"
if ! cmp -s "$t/merged.json" "$t/single.json"; then
  echo "slurm-test: the merged report differs from the single run's:" >&2
  diff "$t/single.json" "$t/merged.json" | head -40 >&2
  exit 1
fi
diff -r "$w/out/single/images" "$w/out/merged/images" >&2 || { echo "slurm-test: images differ" >&2; exit 1; }
echo "slurm-test: merged report of 8 shards == single run's ($(jq '.samples | length' "$w/out/merged/report.json") samples, $(find "$w/out/merged/images" -type f | wc -l) images identical), in $(( $(date +%s) - start_s )) s"
