#!/usr/bin/env bash
# The step of the composite action (action.yml): run a matrix, or merge the runs of several
# hosts, then hand the headline, exit code and reports directory to the workflow and write the
# summary (and, with a history file, what changed since the last night) to the job summary.
#
# Inputs come as environment variables (the action sets them from its inputs):
#   CUMATRIX_MATRIX, CUMATRIX_HOST, CUMATRIX_REQUIRE_GPU_INPUT (true/false), CUMATRIX_OUT,
#   CUMATRIX_ARGS (extra words for `cumatrix run`, split as a shell would), CUMATRIX_MERGE_FROM
#   (a glob of run directories: merge them instead of running), CUMATRIX_GATE (a glob of wheels:
#   gate them instead of running), CUMATRIX_HISTORY_FILE,
#   CUMATRIX_FAIL (true: this step fails when cumatrix does).
# Outside GitHub Actions (GITHUB_OUTPUT unset) the outputs are printed instead.
set -uo pipefail

matrix="${CUMATRIX_MATRIX:-matrix.yaml}"
out="${CUMATRIX_OUT:-out}"
log="$(mktemp "${RUNNER_TEMP:-/tmp}/cumatrix-log.XXXXXX")"
trap 'rm -f "$log"' EXIT

# An output is written in GitHub's multi-line form (NAME<<DELIMITER) with a delimiter of 128
# random bits: a value holding a newline (an input, a path) cannot add a line of its own, such
# as a second `exit-code=0` after the real one.
# https://docs.github.com/en/actions/reference/workflows-and-actions/workflow-commands#multiline-strings
emit() {
  local delim
  delim="ghadelimiter_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
  if [[ "$2" == *"$delim"* ]]; then
    echo "cumatrix action: output $1 holds its own delimiter; not written" >&2
    return 1
  fi
  if [ -n "${GITHUB_OUTPUT:-}" ]; then
    printf '%s<<%s\n%s\n%s\n' "$1" "$delim" "$2" "$delim" >> "$GITHUB_OUTPUT"
  else
    printf '%s=%s\n' "$1" "$2"
  fi
}

# A name or a path with a control character (a newline, an escape) is refused: it cannot be
# shown in a log or passed on faithfully.  Exit 2, as cumatrix's own bad input.
for input in CUMATRIX_MATRIX CUMATRIX_HOST CUMATRIX_OUT CUMATRIX_MERGE_FROM CUMATRIX_HISTORY_FILE; do
  if [[ "${!input:-}" == *[[:cntrl:]]* ]]; then
    msg="cumatrix action: input ${input#CUMATRIX_} ${!input@Q} holds a control character; rename it"
    echo "$msg" >&2
    emit headline "$msg"
    emit exit-code 2
    exit 2
  fi
done

if [ -n "${CUMATRIX_HISTORY_FILE:-}" ]; then
  # Where the history feature is installed, runs and merges are recorded here ($CUMATRIX_HISTORY).
  export CUMATRIX_HISTORY="$CUMATRIX_HISTORY_FILE"
  mkdir -p "$(dirname "$CUMATRIX_HISTORY_FILE")"
fi

extra=()
if [ -n "${CUMATRIX_ARGS:-}" ]; then
  if ! python3 -c 'import shlex, sys; sys.stdout.write("".join(w + "\0" for w in shlex.split(sys.argv[1])))' \
      "$CUMATRIX_ARGS" > "$log" 2>/dev/null; then
    echo "cumatrix action: args: cannot split ${CUMATRIX_ARGS@Q} as a shell would" >&2
    exit 2
  fi
  mapfile -d '' extra < "$log"
fi

if [ -n "${CUMATRIX_GATE:-}" ]; then
  # Gate mode: the wheels the glob names, through `cumatrix gate` (static audit, then every
  # runtime x driver pairing of the matrix where one exists), instead of a run.
  shopt -s nullglob
  # shellcheck disable=SC2206  # the input is a glob, expanded here on purpose
  wheels=(${CUMATRIX_GATE})
  shopt -u nullglob
  if [ "${#wheels[@]}" -gt 0 ]; then
    cmd=(cumatrix gate "${wheels[@]}" --out "$out")
    [ -f "$matrix" ] && cmd+=(--matrix "$matrix")
    cmd+=("${extra[@]}")
  else
    echo "cumatrix gate: no wheel matches ${CUMATRIX_GATE@Q}: build the wheels first" | tee "$log" >&2
    cmd=()
    code=2
  fi
elif [ -n "${CUMATRIX_MERGE_FROM:-}" ]; then
  shopt -s nullglob
  # shellcheck disable=SC2206  # the input is a glob, expanded here on purpose
  dirs=(${CUMATRIX_MERGE_FROM})
  shopt -u nullglob
  found=()
  for d in "${dirs[@]}"; do
    [ -f "$d/results.jsonl" ] && found+=("$d")
  done
  if [ "${#found[@]}" -gt 0 ]; then
    cmd=(cumatrix merge "${found[@]}" --out "$out" --matrix "$matrix")
  else
    echo "cumatrix: merge: no run directory with results matches ${CUMATRIX_MERGE_FROM@Q}: no host ran" | tee "$log" >&2
    cmd=()
  fi
else
  cmd=(cumatrix run "$matrix" --out "$out")
  [ "${CUMATRIX_REQUIRE_GPU_INPUT:-true}" = true ] && cmd+=(--require-gpu)
  [ -n "${CUMATRIX_HOST:-}" ] && cmd+=(--host "$CUMATRIX_HOST")
  cmd+=("${extra[@]}")
fi

if [ "${#cmd[@]}" -gt 0 ]; then
  echo "+ ${cmd[*]}" >&2
  "${cmd[@]}" 2>&1 | tee "$log"
  code=${PIPESTATUS[0]}
else
  code=${code:-1}
fi

headline="$(grep -E '^cumatrix: (PASS|FAIL|INCOMPLETE|NOTHING TESTED|EMPTY) — ' "$log" | tail -n 1)"
[ -n "$headline" ] || headline="$(tail -n 1 "$log")"
reports="$(realpath -m "$out")"

emit headline "$headline"
emit exit-code "$code"
emit reports-dir "$reports"

summary="${GITHUB_STEP_SUMMARY:-/dev/null}"
if [ -f "$out/summary.md" ]; then
  cat "$out/summary.md" >> "$summary"
else
  printf '%s\n' "$headline" >> "$summary"
fi
# `cumatrix diff` (the history feature) compares this run with the last one recorded; a
# cumatrix without it, or a history with one run, leaves the section out, and so does a
# summary.md that has its own "since the last run" section already (written once, not twice).
if [ -n "${CUMATRIX_HISTORY_FILE:-}" ] && cumatrix diff --help >/dev/null 2>&1 \
    && ! grep -q '^### Since the last run' "$out/summary.md" 2>/dev/null; then
  if diff_text="$(cumatrix diff --history "$CUMATRIX_HISTORY_FILE" 2>&1)"; then
    # A fence longer than any run of backticks in the text: a stored cell id cannot close it.
    longest="$(printf '%s' "$diff_text" | grep -o '`\+' | awk '{ if (length($0) > m) m = length($0) } END { print m + 0 }')"
    fence="$(printf '%*s' "$(( longest < 3 ? 3 : longest + 1 ))" '' | tr ' ' '`')"
    printf '\n### Since the last recorded run\n\n%s\n%s\n%s\n' "$fence" "$diff_text" "$fence" >> "$summary"
  else
    echo "cumatrix action: no diff: $diff_text" >&2
  fi
fi

if [ "${CUMATRIX_FAIL:-true}" = true ]; then
  exit "$code"
fi
exit 0
