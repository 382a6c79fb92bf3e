#!/usr/bin/env python3
"""PyTorch oracle: what CommDebugMode reports for commtrace's reference models and plans.

Runs one rank of a TP/SP model on a fake process group (no real communication) under
torch.distributed.tensor.debug.CommDebugMode (a fresh one per iteration) and writes:
  --out-json     generate_json_dump(noise_level=...) of the last iteration (PyTorch's format)
  --counts-json  {"torch_version", "model", "plan", "world_size", "rank", "iters",
                  "input_requires_grad", "optimizer",
                  "output_local_shape",
                  "per_module": {fqn: {"forward": {op: n}, "backward": {op: n}}},
                  "total": {op: n},
                  "phase_totals": {"forward"|"backward"|"optimizer": {op: n}}}
"per_module" is CommDebugMode.comm_module_counts (torch 2.11 has no getter) summed over
iterations, keys sorted: PyTorch's attribution, including the "Global" root, and with the optimizer
step's collectives filed as "forward" of whichever module the tracker last named;
"phase_totals" is measured independently from get_comm_counts() snapshots taken around
model(inp), loss.backward() and optimizer.step(), summed over all iterations.

Models and plans follow commtrace DESIGN.md section 4 and PyTorch's definitions
(ToyModel from pytorch/examples tensor_parallelism; MLPModule, MLPStacked, Transformer from
torch.testing._internal.distributed._tensor.common_dtensor; the Transformer is parallelized
with Transformer.parallelize, exactly as PyTorch's test_tp_examples.py does).
With --mesh DPxTP --data-parallel fsdp (decoder models) the plan applies on the "tp" sub-mesh
and FSDP2's fully_shard wraps every layers.<i> block and the root over "dp".
This is a measuring tool, not part of the C++ build. Needs torch (see README.md).
"""

import argparse
import contextlib
import fnmatch
import json
import sys
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.experimental import implicit_replication
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from torch.testing._internal.distributed._tensor.common_dtensor import (
    MLPModule,
    MLPStacked,
    ModelArgs,
    Transformer,
)
from torch.testing._internal.distributed.fake_pg import FakeStore


class ToyModel(nn.Module):
    """pytorch/examples distributed/tensor_parallelism ToyModel."""

    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)

    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))


def register_cpu_sdpa_strategy():
    """Gives DTensor a sharding rule for CPU flash attention, which torch 2.11 lacks.

    DTensor registers strategies only for the CUDA SDPA kernels (flash, efficient, cudnn);
    on CPU, F.scaled_dot_product_attention dispatches to
    aten._scaled_dot_product_flash_attention_for_cpu and sharding propagation fails
    (NotImplementedError), and the MATH backend fails too (its bmm flattens the sharded head
    dim). PyTorch runs its Transformer TP tests on GPU only. This registers the same three
    strategies as the CUDA flash rule (all Replicate; heads Shard(1); batch Shard(0)) for the
    CPU op and its backward, so the CPU run communicates exactly as the GPU run does: the rule
    causes no collective by itself when q/k/v arrive head-sharded.
    """
    from torch.distributed.tensor._op_schema import PlacementList
    from torch.distributed.tensor._ops.utils import (
        expand_to_full_mesh_op_strategy,
        register_op_strategy,
    )
    from torch.distributed.tensor import Replicate

    aten = torch.ops.aten
    fwd_op = aten._scaled_dot_product_flash_attention_for_cpu.default
    bwd_op = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    from torch.distributed.tensor import DTensor
    if fwd_op in DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs:
        return  # a later torch has its own rule

    def n_tensor_args(op_schema):
        from torch.distributed.tensor._op_schema import OpStrategy
        return sum(isinstance(a, OpStrategy) for a in op_schema.args_schema) + sum(
            isinstance(v, OpStrategy) for v in op_schema.kwargs_schema.values())

    # forward: outputs (out, logsumexp) then inputs (q, k, v[, attn_mask])
    @register_op_strategy(fwd_op)
    def _fwd(op_schema):
        mesh = op_schema.get_mesh_from_args()
        extra = n_tensor_args(op_schema) - 3  # attn_mask: replicate
        lists: list[PlacementList] = [
            [Replicate()] * 5 + [Replicate()] * extra,
            [Shard(1)] * 5 + [Replicate()] * extra,
            [Shard(0)] * 5 + [Replicate()] * extra,
        ]
        return expand_to_full_mesh_op_strategy(mesh, op_schema, lists, input_index=2)

    # backward: outputs (gq, gk, gv) then inputs (gout, q, k, v, out, logsumexp[, attn_mask])
    @register_op_strategy(bwd_op)
    def _bwd(op_schema):
        mesh = op_schema.get_mesh_from_args(validate=False)
        extra = n_tensor_args(op_schema) - 6
        lists: list[PlacementList] = [
            [Replicate()] * 9 + [Replicate()] * extra,
            [Shard(1)] * 9 + [Replicate()] * extra,
            [Shard(0)] * 9 + [Replicate()] * extra,
        ]
        return expand_to_full_mesh_op_strategy(mesh, op_schema, lists, input_index=3)


def build(model_name, plan, mesh, input_requires_grad, checkpoint_activations=False):
    """Returns (parallelized model, local input) for one rank."""
    sp = plan == "sp"
    torch.manual_seed(0)
    if model_name in ("toy", "mlp"):
        if model_name == "toy":
            model, first, second, shape = ToyModel(), "in_proj", "out_proj", (20, 10)
        else:
            model, first, second, shape = MLPModule("cpu"), "net1", "net2", (8, 10)
        if sp:
            tp_plan = {
                first: ColwiseParallel(input_layouts=Shard(0)),
                second: RowwiseParallel(output_layouts=Shard(0)),
            }
        else:
            tp_plan = {first: ColwiseParallel(), second: RowwiseParallel()}
        model = parallelize_module(model, mesh, tp_plan)
        inp = torch.rand(*shape, requires_grad=input_requires_grad)
    elif model_name == "mlp-stacked":
        if sp:
            raise SystemExit("mlp-stacked: only --plan tp is defined")
        model = MLPStacked("cpu", n_layers=2)
        model = parallelize_module(
            model,
            mesh,
            {"layers.*.net1": ColwiseParallel(), "layers.*.net2": RowwiseParallel()},
        )
        inp = torch.rand(8, 10, requires_grad=input_requires_grad)
    elif model_name == "transformer":
        if input_requires_grad:
            raise SystemExit("transformer: tokens are integers; --input-requires-grad does not apply")
        register_cpu_sdpa_strategy()
        args = ModelArgs(dropout_p=0.0, checkpoint_activations=checkpoint_activations)
        model = Transformer(args)
        model = Transformer.parallelize(model, mesh, use_seq_parallel=sp)
        inp = torch.randint(args.vocab_size, (8, 8))
    else:
        raise SystemExit(f"unknown model {model_name}")
    return model, inp


def snapshot(comm_mode):
    return {str(op): n for op, n in comm_mode.get_comm_counts().items()}


def diff(after, before):
    out = {}
    for op, n in after.items():
        d = n - before.get(op, 0)
        if d:
            out[op] = d
    return out


def add_into(acc, d):
    for op, n in d.items():
        acc[op] += n


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True,
                   choices=["toy", "mlp", "mlp-stacked", "transformer", "decoder"])
    p.add_argument("--model-file", help="with --model decoder: a commtrace model file (base "
                   "decoder), run with cross-entropy as commtrace runs it")
    p.add_argument("--plan", required=True, choices=["tp", "sp", "torchtitan", "megatron"])
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--mesh", help="DPxTP: the plan on tp, --data-parallel on dp (decoder only)")
    p.add_argument("--data-parallel", choices=["fsdp"], help="with --mesh: FSDP2's fully_shard "
                   "on every layers.<i> block and on the root, over dp")
    p.add_argument("--no-reshard-after-forward", action="store_true")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--input-requires-grad", action="store_true")
    p.add_argument("--checkpoint-activations", action="store_true",
                   help="transformer: ModelArgs(checkpoint_activations=True), each block under "
                        "torch.utils.checkpoint (non-reentrant)")
    p.add_argument("--freeze", nargs="+", default=[], metavar="PATTERN",
                   help="parameters whose name matches a glob (fnmatch) get requires_grad=False "
                        "after parallelization (a commtrace model file's \"freeze\")")
    p.add_argument("--iters", type=int, default=1)
    p.add_argument("--no-optimizer", action="store_true",
                   help="skip the AdamW step (the MLP references were measured without one)")
    p.add_argument("--noise-level", type=int, default=1, help="generate_json_dump noise level")
    p.add_argument("--out-json", required=True)
    p.add_argument("--counts-json")
    a = p.parse_args(argv)
    if not 0 <= a.rank < a.world_size:
        raise SystemExit(f"--rank {a.rank} not in [0, {a.world_size})")

    dist.init_process_group(backend="fake", rank=a.rank, world_size=a.world_size,
                            store=FakeStore())
    try:
        if a.mesh:
            dp, tp = (int(x) for x in a.mesh.split("x"))
            if dp * tp != a.world_size or a.model != "decoder" or not a.data_parallel:
                raise SystemExit("--mesh DPxTP needs dp*tp == --world-size, --model decoder "
                                 "and --data-parallel")
            from torch.distributed.device_mesh import init_device_mesh
            mesh2 = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
            mesh = mesh2["tp"]
        else:
            mesh = DeviceMesh("cpu", list(range(a.world_size)))
        loss_fn, context = (lambda out: out.sum()), contextlib.nullcontext
        if a.model == "decoder":
            if not a.model_file:
                raise SystemExit("--model decoder needs --model-file")
            import torch_decoder
            model, inp, loss_fn, context = torch_decoder.build(a.model_file, a.plan, mesh)
            if a.data_parallel == "fsdp":
                from torch.distributed.fsdp import fully_shard
                raf = not a.no_reshard_after_forward
                for block in model.layers:
                    fully_shard(block, mesh=mesh2["dp"], reshard_after_forward=raf)
                fully_shard(model, mesh=mesh2["dp"], reshard_after_forward=raf)
        else:
            model, inp = build(a.model, a.plan, mesh, a.input_requires_grad,
                               a.checkpoint_activations)
        for pattern in a.freeze:
            hits = [n for n, _ in model.named_parameters() if fnmatch.fnmatchcase(n, pattern)]
            if not hits:
                raise SystemExit(f"--freeze {pattern}: matches no parameter")
        for n, param in model.named_parameters():
            if any(fnmatch.fnmatchcase(n, pattern) for pattern in a.freeze):
                param.requires_grad_(False)
        opt = None if a.no_optimizer else torch.optim.AdamW(
            [q for q in model.parameters() if q.requires_grad], lr=0.25, foreach=True)

        phase = {k: defaultdict(int) for k in ("forward", "backward", "optimizer")}
        total = defaultdict(int)
        per_module = {}  # fqn -> phase -> op -> count, summed over iterations
        for _ in range(a.iters):
            # One CommDebugMode per iteration: in torch 2.11 its module tracker cannot span
            # two forward passes (each forward pre-hook registers one more forward hook on
            # the module, so the 2nd forward pops the parent list twice: IndexError).
            comm_mode = CommDebugMode()
            with comm_mode:
                s0 = snapshot(comm_mode)
                with context():
                    out = model(inp)
                    loss = loss_fn(out)
                    s1 = snapshot(comm_mode)
                    loss.backward()
                s2 = snapshot(comm_mode)
                if opt is not None:
                    # as test_tp_examples.py does: the transformer mixes DTensor parameters
                    # with plain ones (TP LayerNorms), which foreach ops reject otherwise
                    with implicit_replication():
                        opt.step()
                    opt.zero_grad()
                s3 = snapshot(comm_mode)
            add_into(phase["forward"], diff(s1, s0))
            add_into(phase["backward"], diff(s2, s1))
            add_into(phase["optimizer"], diff(s3, s2))
            add_into(total, s3)
            # torch 2.11 has no get_comm_module_counts(); the dict is the attribute
            getter = getattr(comm_mode, "get_comm_module_counts", None)
            module_counts = getter() if getter else comm_mode.comm_module_counts
            for fqn, d in module_counts.items():
                acc = per_module.setdefault(fqn, {"forward": {}, "backward": {}})
                for ph in ("forward", "backward"):
                    for op, n in d.get(ph, {}).items():
                        acc[ph][str(op)] = acc[ph].get(str(op), 0) + n

        # the last iteration's tree (PyTorch's own format)
        comm_mode.generate_json_dump(file_name=a.out_json, noise_level=a.noise_level)

        if a.counts_json:
            result = {
                "torch_version": torch.__version__,
                "model": a.model,
                "plan": a.plan,
                "world_size": a.world_size,
                "rank": a.rank,
                "iters": a.iters,
                "input_requires_grad": a.input_requires_grad,
                "optimizer": None if opt is None else "AdamW(lr=0.25, foreach=True)",
                "output_local_shape": list(out.to_local().shape if hasattr(out, "to_local")
                                           else out.shape),
                # sorted: PyTorch's insertion order depends on set iteration (hash seed)
                "per_module": {fqn: {ph: dict(sorted(v[ph].items())) for ph in v}
                               for fqn, v in sorted(per_module.items())},
                "total": dict(total),
                "phase_totals": {k: dict(v) for k, v in phase.items()},
            }
            with open(a.counts_json, "w") as f:
                json.dump(result, f, indent=2)
                f.write("\n")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
