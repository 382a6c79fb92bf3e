#!/usr/bin/env python3
"""PyTorch oracle for DDP's gradient buckets: wraps the decoder of a commtrace model file
(torch_decoder.py) in torch.nn.parallel.DistributedDataParallel on a fake process group and
prints, per iteration, the element count of every bucket DDP all-reduces (a comm hook records
them; CommDebugMode cannot run DDP on the fake group). Output: one JSON list per line.
Usage: torch_ddp_buckets.py MODEL.json ITERS [BUCKET_CAP_MB]"""
import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.testing._internal.distributed.fake_pg import FakeStore

import torch_decoder


def main():
    path, iters = sys.argv[1], int(sys.argv[2])
    cap = float(sys.argv[3]) if len(sys.argv) > 3 else None
    dist.init_process_group(backend="fake", rank=0, world_size=2, store=FakeStore())
    try:
        a = torch_decoder.load_args(path)
        torch.manual_seed(0)
        ddp = torch.nn.parallel.DistributedDataParallel(torch_decoder.Transformer(a),
                                                        bucket_cap_mb=cap)
        sizes = []

        def hook(state, bucket):
            sizes.append(bucket.buffer().numel())
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        ddp.register_comm_hook(None, hook)
        opt = torch.optim.AdamW(ddp.parameters(), lr=0.1)
        tokens = torch.randint(a["vocab_size"], (a["batch"], a["seq_len"]))
        targets = torch.randint(a["vocab_size"], (a["batch"], a["seq_len"]))
        for _ in range(iters):
            sizes.clear()
            out = ddp(tokens)
            F.cross_entropy(out.flatten(0, 1), targets.flatten(0, 1)).backward()
            opt.step()
            opt.zero_grad()
            print(json.dumps(sizes))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
