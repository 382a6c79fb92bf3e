#!/usr/bin/env bash
# plugin.sh DRIVER PLUGIN COMMTRACE: four driver processes (ranks 0-3 of one job) feed the plugin
# NCCL's events; their trace files merge into one run whose ranks agree, with the calls, bytes,
# groups, peers, roots, iterations and GPU durations the driver issued. Calls NCCL never makes
# are ignored, and a collective without a row is reported on stderr, not recorded.
set -u
driver="$1"
plugin="$2"
ct="$3"
fail() { echo "plugin.sh: $*" >&2; exit 1; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

for r in 0 1 2 3; do
  extra=()
  [[ $r == 1 ]] && extra=(bad)
  RANK=$r COMMTRACE_RUN_ID=job-7 COMMTRACE_NCCL_TRACE="$dir/rank-%r.json" \
    "$driver" "$plugin" "$r" 3 "${extra[@]}" 2>"$dir/err-$r.txt" ||
    fail "driver rank $r: $(cat "$dir/err-$r.txt")"
  grep -q "rank $r: wrote $dir/rank-$r.json (18 calls)" "$dir/err-$r.txt" ||
    fail "rank $r stderr: $(cat "$dir/err-$r.txt")"
done
grep -q "1 × Reduce not recorded (no row)" "$dir/err-1.txt" || fail "bad: $(cat "$dir/err-1.txt")"
grep -q "(no name) not recorded" "$dir/err-1.txt" || fail "bad: $(cat "$dir/err-1.txt")"

"$ct" merge "$dir"/rank-*.json -o "$dir/m.json" >/dev/null || fail "merge"
out="$("$ct" show "$dir/m.json" --rank all)" || fail "--rank all: $out"
[[ "$out" == *"ranks consistent: 4 ranks issue the same collectives in the same order"* ]] ||
  fail "--rank all: $out"
# The summary up to the bus bytes (host times vary; a send or recv row names its direction, one
# field more), and the GPU-timed rows whole: all_reduce
# 4 KiB in 3 µs is 1.37 GB/s.
got="$(sed -n '/^per iteration/,/^  total/p' <<<"$out" | awk '{s = $1; for (i = 2; i <= 9 && i <= NF; i++) s = s " " $i; print s}')"
want="per iteration (3 iterations traced, rank 0):
phase collective group n count bytes bus bytes time
(us) (GB/s) (GB/s)
forward all_gather comm1 2 1 1 KiB 512 B
forward all_reduce comm1 2 1 4 KiB 4 KiB
forward broadcast comm0 4 1 64 B 64 B
forward recv 3→0 comm0 4 1 128 B 128
forward reduce_scatter comm0 4 1 2 KiB 1.5 KiB
forward send 0→1 comm0 4 1 128 B 128
total 6 7.31 KiB 6.31 KiB"
[[ "$got" == "$want"* ]] || fail "summary:
$out"
grep -Eq "forward +all_reduce +comm1 +2 +1 +4 KiB +4 KiB +3.0 +1.37 +1.37" <<<"$out" ||
  fail "all_reduce row: $out"
grep -Eq "forward +broadcast +comm0 +4 +1 +64 B +64 B +4.0 " <<<"$out" || fail "broadcast: $out"

# Durations, peers and roots as issued (python3 reads the trace JSON).
python3 - "$dir/m.json" <<'PY' || fail "records"
import json, sys
t = json.load(open(sys.argv[1]))
assert t["metadata"]["run_id"] == "job-7" and t["metadata"]["world_size"] == "4", t["metadata"]
for rank in t["ranks"]:
    r = rank["rank"]
    assert [b["iteration"] for b in rank["blocks"]] == [0, 1, 2], rank["blocks"]
    recs = [x for b in rank["blocks"] for x in b["records"]]
    names = [x["name"] for x in recs]
    assert names == ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv"] * 3, names
    ar, ag, rs, bc, send, recv = recs[:6]
    c = lambda x: x["collective"]
    assert abs(ar["duration_s"] - 3e-6) < 1e-12, ar      # 2 channels: 1000 ns apart, 2000 ns long
    assert abs(ag["duration_s"] - 2e-6) < 1e-12, ag
    assert 0 <= rs["duration_s"] < 1, rs                 # no channels: the host time
    assert c(ar)["group_rank"] == r % 2 and c(rs)["group_rank"] == r, (ar, rs)
    assert ag["outputs"][0]["shape"] == [512] and ag["dtype"] == "bf16", ag
    assert c(bc)["root"] == 2 and bc["dtype"] == "i64", bc
    assert c(send)["peer"] == (r + 1) % 4 and c(recv)["peer"] == (r + 3) % 4, (send, recv)
    assert [c(x)["seq"] for x in recs[6:12]] == [3, 4, 3, 4, 2, 2], recs[6:12]
PY
echo ok
