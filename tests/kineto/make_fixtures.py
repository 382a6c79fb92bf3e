#!/usr/bin/env python3
"""Makes the PyTorch profiler fixtures of `commtrace import kineto` (tests/kineto/data/): real
torch.profiler traces of commtrace's reference models, parallelized with PyTorch's own TP/SP
styles (tests/oracle/torch_oracle.py's build), one process per rank on the CPU (gloo), written
gzipped by export_chrome_trace. Per iteration: forward, out.sum().backward(), AdamW step (under
implicit_replication, as PyTorch's test_tp_examples.py) and zero_grad; the profiler's schedule
skips the first iteration (warm-up) and records the next two, one ProfilerStep each.

Modules are named by samples/python/annotate_modules.py ("module: <FQN> (<Type>)" ranges),
except in two variants of toy sp: `plain` (no module ranges) and `stack` (with_stack=True:
PyTorch's own nn.Module ranges, instance names only).

Usage: make_fixtures.py [OUT_DIR]   (default: data/ next to this file)
Needs torch (tests/oracle/README.md). Not part of the build: the outputs are checked in."""
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "oracle"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "samples", "python"))

# (model, plan, world size, variant): commtrace's counterpart is
# `commtrace run --model M --plan P --world-size N --iters 2`.
CASES = [
    ("toy", "tp", 2, "annotated"),
    ("toy", "sp", 2, "annotated"),
    ("toy", "sp", 2, "plain"),
    ("toy", "sp", 2, "stack"),
    ("mlp", "sp", 4, "annotated"),
    ("transformer", "tp", 2, "annotated"),
    ("transformer", "sp", 2, "annotated"),
]


def rank_main(rank, world, model_name, plan, variant, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        import torch_oracle
        from annotate_modules import annotate_modules
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import implicit_replication
        from torch.profiler import ProfilerActivity, profile, schedule

        mesh = init_device_mesh("cpu", (world,))
        model, inp = torch_oracle.build(model_name, plan, mesh, False)
        if variant == "annotated":
            annotate_modules(model)
        opt = torch.optim.AdamW(model.parameters(), lr=0.25, foreach=True)

        def save(prof):
            prof.export_chrome_trace(os.path.join(out, f"rank{rank}.json.gz"))

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                     with_stack=variant == "stack",
                     schedule=schedule(wait=0, warmup=1, active=2), on_trace_ready=save) as prof:
            for _ in range(3):
                model(inp).sum().backward()
                with implicit_replication():
                    opt.step()
                opt.zero_grad()
                prof.step()
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "data")
    for model_name, plan, world, variant in CASES:
        name = f"{model_name}_{plan}_w{world}" + ("" if variant == "annotated" else f"_{variant}")
        out = os.path.join(root, name)
        os.makedirs(out, exist_ok=True)
        mp.spawn(rank_main, args=(world, model_name, plan, variant, free_port(), out),
                 nprocs=world)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
