#!/usr/bin/env bash
# html_check.sh COMMTRACE: the HTML report of the transformer's TP and SP traces at world 4,
# loaded in headless Chromium (Debian's chromium, which scripts/test.sh installs): the page
# renders without a console message (an error or a log), marks itself rendered, and its DOM
# holds each trace's totals, the per-module bars and both timelines. Exit 77 (skipped) without
# chromium.
set -u
ct="$1"
browser="$(command -v chromium || command -v chromium-browser || true)"
if [[ -z "$browser" ]]; then echo "html_check.sh: SKIP: no chromium"; exit 77; fi
fail() { echo "html_check.sh: $*" >&2; exit 1; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$ct" run --model transformer --plan tp --world-size 4 --json "$dir/tp.json" >/dev/null || fail "run tp"
"$ct" run --model transformer --plan sp --world-size 4 --json "$dir/sp.json" >/dev/null || fail "run sp"
"$ct" report "$dir/tp.json" "$dir/sp.json" -o "$dir/report.html" >/dev/null || fail "report"
# Self-contained: nothing to fetch (no external script, style, image, import or url()).
if grep -Eq '<script [^>]*src=|<link |<img |@import|url\(' "$dir/report.html"; then
  fail "the page fetches something"
fi
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --enable-logging=stderr --v=0 \
  --user-data-dir="$dir/profile" --dump-dom "file://$dir/report.html" >"$dir/dom.html" \
  2>"$dir/console.txt" || fail "chromium failed: $(tail -5 "$dir/console.txt")"
if grep -q "CONSOLE" "$dir/console.txt"; then fail "console: $(grep CONSOLE "$dir/console.txt")"; fi
dom="$(cat "$dir/dom.html")"
[[ "$dom" == *'data-status="ok"'* ]] || fail "the page did not render: $(head -c 400 "$dir/dom.html")"
for want in 'id="total-count-0">16<' 'id="total-count-1">33<' 'id="total-bytes-0">58.5 KiB<' \
  'id="total-bus-1">63.2 KiB<' 'id="bars"' 'id="timeline-0"' 'id="timeline-1"'; do
  [[ "$dom" == *"$want"* ]] || fail "the DOM lacks $want"
done
rects="$(grep -o '<rect' "$dir/dom.html" | wc -l)"
((rects > 100)) || fail "timeline: $rects slices"
echo "ok: rendered, $rects timeline slices"
