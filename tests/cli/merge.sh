#!/usr/bin/env bash
# merge.sh COMMTRACE [MPIRUN]: run --per-rank-files writes one file per traced rank, and merge
# joins them into the same file --json writes; merge refuses files of different runs and a rank
# given twice; show names the ranks a file holds. With MPIRUN, the same through one process per
# rank (--backend mpi).
set -u
ct="$1"
mpirun="${2:-}"
fail() { echo "merge.sh: $*" >&2; exit 1; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

"$ct" run --model mlp --plan sp --world-size 3 --rank all --per-rank-files "$dir/a" \
  --json "$dir/a.json" >/dev/null || fail "run --per-rank-files failed"
[[ -f "$dir/a/rank-0.json" && -f "$dir/a/rank-1.json" && -f "$dir/a/rank-2.json" ]] ||
  fail "missing per-rank files: $(ls "$dir/a")"
"$ct" merge "$dir/a/rank-2.json" "$dir/a/rank-0.json" "$dir/a/rank-1.json" -o "$dir/m.json" \
  >/dev/null || fail "merge failed"
cmp -s "$dir/m.json" "$dir/a.json" || fail "the merged file differs from --json's"

"$ct" run --model mlp --plan sp --world-size 3 --rank 1 --per-rank-files "$dir/b" >/dev/null
err="$("$ct" merge "$dir/a/rank-0.json" "$dir/b/rank-1.json" -o "$dir/x.json" 2>&1)"
[[ $? == 2 && "$err" == *"the files come from different runs"* ]] || fail "different runs: $err"
err="$("$ct" merge "$dir/a/rank-0.json" "$dir/a/rank-0.json" -o "$dir/x.json" 2>&1)"
[[ $? == 2 && "$err" == *"rank 0 is also in"* ]] || fail "a rank twice: $err"
[[ ! -e "$dir/x.json" ]] || fail "a failed merge wrote its output"
# A merged file without rank 0: show (default --rank 0) names the ranks it holds.
"$ct" merge "$dir/a/rank-2.json" "$dir/a/rank-1.json" -o "$dir/r.json" >/dev/null || fail "merge of 2"
err="$("$ct" show "$dir/r.json" 2>&1)"
[[ $? == 2 && "$err" == *"holds no trace of rank 0 (it holds ranks 1, 2; pick one with --rank)"* ]] ||
  fail "show without rank 0: $err"
"$ct" show "$dir/r.json" --rank 2 >/dev/null || fail "show --rank 2 of the merged file"

if [[ -n "$mpirun" ]]; then
  timeout 120 "$mpirun" -np 3 "$ct" run --backend mpi --model transformer --plan sp --rank all \
    --per-rank-files "$dir/c" --json "$dir/c.json" >/dev/null || fail "mpirun run failed"
  "$ct" merge "$dir"/c/rank-*.json -o "$dir/mc.json" >/dev/null || fail "merge of mpi files"
  cmp -s "$dir/mc.json" "$dir/c.json" || fail "the merged mpi files differ from --json's"
fi
echo ok
