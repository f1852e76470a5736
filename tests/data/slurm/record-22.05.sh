#!/bin/bash
# Records real Slurm outputs for tests/slurm_parsers from a running hpcserve dev cluster (4 nodes).
# Usage: SLURM_CONF=<dev cluster>/slurm.conf record-22.05.sh OUTDIR WORKDIR
# Submits jobs, takes snapshots, then cancels every job it submitted (by id) and resumes node4.
# The format strings below must match SQUEUE_FORMAT / STEPS_FORMAT / SACCT_FORMAT in
# hpcserve/slurm/parsers.py.
set -u
OUT=$1; WORK=$2
mkdir -p "$OUT" "$WORK"; cd "$WORK"
SQF='%i|%A|%T|%r|%N|%D|%P|%u|%M|%l|%L|%V|%S|%e|%j'
STF='%i|%A|%N|%M|%j'
SAF='JobID,State,ExitCode,Elapsed,NodeList,Reason,JobName'
IDS=()

rec() {  # rec NAME argv...: NAME.out (NAME.json for *_json) always; NAME.err if not empty; NAME.rc if not 0
  local name=$1 ext=out; shift
  case $name in *_json) ext=json;; esac
  "$@" >"$OUT/$name.$ext" 2>"$OUT/$name.err"; local rc=$?
  [ -s "$OUT/$name.err" ] || rm -f "$OUT/$name.err"
  [ $rc -eq 0 ] || echo $rc >"$OUT/$name.rc"
}
sub() {  # sub VAR sbatch-args...: submit, remember the id for the final scancel, set VAR to it
  local var=$1 id; shift
  id=$(sbatch --parsable "$@") || exit 1
  IDS+=("$id"); printf -v "$var" '%s' "$id"
}
wait_state() {  # wait_state ID STATE: poll squeue up to 30 s
  for _ in $(seq 60); do
    [ "$(squeue -h -t all -j "$1" -o %T | head -1)" = "$2" ] && return 0; sleep 0.5
  done; echo "job $1 never reached $2" >&2; return 1
}

cat > het.sh <<'S'
#!/bin/bash
#SBATCH --job-name=hs-deploy
#SBATCH --nodes=1
#SBATCH --time=02:00:00
#SBATCH hetjob
#SBATCH --nodes=2
#SBATCH --time=02:00:00
srun --het-group=0 --job-name=router sleep 300 &
srun --het-group=1 --job-name=workers sleep 300 &
wait
S
cat > steps.sh <<'S'
#!/bin/bash
#SBATCH --job-name=with-steps
#SBATCH --nodes=1
srun --overlap -n1 --job-name=engine sleep 300 &
srun --overlap -n1 --job-name=probe sleep 300 &
wait
S
cat > hetwait.sh <<'S'
#!/bin/bash
#SBATCH --job-name=hs-deploy-waiting
#SBATCH --nodes=1
#SBATCH hetjob
#SBATCH --nodes=2
sleep 300
S
cat > hetquick.sh <<'S'
#!/bin/bash
#SBATCH --job-name=hs-quick
#SBATCH --nodes=1
#SBATCH hetjob
#SBATCH --nodes=2
srun --het-group=1 --job-name=hostname hostname
S

sub DONE -J done-job -o done.out --wrap 'echo hi'
sub FAIL -J failing -o fail.out --wrap 'exit 3'
wait_state "$DONE" COMPLETED; wait_state "$FAIL" FAILED
sub HET -o het.out het.sh
sub STEPS -o steps.out steps.sh
sub CAN -J cancel-me -o can.out --wrap 'sleep 300'
wait_state "$HET" RUNNING; wait_state "$STEPS" RUNNING; wait_state "$CAN" RUNNING
scancel "$CAN"; wait_state "$CAN" CANCELLED
sub DEP -J waits-on-dep -d "afterok:$HET" -o dep.out --wrap 'sleep 300'
sub LATER -J later --begin=now+1hour -o later.out --wrap 'sleep 300'
sub HELD -J held --hold -o held.out --wrap 'sleep 300'
sub HETWAIT -o hetwait.out -d "afterany:$HET" hetwait.sh
sub SPACES -J 'name with spaces|pipe' -t 1-00:00:00 -o sp.out --wrap 'sleep 300'
FILL=()
for i in 1 2 3 4 5 6; do sub F -J fill$i -N4 --ntasks-per-node=2 -o fill.out --wrap 'sleep 300'; FILL+=("$F"); done
sleep 5   # steps started, backfill has looked at everything
HET1=$(squeue -h -j "$HET" -o %A | sed -n 2p)   # the second component's own job id

# A: everything live
rec a_squeue squeue -h -t all -o "$SQF"
rec a_squeue_json squeue --json
rec a_squeue_json_filtered squeue --json -t running -j "$HET"
rec a_scontrol scontrol show job -o
rec a_scontrol_het scontrol show job -o "$HET"
rec a_scontrol_het_multiline scontrol show job "$HET"
rec a_steps squeue -h --steps -o "$STF"
rec a_steps_het_both squeue -h --steps -j "$HET,$HET1" -o "$STF"
rec a_steps_het_leader squeue -h --steps -j "$HET" -o "$STF"
rec a_steps_het_plus1 squeue -h --steps -j "$HET+1" -o "$STF"
rec a_scontrol_steps scontrol show step -o
rec a_sacct sacct -j "$HET" -X -P -n --format="$SAF"
rec a_sacct_json sacct --json -j "$HET"
rec a_squeue_unknown squeue -h -t all -j 999999 -o "$SQF"
rec a_scontrol_unknown scontrol show job -o 999999

# R: a drained node makes a job wait on ReqNodeNotAvail (and changes a waiting job's reason text)
scontrol update nodename=node4 state=drain reason=parsers-test
sub N4 -J wants-node4 -w node4 -o n4.out --wrap 'sleep 300'
sleep 3
rec r_squeue squeue -h -t all -o "$SQF"
rec r_scontrol_reqnode scontrol show job -o "$N4"
rec r_scontrol_drained scontrol show job -o "${FILL[3]}"

# B: the running het job cancelled; the waiting het job starts; then only its component 1 cancelled
scancel "$HET"; wait_state "$HETWAIT" RUNNING
sleep 2; scancel "$HETWAIT+1"; sleep 4
rec b_squeue squeue -h -t all -o "$SQF"
rec b_squeue_json squeue --json
rec b_scontrol scontrol show job -o
rec b_steps squeue -h --steps -o "$STF"

# C: a het job that ran to completion
scancel "${FILL[@]}"; scontrol update nodename=node4 state=resume
sub QUICK -o hetquick.out hetquick.sh; wait_state "$QUICK" COMPLETED; sleep 1
rec c_squeue squeue -h -t all -o "$SQF"
rec c_squeue_json squeue --json
rec c_scontrol scontrol show job -o

scancel "${IDS[@]}" 2>/dev/null
sleep 6
squeue -h -t all -o '%i|%T' >"$OUT/final_states.out"
scontrol show config | grep -E '^(SLURM_VERSION|KillWait|MinJobAge|SchedulerType|AccountingStorageType) ' >"$OUT/config.out"
date +%Z >"$OUT/timezone.out"
echo "submitted: ${IDS[*]}"
