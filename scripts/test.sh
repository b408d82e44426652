#!/usr/bin/env bash
# Runs the test files under each runtime (deno test, bun test, node --test)
# against each nats-server binary, one runtime at a time, and sums the
# results.
#
# Usage: bash scripts/test.sh [--runtime deno|bun|node]... [--server current|oldest|fence-min|atomic-min]... [files...]
#
#   --runtime R  run only runtime R (repeatable; default: deno, bun and node)
#   --server S   run only against server S (repeatable; default: current and
#                oldest for deno, current only for bun and node: the
#                matrix's Bun x 2.9.10 and Node x 2.9.10 cells are left out
#                to keep CI under 50 minutes; name --server oldest to run
#                them; and fence-min and atomic-min under node, for the
#                files whose line "// test.sh: fenced servers too" asks)
#                  current    = .tools/bin/nats-server (built by scripts/setup.sh)
#                  oldest     = /usr/sbin/nats-server (Debian's 2.9.10)
#                  fence-min  = .tools/bin/nats-server-2.11.2, the first
#                               release with fenced buckets
#                  atomic-min = .tools/bin/nats-server-2.12.0, the first
#                               with atomic batches
#   files        test files (default: every *_test.ts in the repo root and
#                test_util/); a file that starts no server (sim_test.ts), or
#                whose line "// test.sh: first server only" says it tests a
#                script rather than the server, runs with the first server
#                only; one whose line "// test.sh: node only" says it tests
#                something outside the runtime (a browser, workerd) runs
#                under node with the first server only
#
# Environment:
#   LEASE_TEST_TIMEOUT      per-test timeout in ms for bun and node, also
#                           passed to the tests (default 120000)
#   LEASE_TEST_RUN_TIMEOUT  seconds one runtime may take for all files before
#                           it is killed (default 1800; the Node leg takes about 17 min)
#   LEASE_SKIP_SETUP=1      do not run scripts/setup.sh first
#
# Prints one line per runtime and server, e.g.
#   deno  server 2.15.2: 12 passed, 0 failed, 0 skipped (34 s, at most 40 open descriptors)
# and last "N passed, N failed, N skipped". Exits non-zero if anything failed. Each
# run's full output is kept in a log under a temp dir; a failing run's tail is
# printed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

usage() {
  sed -n '6,34p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

runtimes=()
servers=()
files=()
while (($# > 0)); do
  case "$1" in
  --runtime | --server)
    if (($# < 2)); then
      echo "test.sh: $1 needs a value" >&2
      exit 2
    fi
    if [[ "$1" == --runtime ]]; then runtimes+=("$2"); else servers+=("$2"); fi
    shift 2
    ;;
  --runtime=*) runtimes+=("${1#*=}") && shift ;;
  --server=*) servers+=("${1#*=}") && shift ;;
  -h | --help) usage && exit 0 ;;
  --) shift && files+=("$@") && break ;;
  -*) echo "test.sh: unknown option '$1'" >&2 && usage >&2 && exit 2 ;;
  *) files+=("$1") && shift ;;
  esac
done
((${#runtimes[@]} > 0)) || runtimes=(deno bun node)
servers_given=${#servers[@]}
((${#servers[@]} > 0)) || servers=(current oldest fence-min atomic-min)
for r in "${runtimes[@]}"; do
  [[ "$r" =~ ^(deno|bun|node)$ ]] || {
    echo "test.sh: --runtime must be deno, bun or node: received '$r'" >&2
    exit 2
  }
done
for s in "${servers[@]}"; do
  [[ "$s" =~ ^(current|oldest|fence-min|atomic-min)$ ]] || {
    echo "test.sh: --server must be current, oldest, fence-min or atomic-min: received '$s'" >&2
    exit 2
  }
done

if [[ "${LEASE_SKIP_SETUP:-}" != 1 ]]; then
  bash scripts/setup.sh
fi

if ((${#files[@]} == 0)); then
  mapfile -t files < <(
    find . -maxdepth 1 -name '*_test.ts' -type f
    find test_util -name '*_test.ts' -type f -not -path '*/node_modules/*' 2>/dev/null
  )
  mapfile -t files < <(printf '%s\n' "${files[@]}" | sed 's#^\./##' | sort)
fi
if ((${#files[@]} == 0)); then
  echo "test.sh: no *_test.ts files found" >&2
  exit 2
fi
# Bun treats an argument without a path prefix as a name filter.
for i in "${!files[@]}"; do
  [[ -f "${files[$i]}" ]] || {
    echo "test.sh: no such test file: ${files[$i]}" >&2
    exit 2
  }
  [[ "${files[$i]}" == /* || "${files[$i]}" == ./* ]] || files[i]="./${files[$i]}"
done

per_test_timeout="${LEASE_TEST_TIMEOUT:-120000}"
run_timeout="${LEASE_TEST_RUN_TIMEOUT:-1800}"
export LEASE_TEST_TIMEOUT="$per_test_timeout"
export NO_COLOR=1

logdir="$(mktemp -d "${TMPDIR:-/tmp}/lease-tests.XXXXXX")"
echo "test files: ${files[*]}"
echo "logs: $logdir"

# Each run gets its own process group (coreutils timeout makes one), so any
# nats-server a crashed or timed-out runtime leaves behind is killed with it.
group=""
cleanup_group() {
  if [[ -n "$group" ]]; then
    kill -KILL -- "-$group" 2>/dev/null || true
    group=""
  fi
}
trap 'cleanup_group' EXIT
trap 'cleanup_group; exit 130' INT TERM

server_binary() {
  case "$1" in
  current) echo "$root/.tools/bin/nats-server" ;;
  oldest) echo "/usr/sbin/nats-server" ;;
  fence-min) echo "$root/.tools/bin/nats-server-2.11.2" ;;
  atomic-min) echo "$root/.tools/bin/nats-server-2.12.0" ;;
  esac
}

# Counts leaf tests in deno's pretty output, as "PASSED FAILED SKIPPED". Deno's own
# summary counts top-level tests only ("12 passed (69 steps)": a describe()
# group counts once and its tests are "steps"), while bun and node count
# every test; counting leaves keeps the runtimes comparable. A group opens
# with "name ..." and closes with "name ... ok|FAILED" at the same indent
# after nested results; a test with captured output looks the same, minus
# the nested results.
deno_leaves() {
  local re_open='^( *)(.*) \.\.\.$'
  local re_result='^( *)(.*) \.\.\. (ok|FAILED|ignored)( \([^)]*\))*$'
  local -a names=() indents=() kids=()
  local passed=0 failed=0 skipped=0 in_output=0 line indent name result n leaf
  while IFS= read -r line; do
    if ((in_output)); then
      [[ "$line" =~ ^\ *-----\ output\ end\ -----$ ]] && in_output=0
      continue
    fi
    if [[ "$line" =~ ^\ *-------\ output\ -------$ ]]; then
      in_output=1
    elif [[ "$line" =~ $re_result ]]; then
      indent=${#BASH_REMATCH[1]}
      name=${BASH_REMATCH[2]}
      result=${BASH_REMATCH[3]}
      n=${#names[@]}
      leaf=1
      if ((n > 0)) && [[ "${names[n - 1]}" == "$name" &&
        "${indents[n - 1]}" == "$indent" ]]; then
        ((kids[n - 1] == 0)) || leaf=0
        unset 'names[n-1]' 'indents[n-1]' 'kids[n-1]'
        n=$((n - 1))
      fi
      ((n == 0)) || kids[n - 1]=$((kids[n - 1] + 1))
      if ((leaf)); then
        case "$result" in
        ok) passed=$((passed + 1)) ;;
        FAILED) failed=$((failed + 1)) ;;
        ignored) skipped=$((skipped + 1)) ;;
        esac
      fi
    elif [[ "$line" =~ $re_open ]]; then
      names+=("${BASH_REMATCH[2]}")
      indents+=("${#BASH_REMATCH[1]}")
      kids+=(0)
    fi
  done <<<"$1"
  echo "$passed $failed $skipped"
}

# Prints "PASSED FAILED SKIPPED" from a runtime's summary, or nothing when
# there is none (the runtime crashed or was killed).
parse_summary() {
  local runtime="$1" log="$2" clean passed failed cancelled skipped=0
  clean="$(sed 's/\x1b\[[0-9;]*m//g' "$log")"
  case "$runtime" in
  deno)
    # "ok | 8 passed | 0 failed (13s)" or "FAILED | 5 passed (9 steps) |
    # 3 failed (4 steps) ...". With steps, count leaves instead, but never
    # report fewer failures than the summary (a group can fail in a hook
    # with every test in it passing).
    local line
    line="$(grep -E '^(ok|FAILED) \| [0-9]+ passed' <<<"$clean" | tail -n 1)" || return 0
    passed="$(sed -E 's/^[^|]*\| ([0-9]+) passed.*/\1/' <<<"$line")"
    failed="$(sed -E 's/.*\| ([0-9]+) failed.*/\1/' <<<"$line")"
    if [[ "$line" =~ \|\ ([0-9]+)\ ignored ]]; then skipped="${BASH_REMATCH[1]}"; fi
    if [[ "$line" == *step* ]]; then
      local top_failed="$failed"
      read -r passed failed skipped < <(deno_leaves "$clean")
      ((failed > 0 || top_failed == 0)) || failed="$top_failed"
    fi
    ;;
  bun)
    # " 8 pass" and " 0 fail" lines after the results.
    passed="$(grep -E '^ *[0-9]+ pass$' <<<"$clean" | tail -n 1 | tr -dc 0-9)" || return 0
    failed="$(grep -E '^ *[0-9]+ fail$' <<<"$clean" | tail -n 1 | tr -dc 0-9)" || return 0
    skipped="$(grep -E '^ *[0-9]+ skip$' <<<"$clean" | tail -n 1 | tr -dc 0-9)" || skipped=0
    ;;
  node)
    # "ℹ pass 8", "ℹ fail 0", "ℹ cancelled 0"; a cancelled test failed too.
    passed="$(grep -E '^ℹ pass [0-9]+$' <<<"$clean" | tail -n 1 | tr -dc 0-9)" || return 0
    failed="$(grep -E '^ℹ fail [0-9]+$' <<<"$clean" | tail -n 1 | tr -dc 0-9)" || return 0
    cancelled="$(grep -E '^ℹ cancelled [0-9]+$' <<<"$clean" | tail -n 1 | tr -dc 0-9)" || cancelled=0
    failed=$((failed + ${cancelled:-0}))
    skipped="$(grep -E '^ℹ skipped [0-9]+$' <<<"$clean" | tail -n 1 | tr -dc 0-9)" || skipped=0
    ;;
  esac
  [[ -n "$passed" && -n "$failed" ]] && echo "$passed $failed ${skipped:-0}"
}

# Prints, for each failed test in a runtime's log, a block:
#   ===== FAILED: NAME
#   the error (message first) as the runtime printed it, at most 60 lines
failure_reports() {
  local runtime="$1" log="$2"
  sed -E 's/\x1b\[[0-9;]*m//g' "$log" | case "$runtime" in
  deno)
    # The "ERRORS" section: "NAME => file:line:col", then the error, until
    # the next such header or the "FAILURES" list.
    awk '
      /^ ERRORS $/ { on = 1; next }
      /^ FAILURES $/ { on = 0 }
      !on { next }
      / => [^ ]+:[0-9]+:[0-9]+$/ { sub(/ => [^ ]+:[0-9]+:[0-9]+$/, ""); print "===== FAILED: " $0; n = 0; next }
      n++ < 60 { print }
    '
    ;;
  bun)
    # bun prints a test error above its "(fail) NAME [time]" line.
    # A failing hook is "# Unhandled error between tests", framed by dashes.
    awk '
      /^# Unhandled error between tests$/ { print "===== FAILED: (an error between tests, e.g. in a before() hook)"; u = 1; d = 0; next }
      u && /^-+$/ { if (++d == 2) u = 0; next }
      u { print; next }
      /^\((pass|skip|todo)\) / { k = 0; next }
      /^\(fail\) / {
        name = $0; sub(/^\(fail\) /, "", name); sub(/ \[[0-9.]+m?s\]$/, "", name)
        print "===== FAILED: " name
        s = (k > 60) ? k - 60 : 0
        for (i = s; i < k; i++) print buf[i]
        k = 0; next
      }
      { buf[k++] = $0 }
    '
    ;;
  node)
    # The "failing tests:" list at the end: "✖ NAME (time)", then the error.
    awk '
      /^✖ failing tests:$/ { on = 1; next }
      !on { next }
      /^test at / { next }
      /^✖ / { name = $0; sub(/^✖ /, "", name); sub(/ \([0-9.]+m?s\)$/, "", name); print "===== FAILED: " name; n = 0; next }
      n++ < 60 { print }
    '
    ;;
  esac
}

# Prints "NAME: first error line" for each failed test in a runtime's log,
# one a line, from failure_reports.
failed_test_names() {
  failure_reports "$1" "$2" | awk '
    function flush() {
      if (why == "") why = first
      if (name != "") print name (why == "" ? "" : ": " why)
    }
    /^===== FAILED: / { flush(); name = substr($0, 15); why = ""; first = ""; next }
    why == "" && /(Error|error)(\ \[[A-Z_]+\])?: / {
      why = $0; sub(/^ *(error: )?/, "", why)
      if (length(why) > 300) why = substr(why, 1, 300) "..."
    }
    first == "" && name != "" && /[^ ]/ { first = $0; sub(/^ +/, "", first) }
    END { flush() }
  ' | sort -u
}

# A test file that starts no nats-server (the simulator's) gives the same
# result with either server, and one that says so in a line starting
# "// test.sh: first server only" tests a script, not the server: run those
# with the first server only.
first_only=()
for f in "${files[@]}"; do
  if ! grep -qE 'nats_server|NatsServer|NATS_SERVER' "$f" ||
    grep -q '^// test.sh: first server only' "$f"; then
    first_only+=("$f")
  fi
done
# A file whose line "// test.sh: node only" says that what it tests runs
# outside the test's runtime (a browser, workerd) runs under node, with the
# first server only.
node_only=()
for f in "${files[@]}"; do
  if grep -q '^// test.sh: node only' "$f"; then
    node_only+=("$f")
    [[ " ${first_only[*]} " == *" $f "* ]] || first_only+=("$f")
  fi
done

# A file whose line "// test.sh: fenced servers too" says it tests fenced
# buckets runs with fence-min and atomic-min as well; no other file does.
fenced_too=()
for f in "${files[@]}"; do
  if grep -q '^// test.sh: fenced servers too' "$f"; then fenced_too+=("$f"); fi
done

# Prints each skipped test in a runtime's log as "NAME<TAB>REASON", one a
# line. Only node prints the reason given to `skip`; titles of tests skipped
# for a reason worth knowing carry it too ("[skipped: ...]").
skipped_names() {
  local runtime="$1" log="$2"
  case "$runtime" in
  deno) sed -nE 's/^ *(.*) \.\.\. ignored \([0-9.]+m?s\)$/\1\t/p' "$log" ;;
  # bun names a test inside a describe "GROUP > NAME".
  bun) sed -nE 's/^\(skip\) (.* > )?(.*)$/\2\t/p' "$log" ;;
  node) sed -nE 's/^ *﹣ (.*) \([0-9.]+m?s\)( # (.*))?$/\1\t\3/p' "$log" |
    sed -E 's/\tSKIP$/\t/' ;;
  esac
}

# Samples how many descriptors the runtime under `timeout` PID holds, twice
# a second, until it exits, and writes the peak, when it was reached, the
# test file then running (bun and deno print a "file.ts:" header per file)
# and what the descriptors were to FILE. A CI run once saw Bun, which runs
# every file in one process, fail with EMFILE at 20,000 descriptors; this
# is how the next one is caught in the act.
sample_fds() {
  local group="$1" out="$2" log="$3" p="" n peak=0
  while kill -0 "$group" 2>/dev/null; do
    [[ -n "$p" && -d "/proc/$p" ]] || p="$(pgrep -P "$group" | head -n 1)" || p=""
    if [[ -n "$p" ]]; then
      n="$(find "/proc/$p/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)"
      if ((n > peak)); then
        peak=$n
        {
          echo "$peak"
          echo "at $(date +%T), $((SECONDS - started)) s into the run, in $(grep -E '^[A-Za-z0-9_./-]+_test\.ts:$' "$log" | tail -n 1 | tr -d :)"
          find "/proc/$p/fd" -mindepth 1 -maxdepth 1 -printf '%l\n' 2>/dev/null |
            sed -E 's/:\[[0-9]+\]$//; s#^/.*#file#' | sort | uniq -c | sort -rn
        } >"$out.tmp" && mv "$out.tmp" "$out"
      fi
    fi
    sleep 0.5
  done
}

failed_names=()
total_passed=0
total_failed=0
total_skipped=0
for runtime in "${runtimes[@]}"; do
  for server in "${servers[@]}"; do
    # By default only Deno runs against the oldest server: nats.js (the
    # tests connect with @nats-io/transport-node under every runtime) is the
    # same code under each, so what differs by server version is covered
    # under Deno, and what differs by runtime against the current server.
    if ((servers_given == 0)) && [[ "$runtime" != deno && "$server" == oldest ]]; then
      printf '%-5s server oldest: not run by default (name --server oldest to run it)\n' "$runtime"
      continue
    fi
    # The first releases with fenced buckets and atomic batches: what
    # differs there is the server's, so one runtime covers them.
    if ((servers_given == 0)) && [[ "$runtime" != node && "$server" == @(fence-min|atomic-min) ]]; then
      continue
    fi
    bin="$(server_binary "$server")"
    if [[ -x "$bin" ]]; then
      version="$("$bin" --version 2>/dev/null | sed -E 's/^.*v([0-9][^ ]*).*$/\1/')"
    else
      version="$server (missing: $bin)"
    fi
    log="$logdir/$runtime-$server.log"
    run_files=()
    for f in "${files[@]}"; do
      if [[ "$server" != "${servers[0]}" && " ${first_only[*]} " == *" $f "* ]]; then continue; fi
      if [[ "$runtime" != node && " ${node_only[*]} " == *" $f "* ]]; then continue; fi
      if [[ "$server" == @(fence-min|atomic-min) && " ${fenced_too[*]} " != *" $f "* ]]; then continue; fi
      run_files+=("$f")
    done
    if ((${#run_files[@]} == 0)); then
      echo "$runtime server $server: no file to run (each runs with the first server only, or under node only), skipped"
      continue
    fi
    case "$runtime" in
    deno) cmd=(node_modules/.bin/deno test -A "${run_files[@]}") ;;
    bun) cmd=(node_modules/.bin/bun test --timeout "$per_test_timeout" "${run_files[@]}") ;;
    node)
      cmd=(node_modules/.bin/node --test --test-concurrency=1
        "--test-timeout=$per_test_timeout" "${run_files[@]}")
      ;;
    esac
    echo "+ NATS_SERVER_BIN=$bin ${cmd[*]}" >"$log"
    started=$SECONDS
    NATS_SERVER_BIN="$bin" timeout -k 10 "$run_timeout" "${cmd[@]}" \
      </dev/null >>"$log" 2>&1 &
    group=$!
    fds="$logdir/$runtime-$server.fds"
    sample_fds "$group" "$fds" "$log" &
    sampler=$!
    rc=0
    wait "$group" || rc=$?
    cleanup_group
    wait "$sampler" 2>/dev/null || true
    elapsed=$((SECONDS - started))
    peak_fds="$(head -n 1 "$fds" 2>/dev/null)" || peak_fds=""

    summary="$(parse_summary "$runtime" "$log")"
    note=""
    skipped=0
    if [[ -z "$summary" ]]; then
      passed=0
      failed=1
      if ((rc == 124 || rc == 137)); then
        note=" [killed after ${run_timeout} s, no summary]"
      else
        note=" [no summary, exit code $rc]"
      fi
    else
      read -r passed failed skipped <<<"$summary"
      if ((rc != 0 && failed == 0)); then
        # E.g. an error outside any test, or a leak the runner reports.
        failed=1
        note=" [exit code $rc]"
      fi
    fi
    printf '%-5s server %s: %d passed, %d failed, %d skipped (%d s, at most %s open descriptors)%s\n' \
      "$runtime" "$version" "$passed" "$failed" "$skipped" "$elapsed" "${peak_fds:-?}" "$note"
    if grep -q 'EMFILE\|too many open files' "$log"; then
      echo "----- $runtime ran out of descriptors; its peak, $fds: -----"
      cat "$fds" 2>/dev/null || echo "(not sampled)"
    fi
    if ((failed > 0)); then
      # Each failed test with its error as the runtime printed it (cluster
      # tests add their servers' last log lines to the error), then the
      # log's tail, for a run that crashed or was killed without a summary.
      echo "----- failed tests in $log -----"
      failure_reports "$runtime" "$log" | head -n 600
      # Named again at the end of the run (and of .ci/run), where a reader
      # of only the last lines of a long log still sees them.
      failed_names+=("$(failed_test_names "$runtime" "$log" |
        sed -E "s/^/failed test: $runtime $version: /")")
      echo "----- tail of $log -----"
      tail -n 40 "$log"
      echo "----- end of $log -----"
    fi
    skipped_names "$runtime" "$log" |
      sed "s/^/$runtime\t$version\t/" >>"$logdir/skipped.tsv"
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
    total_skipped=$((total_skipped + skipped))
  done
done

# Which tests were skipped, each once, with its reason and the runs that
# skipped it.
if [[ -s "$logdir/skipped.tsv" ]]; then
  echo "skipped tests (docs/testing.md says why each kind is skipped):"
  # A run named once per test, though bun prints a skipped test twice.
  awk -F '\t' '
    (($3, $1, $2) in seen) { next }
    { seen[$3, $1, $2] = 1 }
    $4 != "" { why[$3] = $4 }
    !($3 in runs) { order[++n] = $3; runs[$3] = $1 " " $2; next }
    { runs[$3] = runs[$3] ", " $1 " " $2 }
    END {
      for (i = 1; i <= n; i++) {
        k = order[i]
        printf "  %s%s  [%s]\n", k, (k in why) ? " (" why[k] ")" : "", runs[k]
      }
    }
  ' "$logdir/skipped.tsv"
fi
for names in "${failed_names[@]}"; do
  [[ -n "$names" ]] && printf '%s\n' "$names"
done
echo "$total_passed passed, $total_failed failed, $total_skipped skipped"
((total_failed == 0))
