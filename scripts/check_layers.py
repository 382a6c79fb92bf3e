#!/usr/bin/env python3
"""Checks the layer table of DESIGN.md §1 on the #include lines of commtrace's sources.

Scans every .h/.hpp/.cpp/.cu/.cuh file under kernels/ tracer/ parallel/ report/ cli/ samples/
and reports each project include that crosses the table, as `file:line: ... [rule]`. Inside
parallel/ the sub-folders are layers too, in the order tensor, comm, dtensor, nn, plans, run (a
file includes its own folder and those before it), and of kernels/ only the device seam
(kernels/base.h, kernels/backend.h) may be included. A source file in parallel/ longer than
MAX_PARALLEL_LINES is reported too (its line 1): the runtime is split by concern, not grown.
Exit status: 0 clean, 1 violations found (or self-test failed), 2 usage error.

    check_layers.py [ROOT]      check the tree at ROOT (default: the repository of this script)
    check_layers.py --self-test build a small tree with known violations and check that the
                                checker reports exactly those

What it is not: a C preprocessor. Comments are ignored, but an include inside `#if 0` is still
checked. Python 3 standard library only.
"""

import os
import re
import subprocess
import sys
import tempfile

SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cu", ".cuh")

# folder -> (folders it may include from, exact extra headers it may include, rule text).
# None as the folder set means "anything".
LAYERS = {
    "kernels": ({"kernels"}, set(), "kernels/ may include only kernels/"),
    "tracer": ({"tracer"}, {"kernels/base.h"},
               'tracer/ may include only tracer/ and "kernels/base.h"'),
    "parallel": ({"kernels", "tracer", "parallel"}, set(),
                 "parallel/ may include only kernels/, tracer/, parallel/"),
    "report": ({"tracer", "report"}, set(), "report/ may include only tracer/ and report/"),
    "samples": ({"parallel", "tracer", "report", "samples"}, set(),
                "samples/ may include only parallel/, tracer/, report/, samples/"),
    "cli": (None, set(), "cli/ may include anything"),
}
# Top-level folders whose headers count as "ours" (tests/ is ours but is not a layer to scan).
PROJECT_FOLDERS = set(LAYERS) | {"tests"}

# Inside parallel/: the sub-layers in one-way order; a file may include its own sub-folder and
# those before it. Of kernels/, parallel/ sees only the device seam.
PARALLEL_ORDER = ["tensor", "comm", "dtensor", "nn", "plans", "run"]
PARALLEL_KERNELS = {"kernels/base.h", "kernels/backend.h"}
# The runtime's files stay near 500 lines; past this one a file is split by concern.
MAX_PARALLEL_LINES = 550
LENGTH_RULE = f"a parallel/ source file has at most {MAX_PARALLEL_LINES} lines: split it by concern"


def parallel_rule(src_rel, target):
    """The rule a parallel/ file's include of `target` breaks, or None."""
    parts = src_rel.split("/")
    sub = parts[1] if len(parts) > 2 else None
    if target.startswith("kernels/") and target not in PARALLEL_KERNELS:
        return "parallel/ may include of kernels/ only the device seam (base.h, backend.h)"
    if not target.startswith("parallel/"):
        return None
    if sub not in PARALLEL_ORDER:
        return f"parallel/ files live in one of {', '.join(PARALLEL_ORDER)}/"
    tparts = target.split("/")
    tsub = tparts[1] if len(tparts) > 2 else None
    allowed = PARALLEL_ORDER[: PARALLEL_ORDER.index(sub) + 1]
    if tsub not in allowed:
        return f"parallel/{sub}/ may include only parallel/{{{', '.join(allowed)}}}/"
    return None

INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^">\n]+)[">]')


def strip_comments(text):
    """Returns text with // and /* */ comments blanked out, keeping newlines (line numbers)
    and string / character literals (including raw strings) intact."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c == "/" and nxt == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == "R" and nxt == '"' and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\ \t\n]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i + m.end())
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(text[i:j])
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def resolve(root, src_rel, delim, inc):
    """Returns the include's path relative to ROOT (forward slashes) if it names one of our
    files, else None (a system or third-party header)."""
    src_dir = os.path.dirname(src_rel)
    inc = inc.strip()
    if delim == '"':
        # The compiler looks next to the including file first.
        local = os.path.normpath(os.path.join(src_dir, inc)).replace(os.sep, "/")
        if inc.startswith(("./", "../")) or os.path.isfile(os.path.join(root, local)):
            return None if local.startswith("../") else local
        rooted = os.path.normpath(inc).replace(os.sep, "/")
        if rooted.split("/", 1)[0] in PROJECT_FOLDERS and "/" in rooted:
            return rooted  # may not exist yet: the tree can be mid-edit
        return None
    # <...>: only when the header really is ours (<parallel/algorithm> is libstdc++'s).
    rooted = os.path.normpath(inc).replace(os.sep, "/")
    if rooted.split("/", 1)[0] in PROJECT_FOLDERS and os.path.isfile(os.path.join(root, rooted)):
        return rooted
    return None


def check_tree(root):
    """Returns (violations, files_scanned, includes_checked, layers_found)."""
    violations = []
    files = 0
    checked = 0
    found = []
    for layer in sorted(LAYERS):
        top = os.path.join(root, layer)
        if not os.path.isdir(top):
            continue
        found.append(layer)
        allowed, exact, rule = LAYERS[layer]
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                files += 1
                with open(path, encoding="utf-8", errors="replace") as f:
                    raw = f.read()
                text = strip_comments(raw)
                lines = raw.count("\n") + (0 if raw.endswith("\n") or not raw else 1)
                if layer == "parallel" and lines > MAX_PARALLEL_LINES:
                    violations.append((rel, 1, None, lines, LENGTH_RULE))
                for lineno, line in enumerate(text.split("\n"), start=1):
                    m = INCLUDE_RE.match(line)
                    if not m:
                        continue
                    target = resolve(root, rel, m.group(1), m.group(2))
                    if target is None:
                        continue
                    checked += 1
                    shown = m.group(1) + m.group(2).strip() + ('"' if m.group(1) == '"' else ">")
                    if layer == "parallel":
                        sub_rule = parallel_rule(rel, target)
                        if sub_rule:
                            violations.append((rel, lineno, shown, target, sub_rule))
                            continue
                    if allowed is None or target in exact:
                        continue
                    if target.split("/", 1)[0] in allowed:
                        continue
                    violations.append((rel, lineno, shown, target, rule))
    return violations, files, checked, found


def run_check(root):
    if not os.path.isdir(root):
        print(f"check_layers: {root}: not a directory", file=sys.stderr)
        return 2
    violations, files, checked, found = check_tree(root)
    if not found:
        print(f"check_layers: {root}: none of {', '.join(sorted(LAYERS))}/ found; "
              "is this the commtrace repository?", file=sys.stderr)
        return 2
    for rel, lineno, shown, target, rule in violations:
        if shown is None:
            print(f"{rel}:{lineno}: {target} lines [{rule}]")
        else:
            print(f"{rel}:{lineno}: #include {shown} -> {target} crosses the layer table "
                  f"[{rule}]")
    if violations:
        print(f"check_layers: FAILED: {len(violations)} violation(s) in {files} files "
              "(see DESIGN.md §1)")
        return 1
    print(f"check_layers: OK: {files} files, {checked} project includes, "
          f"layers present: {', '.join(found)}")
    return 0


# ---- self-test ------------------------------------------------------------------------------

# path -> content. Lines ending in "// BAD" must be reported; nothing else may be.
SELF_TEST_TREE = {
    "CMakeLists.txt": "",
    "kernels/base.h": "#pragma once\n#include <cstddef>\n",
    "kernels/cpu.h": '#pragma once\n#include "kernels/base.h"\n#include <vector>\n',
    "kernels/sneaky.cpp": (
        '#include "kernels/cpu.h"\n'
        'static const char* kPattern = "a/*b";  // a comment opener inside a string\n'
        '#include "report/text.h"  // BAD\n'
        '#include "../tracer/trace.h"  // BAD\n'
    ),
    "tracer/trace.h": (
        "#pragma once\n"
        '#include "kernels/base.h"\n'
        '// #include "parallel/tensor.h"\n'
        "/*\n"
        '#include "kernels/cpu.h"\n'
        "*/\n"
        '#include "tracer/tracer.h"\n'
    ),
    "tracer/bad.h": '#pragma once\n#include "tracer/trace.h"\n#include "kernels/cpu.h"  // BAD\n',
    "parallel/tensor/ops.cpp": (
        '#include "kernels/backend.h"\n'
        '#  include "tracer/trace.h"\n'
        '#include "parallel/tensor/ops.h"\n'
        "#include <parallel/algorithm>\n"
        '#include "report/json.h"  // BAD\n'
        '#include "parallel/dtensor/dtensor.h"  // BAD\n'
        '#include "kernels/cpu.h"  // BAD\n'
    ),
    "parallel/nn/models.cpp": (
        '#include "parallel/tensor/ops.h"\n#include "parallel/dtensor/dtensor.h"\n'
        '#include "parallel/nn/nn.h"\n#include "parallel/run/runner.h"  // BAD\n'
    ),
    "parallel/loose.cpp": '#include "parallel/tensor/ops.h"  // BAD\n',
    # One line over the limit (reported at line 1); a file at the limit passes.
    "parallel/nn/long.cpp": "// BAD\n" + "\n" * MAX_PARALLEL_LINES,
    "parallel/nn/at_limit.cpp": "\n" * MAX_PARALLEL_LINES,
    "report/text.cpp": (
        '#include "report/text.h"\n'
        '#include "tracer/trace.h"\n'
        '#include "kernels/base.h"  // BAD\n'
        "#include <nlohmann/json.hpp>\n"
    ),
    "samples/tp_example.cpp": (
        '#include "parallel/tensor/ops.h"\n#include "report/text.h"\n'
        '#include "kernels/cpu.h"  // BAD\n'
    ),
    "cli/main.cpp": (
        '#include "kernels/cpu.h"\n#include "tracer/trace.h"\n#include "parallel/tensor/ops.h"\n'
        '#include "report/text.h"\n#include "samples/models.h"\n#include "tests/catch_compat.h"\n'
    ),
    "cli/README.txt": '#include "kernels/cpu.h"\n',  # not a source file: ignored
}


def write_tree(root, tree):
    for rel, content in tree.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)


def run_self(root):
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), root],
                          capture_output=True, text=True)
    reported = set()
    for line in proc.stdout.splitlines():
        m = re.match(r"^(\S+):(\d+): ", line)
        if m:
            reported.add((m.group(1), int(m.group(2))))
    return proc, reported


def self_test():
    failures = []
    with tempfile.TemporaryDirectory(prefix="check_layers_") as tmp:
        # 1. The mixed tree: exactly the lines marked BAD, exit status 1.
        mixed = os.path.join(tmp, "mixed")
        write_tree(mixed, SELF_TEST_TREE)
        expected = {(rel, i) for rel, content in SELF_TEST_TREE.items()
                    for i, line in enumerate(content.split("\n"), start=1)
                    if line.endswith("// BAD")}
        proc, reported = run_self(mixed)
        if proc.returncode != 1:
            failures.append(f"mixed tree: exit status {proc.returncode}, expected 1")
        for miss in sorted(expected - reported):
            failures.append(f"mixed tree: violation not reported: {miss[0]}:{miss[1]}")
        for extra in sorted(reported - expected):
            failures.append(f"mixed tree: clean line reported: {extra[0]}:{extra[1]}")

        # 2. One violating file and one clean file, each alone.
        bad = os.path.join(tmp, "bad")
        write_tree(bad, {"tracer/bad.h": SELF_TEST_TREE["tracer/bad.h"]})
        proc, reported = run_self(bad)
        if proc.returncode != 1 or reported != {("tracer/bad.h", 3)}:
            failures.append(f"violating file: exit {proc.returncode}, reported {sorted(reported)}, "
                            "expected exit 1 and tracer/bad.h:3")
        clean = os.path.join(tmp, "clean")
        write_tree(clean, {"tracer/trace.h": SELF_TEST_TREE["tracer/trace.h"]})
        proc, reported = run_self(clean)
        if proc.returncode != 0 or reported:
            failures.append(f"clean file: exit {proc.returncode}, reported {sorted(reported)}, "
                            "expected exit 0 and nothing")

        # 3. A directory that is not the repository is an error, not a silent pass.
        empty = os.path.join(tmp, "empty")
        os.makedirs(empty)
        proc, _ = run_self(empty)
        if proc.returncode != 2:
            failures.append(f"empty tree: exit status {proc.returncode}, expected 2")

    if failures:
        for f in failures:
            print(f"check_layers self-test: FAIL: {f}")
        return 1
    print(f"check_layers self-test: OK ({len(expected)} violations caught exactly, "
          "clean trees pass, a wrong root is an error)")
    return 0


def main(argv):
    if len(argv) > 2 or (len(argv) == 2 and argv[1] in ("-h", "--help")):
        print(__doc__.strip())
        return 0 if len(argv) == 2 else 2
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) == 2 and argv[1].startswith("-"):
        print(f"check_layers: unknown option {argv[1]}", file=sys.stderr)
        return 2
    root = argv[1] if len(argv) == 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "..")
    return run_check(os.path.abspath(root))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
