#!/usr/bin/env python3
"""Re-measures the seed cases with torch_oracle.py and compares them with the stored
PyTorch 2.11 references in ../shared/reference/torch/ (per-module counts, totals, per-phase
totals, and the byte-exact generate_json_dump goldens). Exit 1 on any difference.

Usage: .venv/bin/python tests/oracle/check_references.py [--reference-dir DIR]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE = os.path.join(HERE, "torch_oracle.py")
DEFAULT_REF = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "reference", "torch"))

# (name, oracle args, reference file)
CASES = [
    ("toy tp", ["--model", "toy", "--plan", "tp"], "toy_tp_example.json"),
    ("toy tp rg", ["--model", "toy", "--plan", "tp", "--input-requires-grad"],
     "toy_tp_input_requires_grad.json"),
    ("toy sp", ["--model", "toy", "--plan", "sp"], "toy_sp_example.json"),
    ("toy sp rg", ["--model", "toy", "--plan", "sp", "--input-requires-grad"],
     "toy_sp_input_requires_grad.json"),
    ("mlp tp", ["--model", "mlp", "--plan", "tp", "--no-optimizer"], "mlp_tp.json"),
    ("mlp sp", ["--model", "mlp", "--plan", "sp", "--no-optimizer"], "mlp_sp.json"),
    ("mlp tp +opt", ["--model", "mlp", "--plan", "tp"], "mlp_tp.json"),
    ("mlp sp +opt", ["--model", "mlp", "--plan", "sp"], "mlp_sp.json"),
]


def run(args, tmp, tag):
    out, counts = os.path.join(tmp, tag + ".dump.json"), os.path.join(tmp, tag + ".counts.json")
    subprocess.run([sys.executable, ORACLE, "--world-size", "4", *args, "--out-json", out,
                    "--counts-json", counts], check=True, stderr=subprocess.DEVNULL)
    with open(counts) as f:
        return json.load(f), out


def norm(d):
    return {k: {ph: dict(v[ph]) for ph in ("forward", "backward")} for k, v in d.items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reference-dir", default=DEFAULT_REF)
    a = p.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, args, ref_file) in enumerate(CASES):
            mine, _ = run(args, tmp, f"c{i}")
            with open(os.path.join(a.reference_dir, ref_file)) as f:
                ref = json.load(f)["measured"]
            ref_total = ref.get("comm_counts") or ref.get("one_iteration_fwd_bwd_step")
            ref_fwd = ref.get("forward", ref.get("forward_only"))
            ref_bwd = ref.get("backward", ref.get("backward_only"))
            checks = {
                "per_module": norm(mine["per_module"]) == norm(ref["comm_module_counts"]),
                "total": mine["total"] == ref_total,
                "forward": mine["phase_totals"]["forward"] == ref_fwd,
                "backward": mine["phase_totals"]["backward"] == ref_bwd,
                "optimizer": mine["phase_totals"]["optimizer"] == ref.get("optimizer_step", {}),
            }
            ok = all(checks.values())
            bad += not ok
            print(f"{name:12s} vs {ref_file:34s} "
                  + " ".join(f"{k}={'ok' if v else 'DIFF'}" for k, v in checks.items()))
        for level in (0, 3):
            _, dump = run(["--model", "mlp", "--plan", "tp", "--no-optimizer",
                           "--noise-level", str(level)], tmp, f"golden{level}")
            with open(dump) as f1, open(os.path.join(
                    a.reference_dir, f"golden_mlp_tp_comm_mode_log_noise{level}.json")) as f2:
                same = f1.read() == f2.read()
            bad += not same
            print(f"golden_mlp_tp_comm_mode_log_noise{level}.json "
                  + ("byte-exact" if same else "DIFF"))
    print("all match" if not bad else f"{bad} mismatching case(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
