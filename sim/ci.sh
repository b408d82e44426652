#!/usr/bin/env bash
# CI entry point of the deterministic simulator: a fixed budget of seeded
# histories on the real lease.ts under Deno (split over parallel jobs), a
# determinism check, and every mutant of sim/mutants.ts hunted to its first
# failure (the focus runs and the hunts also run as parallel jobs). Prints
# one line per check, "sim ci: <what>: PASS" or
# "sim ci: <what>: FAILED ...", and exits non-zero if any failed.
#
# Environment:
#   SIM_CI_SEEDS    histories in the budget (default 12000, seeds 0..N-1:
#                   the same histories on every run)
#   SIM_CI_JOBS     parallel Deno processes (default: the number of CPUs)
#   SIM_CI_MUTANTS  most histories per mutant hunt (default 10000, the CI
#                   budget; 0 skips)
#   SIM_CI_FOCUS    histories in each mutant focus run on lease.ts (L1:
#                   lease-checked guards, S1: re-created buckets, F3:
#                   markers changed at run time, T2: a restart that loses
#                   a tail under clients of a leaf node; default 2000; 0
#                   skips)
#   SIM_CI_FENCED   histories of the fenced layout (sim/fenced.ts; default
#                   1000; 0 skips)
#   SIM_LEASE       the lease module to simulate (default lease.ts)
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
export NO_COLOR=1

deno=node_modules/.bin/deno
[[ -x "$deno" ]] || deno="$(command -v deno || true)"
if [[ -z "$deno" ]]; then
  echo "sim ci: deno: FAILED (no node_modules/.bin/deno and no deno on PATH; run scripts/setup.sh)"
  exit 1
fi

seeds="${SIM_CI_SEEDS:-12000}"
jobs="${SIM_CI_JOBS:-$(nproc 2>/dev/null || echo 2)}"
mutant_budget="${SIM_CI_MUTANTS:-10000}"
logs="$(mktemp -d "${TMPDIR:-/tmp}/sim-ci.XXXXXX")"
trap 'rm -rf "$logs"' EXIT
failed=0

# 1. The budget, split into contiguous seed ranges.
start=$SECONDS
per=$(((seeds + jobs - 1) / jobs))
pids=()
for ((j = 0; j < jobs; j++)); do
  from=$((j * per))
  n=$((from + per > seeds ? seeds - from : per))
  ((n > 0)) || continue
  "$deno" run -A sim/run.ts --from "$from" --seeds "$n" >"$logs/shard$j.log" 2>&1 &
  pids+=($!)
done
bad=0
for pid in "${pids[@]}"; do wait "$pid" || bad=$((bad + 1)); done
took=$((SECONDS - start))
if ((bad == 0)); then
  echo "sim ci: $seeds histories (seeds 0..$((seeds - 1))) on ${SIM_LEASE:-lease.ts}: PASS ($took s, $jobs jobs)"
else
  echo "sim ci: $seeds histories (seeds 0..$((seeds - 1))) on ${SIM_LEASE:-lease.ts}: FAILED ($bad of ${#pids[@]} jobs found violations or crashed; replay with: $deno run -A sim/run.ts --reduce SEED)"
  for f in "$logs"/shard*.log; do
    if grep -q "failed" "$f" && ! grep -q " 0 failed" "$f"; then head -n 60 "$f"; fi
    grep -q "histories" "$f" || tail -n 20 "$f"
  done
  failed=$((failed + 1))
fi
cat "$logs"/shard*.log | grep '^sim ' || true

# 1b. The histories a mutant's focus narrows to, on the real lease.ts: none
# may fail. L1 (and L2): skew, partitions and deadline-hugging lease-checked
# guards. S1: a bucket re-created in every history, frequent pauses, one key.
# F3: markers removed, lowered or rolled back early, holders cut off.
# T2: a restart losing acknowledged messages in every history, under
# clients of a leaf node that it does not disconnect (issue 31, point 3).
focus_seeds="${SIM_CI_FOCUS:-2000}"
focuses=("L1:lease-checked guards" "S1:re-created buckets and pauses"
  "F3:markers changed at run time" "T2:leaf clients across a lost tail")
if ((focus_seeds > 0)); then
  # Independent runs, $jobs at a time; reported in this order.
  printf '%s\n' "${focuses[@]%%:*}" | xargs -P "$jobs" -I{} bash -c '
    start=$SECONDS
    "$1" run -A sim/run.ts --focus "$2" --seeds "$3" >"$4/focus-$2.log" 2>&1
    echo "$? $((SECONDS - start))" >"$4/focus-$2.rc"' _ "$deno" {} "$focus_seeds" "$logs"
  for focus in "${focuses[@]}"; do
    id="${focus%%:*}"
    read -r rc took <"$logs/focus-$id.rc" 2>/dev/null || rc=1 took=?
    if ((rc == 0)); then
      echo "sim ci: $focus_seeds histories focused on ${focus#*:} (--focus $id) on ${SIM_LEASE:-lease.ts}: PASS ($took s)"
    else
      echo "sim ci: $focus_seeds histories focused on ${focus#*:} (--focus $id): FAILED"
      head -n 60 "$logs/focus-$id.log"
      failed=$((failed + 1))
    fi
  done
fi

# 1c. The fenced layout (issue 33, sim/fenced.ts): its own histories on the
# real lease code must all pass, and each flaw of the simulated server that
# breaks what it checks must be caught by the property expected.
fenced_seeds="${SIM_CI_FENCED:-1000}"
if ((fenced_seeds > 0)); then
  start=$SECONDS
  if "$deno" run -A sim/fenced.ts --seeds "$fenced_seeds" >"$logs/fenced.log" 2>&1; then
    echo "sim ci: $(tail -n 1 "$logs/fenced.log" | sed 's/^sim //'): PASS ($((SECONDS - start)) s)"
  else
    echo "sim ci: $fenced_seeds fenced histories: FAILED"
    tail -n 20 "$logs/fenced.log"
    failed=$((failed + 1))
  fi
  for pair in subject-check-skipped:PF subject-check-ignored:PR ttl-ignored:P5F; do
    flaw="${pair%%:*}" want="${pair#*:}"
    "$deno" run -A sim/fenced.ts --seeds 2000 --flaw "$flaw" --stop >"$logs/flaw.log" 2>&1
    got="$(sed -n 's/^seed \([0-9]*\): \([A-Z0-9]*\):.*/\1 \2/p' "$logs/flaw.log" | head -n 1)"
    if [[ "${got#* }" == "$want" ]]; then
      echo "sim ci: fenced histories on a server whose $flaw: caught by $want at seed ${got% *}: PASS"
    else
      echo "sim ci: fenced histories on a server whose $flaw: expected $want, got '${got:-nothing}': FAILED"
      tail -n 5 "$logs/flaw.log"
      failed=$((failed + 1))
    fi
  done
fi

# 2. One seed is one history: the same trace twice.
seed=$(((seeds * 7919) % 100003))
"$deno" run -A sim/run.ts --trace "$seed" >"$logs/a.txt" 2>&1 &
"$deno" run -A sim/run.ts --trace "$seed" >"$logs/b.txt" 2>&1
wait
if [[ -s "$logs/a.txt" ]] && cmp -s "$logs/a.txt" "$logs/b.txt"; then
  echo "sim ci: determinism (seed $seed run twice, $(wc -l <"$logs/a.txt") trace lines identical): PASS"
else
  echo "sim ci: determinism (seed $seed run twice): FAILED"
  diff "$logs/a.txt" "$logs/b.txt" | head -n 20
  failed=$((failed + 1))
fi

# 3. The checks still bite: every mutant (a known hole put back into
# lease.ts) is caught, by the property expected, within the budget.
if ((mutant_budget > 0)); then
  start=$SECONDS
  # One hunt per process, $jobs at a time, taken from the end of the table
  # (where the longest hunts are) so the last to start are the short ones;
  # the rows are then read in the table's order. A hunt that cannot be
  # built (its edit no longer matches lease.ts) exits above 1, or prints
  # no row: then the rows of the others alone would look like a pass.
  mutants_rc=0
  mapfile -t holes < <("$deno" eval \
    'import { MUTANTS } from "./sim/mutants.ts"; for (const m of MUTANTS) console.log(m.hole);')
  if ((${#holes[@]} == 0)); then mutants_rc=2; fi
  for ((i = ${#holes[@]} - 1; i >= 0; i--)); do echo "${holes[i]}"; done |
    xargs -P "$jobs" -I{} bash -c '
      "$1" run -A sim/run.ts --mutant "$2" --expected-only --seeds "$3" \
        >"$4/mutant-$2.txt" 2>&1
      echo $? >"$4/mutant-$2.rc"' _ "$deno" {} "$mutant_budget" "$logs"
  : >"$logs/mutants.txt"
  for hole in "${holes[@]}"; do
    rc="$(cat "$logs/mutant-$hole.rc" 2>/dev/null || echo 2)"
    if ((rc > 1)) || ! grep -q '^| [A-Z]\{0,1\}[0-9]' "$logs/mutant-$hole.txt"; then
      mutants_rc=2
      echo "hunt of mutant $hole: exit $rc" >>"$logs/mutants.txt"
      tail -n 20 "$logs/mutant-$hole.txt" >>"$logs/mutants.txt"
    else
      grep '^| [A-Z]\{0,1\}[0-9]' "$logs/mutant-$hole.txt" >>"$logs/mutants.txt"
    fi
  done
  while IFS='|' read -r _ hole name expect caught seed hist time _; do
    hole="${hole// /}"
    [[ "$hole" =~ ^[A-Z]?[0-9]+b?$ ]] || continue
    name="${name// /}"
    expect="$(echo "$expect" | sed 's/^ *//; s/ *$//')"
    caught="${caught// /}"
    what="mutant $hole ($name)"
    hist="$(echo "$hist" | sed 's/^ *//; s/ *$//')"
    if [[ "$expect" == none* ]]; then
      # Not counted: a hole the simulator is not expected to catch, and why.
      echo "sim ci: note: $what is not expected to be caught ${expect#none }"
    elif [[ "$caught" =~ ^P[0-9]+$ && " ${expect//or/} " == *" $caught "* ]]; then
      echo "sim ci: $what caught by $caught (expected $expect) at seed ${seed// /}, $hist histories: PASS"
    elif [[ "$caught" =~ ^P[0-9]+$ ]]; then
      # The hunt counts only the expected properties: another one here
      # means the table and the hunt disagree.
      echo "sim ci: $what caught by $caught, not by the expected $expect: FAILED"
      failed=$((failed + 1))
    else
      echo "sim ci: $what expected to be caught by $expect: FAILED ($hist)"
      failed=$((failed + 1))
    fi
  done <"$logs/mutants.txt"
  # A mutant that cannot be built (its edit no longer matches lease.ts)
  # ends the hunts early with an error: the rows before it alone would look
  # like a pass.
  if ((mutants_rc > 1)) || ! grep -q '^| [A-Z]\{0,1\}[0-9]' "$logs/mutants.txt"; then
    echo "sim ci: mutants: FAILED"
    tail -n 20 "$logs/mutants.txt"
    failed=$((failed + 1))
  fi
  echo "sim ci: (mutant hunts took $((SECONDS - start)) s)"
fi

((failed == 0))
