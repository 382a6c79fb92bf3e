#!/usr/bin/env python3
"""ColossalAI's ring self-attention and DeepSpeed-Ulysses as oracles for commtrace's rsa and
ulysses cores.

At each world size the published code runs on gloo, one process per rank, on the same causal
attention problem (q, k, v and the output's gradient, f64, B x H x T x D) as commtrace's core
(tests/oracle/cp_core.cpp, threads backend):
  - rsa: colossalai.legacy.nn.layer.parallel_sequence's RingQK and RingAV exactly as published
    (scores / sqrt(D), causal mask on global positions and softmax between them, as
    TransformerSelfAttentionRing puts them), against commtrace's rsa with the published scaling
    (divide_by_world_size, all_reduce + slice);
  - ulysses: deepspeed.sequence.layer.DistributedAttention around causal SDPA (sequence-first
    layout, scatter heads, gather the sequence), against commtrace's ulysses.
Compared: every rank's output and gradients of its q, k, v chunk (max abs difference <= 1e-10),
and the collectives per phase (CommDebugMode for collectives; send and recv counted from the
ops handed to batch_isend_irecv, which CommDebugMode does not see).

Usage: cp_oracle.py --cp-core PATH [--worlds 2 4] [--commtrace-rsa-divide false]. Exit 0 on agreement, 1 on a difference,
77 when colossalai or deepspeed is not importable.
"""
import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile

B, H, T, D = 2, 4, 8, 4
TOL = 1e-10

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
    from torch.distributed.tensor.debug import CommDebugMode
except ImportError as e:
    print(f"cp_oracle: torch not importable ({e}); skipped")
    sys.exit(77)

# CommDebugMode's c10d op names -> commtrace's collective names.
C10D_NAMES = {
    "allreduce_": "all_reduce",
    "alltoall_base_": "all_to_all",
    "alltoall_": "all_to_all",
    "_allgather_base_": "all_gather",
    "allgather_": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter",
    "broadcast_": "broadcast",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Counter:
    """Collectives of one phase: CommDebugMode plus the p2p ops of batch_isend_irecv."""

    def __init__(self):
        self.counts = {}
        self.mode = CommDebugMode()

    def __enter__(self):
        self.original = dist.batch_isend_irecv

        def counted(ops):
            for op in ops:
                name = "send" if op.op in (dist.isend, dist.send) else "recv"
                self.counts[name] = self.counts.get(name, 0) + 1
            return self.original(ops)

        dist.batch_isend_irecv = counted
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        dist.batch_isend_irecv = self.original
        for op, n in self.mode.get_comm_counts().items():
            name = C10D_NAMES.get(str(op).split(".")[-1], str(op))
            self.counts[name] = self.counts.get(name, 0) + n
        return False


def problem(world):
    g = torch.Generator().manual_seed(1000 + world)
    return {k: torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for k in ("q", "k", "v", "grad")}


def chunk(x, rank, world):
    tl = T // world
    return x[:, :, rank * tl:(rank + 1) * tl].clone()


def causal_mask(rank, world):
    tl = T // world
    i = torch.arange(tl).unsqueeze(1) + rank * tl
    j = torch.arange(T).unsqueeze(0)
    return torch.zeros(tl, T, dtype=torch.float64).masked_fill(j > i, float("-inf"))


def colossalai_rank(rank, world, port, data):
    from colossalai.accelerator import get_accelerator
    from colossalai.legacy.initialize import launch
    from colossalai.legacy.nn.layer.parallel_sequence._operation import RingAV, RingQK

    launch(config=dict(parallel=dict(tensor=dict(size=world, mode="sequence"))), rank=rank,
           world_size=world, host="::1", port=port, backend="gloo", verbose=False)
    # ring_forward synchronizes the device after its send/recv; ColossalAI's CPU accelerator
    # raises there, and on the CPU the waited-for ops are already complete.
    get_accelerator().synchronize = lambda *a, **k: None
    tl = T // world
    flat = lambda x: chunk(x, rank, world).reshape(B * H, tl, D).requires_grad_()
    q, k, v = flat(data["q"]), flat(data["k"]), flat(data["v"])
    with Counter() as fwd:
        scores = RingQK.apply(q, k, B, H, tl) / math.sqrt(D)
        probs = F.softmax(scores + causal_mask(rank, world), dim=-1)
        out = RingAV.apply(probs, v, B, H, D, tl)
    with Counter() as bwd:
        out.backward(chunk(data["grad"], rank, world).reshape(B * H, tl, D))
    shaped = lambda x: x.reshape(B, H, tl, D)
    return shaped(out), shaped(q.grad), shaped(k.grad), shaped(v.grad), fwd.counts, bwd.counts


def deepspeed_rank(rank, world, port, data):
    import deepspeed
    from deepspeed.sequence.layer import DistributedAttention

    dist.init_process_group("gloo", rank=rank, world_size=world,
                            init_method=f"tcp://127.0.0.1:{port}")
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)

    def local_attention(q, k, v):  # (S, B, H/W, D), whole sequences
        q, k, v = (x.permute(1, 2, 0, 3) for x in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(2, 0, 1, 3)

    attn = DistributedAttention(local_attention, dist.group.WORLD, scatter_idx=2, gather_idx=0)
    seq_first = lambda x: chunk(x, rank, world).permute(2, 0, 1, 3).contiguous().requires_grad_()
    q, k, v = seq_first(data["q"]), seq_first(data["k"]), seq_first(data["v"])
    with Counter() as fwd:
        out = attn(q, k, v, batch_dim_idx=1)
    with Counter() as bwd:
        out.backward(chunk(data["grad"], rank, world).permute(2, 0, 1, 3))
    shaped = lambda x: x.permute(1, 2, 0, 3)
    return shaped(out), shaped(q.grad), shaped(k.grad), shaped(v.grad), fwd.counts, bwd.counts


def worker(rank, family, world, port, data, outdir):
    torch.set_num_threads(1)
    run = colossalai_rank if family == "rsa" else deepspeed_rank
    out, gq, gk, gv, fwd, bwd = run(rank, world, port, data)
    torch.save({"out": out.detach(), "grad_q": gq, "grad_k": gk, "grad_v": gv,
                "counts": {"forward": fwd, "backward": bwd}}, os.path.join(outdir, f"{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def commtrace_run(cp_core, family, world, data, work, rsa_divide):
    cp = {"family": family}
    if family == "rsa":
        cp.update(divide_by_world_size=rsa_divide, grad_reduction="all_reduce")
    spec = {"world": world, "shape": [B, H, T, D], "context_parallel": cp}
    spec.update({k: v.flatten().tolist() for k, v in data.items()})
    src, dst = os.path.join(work, "in.json"), os.path.join(work, "out.json")
    with open(src, "w") as f:
        json.dump(spec, f)
    subprocess.run([cp_core, src, dst], check=True)
    with open(dst) as f:
        return json.load(f)


def compare(family, world, ours, theirs):
    problems = []
    tl = T // world
    for r, (mine, ref) in enumerate(zip(ours["ranks"], theirs)):
        for key in ("out", "grad_q", "grad_k", "grad_v"):
            got = torch.tensor(mine[key], dtype=torch.float64).reshape(B, H, tl, D)
            diff = (got - ref[key]).abs().max().item()
            if not diff <= TOL:
                ratio = (ref[key].flatten() @ got.flatten() / (got.flatten() @ got.flatten())).item()
                problems.append(f"rank {r} {key}: max |diff| {diff:.3g} (theirs = {ratio:.4g} x ours)")
    for phase in ("forward", "backward"):
        mine, ref = ours["counts"].get(phase, {}), theirs[0]["counts"][phase]
        if mine != ref:
            problems.append(f"{phase} collectives: commtrace {mine}, reference {ref}")
    label = {"rsa": "ColossalAI RingQK/RingAV vs commtrace rsa",
             "ulysses": "DeepSpeed DistributedAttention vs commtrace ulysses"}[family]
    fwd, bwd = theirs[0]["counts"]["forward"], theirs[0]["counts"]["backward"]
    print(f"{label} at world {world}: forward {fwd}, backward {bwd}: "
          + ("agree (outputs and q, k, v gradients within 1e-10 on every rank)" if not problems
             else "DIFFER"))
    for p in problems:
        print("  " + p)
    return not problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cp-core", required=True)
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--commtrace-rsa-divide", choices=["true", "false"], default="true",
                    help="commtrace's divide_by_world_size for rsa; false must show a difference")
    args = ap.parse_args()
    for name in ("colossalai", "deepspeed"):
        try:
            __import__(name)
        except Exception as e:  # noqa: BLE001 - any import failure means: not usable here
            print(f"cp_oracle: {name} not importable ({type(e).__name__}: {e}); skipped")
            return 77
    ok = True
    for world in args.worlds:
        data = problem(world)
        for family in ("rsa", "ulysses"):
            with tempfile.TemporaryDirectory() as work:
                ours = commtrace_run(args.cp_core, family, world, data, work,
                                     args.commtrace_rsa_divide == "true")
                mp.spawn(worker, args=(family, world, free_port(), data, work), nprocs=world)
                theirs = [torch.load(os.path.join(work, f"{r}.pt")) for r in range(world)]
            ok &= compare(family, world, ours, theirs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
