"""The decoder of commtrace's model files (base "decoder", parallel/nn/decoder.h) written with
torch modules, and its plans (tp, sp, torchtitan) with PyTorch's own parallel styles, so that
torch_oracle.py can measure what CommDebugMode reports for them. Names and call order follow
the C++ model: tok_embeddings, [pos_embeddings], layers.i.{attention_norm, attention.{wq, wk,
wv | wqkv, wo}, ffn_norm, feed_forward.{w1, w2[, w3]}}, norm, output. The values are torch's own
(seed 0): only the communication is compared."""
import contextlib
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def load_args(path):
    """The "args" of a commtrace model file with the C++ defaults (DecoderArgs)."""
    with open(path) as f:
        j = json.load(f)
    if j.get("base") != "decoder":
        raise SystemExit(f"{path}: base is {j.get('base')!r}, not 'decoder'")
    a = {"n_layers": 2, "vocab_size": 32, "dim": 32, "n_heads": 4, "max_seq_len": 16,
         "norm": "rmsnorm", "norm_eps": 1e-5, "mlp": "swiglu", "position": "rope",
         "rope_theta": 10000.0, "qkv": "separate", "bias": False, "tie_embeddings": False,
         "causal": True, "batch": 4, "seq_len": 8}
    a.update(j.get("args", {}))
    a.setdefault("n_kv_heads", a["n_heads"])
    a.setdefault("hidden_dim", 4 * a["dim"])
    return a


def rope_tables(t, head_dim, theta):
    half = head_dim // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / head_dim)
    angle = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    angle = torch.cat([angle, angle], dim=-1)[:, None, :]  # (T, 1, D)
    return angle.cos().float(), angle.sin().float()


def apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.head_dim = a["dim"] // a["n_heads"]
        self.n_rep = a["n_heads"] // a["n_kv_heads"]
        self.rope = a["position"] == "rope"
        self.theta = a["rope_theta"]
        self.causal = a["causal"]
        q_out, kv_out = a["n_heads"] * self.head_dim, a["n_kv_heads"] * self.head_dim
        if a["qkv"] == "fused":
            self.wqkv = nn.Linear(a["dim"], q_out + 2 * kv_out, bias=a["bias"])
        else:
            self.wq = nn.Linear(a["dim"], q_out, bias=a["bias"])
            self.wk = nn.Linear(a["dim"], kv_out, bias=a["bias"])
            self.wv = nn.Linear(a["dim"], kv_out, bias=a["bias"])
        self.wo = nn.Linear(q_out, a["dim"], bias=a["bias"])

    def forward(self, x):
        b, t, _ = x.shape
        d, r = self.head_dim, self.n_rep
        if hasattr(self, "wqkv"):
            qkv = self.wqkv(x).view(b, t, -1, r + 2, d)
            g = qkv.shape[2]
            q = qkv[:, :, :, :r].reshape(b, t, g * r, d)
            k = qkv[:, :, :, r:r + 1].reshape(b, t, g, d)
            v = qkv[:, :, :, r + 1:].reshape(b, t, g, d)
        else:
            q = self.wq(x).view(b, t, -1, d)
            k = self.wk(x).view(b, t, -1, d)
            v = self.wv(x).view(b, t, -1, d)
        if self.rope:
            cos, sin = rope_tables(t, d, self.theta)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if r > 1:
            k = k[:, :, :, None, :].expand(b, t, k.shape[2], r, d).reshape(b, t, -1, d)
            v = v[:, :, :, None, :].expand(b, t, v.shape[2], r, d).reshape(b, t, -1, d)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=self.causal)
        return self.wo(o.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, a):
        super().__init__()
        if a.get("gate_up") == "fused":
            self.w13 = nn.Linear(a["dim"], 2 * a["hidden_dim"], bias=a["bias"])
        else:
            self.w1 = nn.Linear(a["dim"], a["hidden_dim"], bias=a["bias"])
        self.w2 = nn.Linear(a["hidden_dim"], a["dim"], bias=a["bias"])
        if a["mlp"] == "swiglu" and a.get("gate_up") != "fused":
            self.w3 = nn.Linear(a["dim"], a["hidden_dim"], bias=a["bias"])

    def forward(self, x):
        if hasattr(self, "w13"):  # gate and up interleaved per hidden unit
            pairs = self.w13(x).unflatten(-1, (-1, 2))
            return self.w2(F.silu(pairs[..., 0]) * pairs[..., 1])
        if not hasattr(self, "w3"):
            return self.w2(F.gelu(self.w1(x)))
        gate = F.silu(self.w1(x))
        return self.w2(gate * self.w3(x))


def norm_of(a):
    if a["norm"] == "rmsnorm":
        return nn.RMSNorm(a["dim"], eps=a["norm_eps"])
    return nn.LayerNorm(a["dim"], eps=a["norm_eps"])


class TransformerBlock(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.attention_norm = norm_of(a)
        self.attention = Attention(a)
        self.ffn_norm = norm_of(a)
        self.feed_forward = FeedForward(a)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok_embeddings = nn.Embedding(a["vocab_size"], a["dim"])
        if a["position"] != "rope":
            self.pos_embeddings = nn.Embedding(a["max_seq_len"], a["dim"])
        self.layers = nn.ModuleList(TransformerBlock(a) for _ in range(a["n_layers"]))
        self.norm = norm_of(a)
        self.output = nn.Linear(a["dim"], a["vocab_size"], bias=a["bias"])
        if a["tie_embeddings"]:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        if hasattr(self, "pos_embeddings"):
            h = h + self.pos_embeddings(torch.arange(tokens.shape[1]))
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def parallelize(model, mesh, plan):
    """commtrace's built-in decoder plans (parallel/plans/plan.cpp), with torch's styles.
    "megatron" is tp with the logits left vocab-sharded and loss parallel (Megatron's
    vocab-parallel cross-entropy); megatron-sp's coalesced gradient all_reduce has no PyTorch
    counterpart and is not built here."""
    if plan == "megatron-sp":
        raise SystemExit("megatron-sp: no PyTorch counterpart (coalesced gradient all_reduce)")
    sp = plan not in ("tp", "megatron")
    R, S1 = Replicate(), Shard(1)
    top = {"tok_embeddings": RowwiseParallel(input_layouts=R, output_layouts=S1 if sp else R)}
    if hasattr(model, "pos_embeddings"):
        top["pos_embeddings"] = RowwiseParallel(input_layouts=R,
                                                output_layouts=Shard(0) if sp else R)
    if plan in ("torchtitan", "megatron"):
        top["output"] = ColwiseParallel(input_layouts=S1 if sp else R, output_layouts=Shard(-1),
                                        use_local_output=False)
    else:
        top["output"] = ColwiseParallel(input_layouts=S1 if sp else R, output_layouts=R)
    if sp:
        top["norm"] = SequenceParallel()
    parallelize_module(model, mesh, top)
    for block in model.layers:
        p = {}
        if sp:
            p["attention_norm"] = SequenceParallel()
            p["attention"] = PrepareModuleInput(input_layouts=(S1,), desired_input_layouts=(R,))
            p["ffn_norm"] = SequenceParallel()
            p["feed_forward"] = PrepareModuleInput(input_layouts=(S1,),
                                                   desired_input_layouts=(R,))
        for w in ("wq", "wk", "wv", "wqkv"):
            if hasattr(block.attention, w):
                p[f"attention.{w}"] = ColwiseParallel()
        p["attention.wo"] = RowwiseParallel(output_layouts=S1 if sp else R)
        for w in ("w1", "w3", "w13"):
            if hasattr(block.feed_forward, w):
                p[f"feed_forward.{w}"] = ColwiseParallel()
        p["feed_forward.w2"] = RowwiseParallel(output_layouts=S1 if sp else R)
        parallelize_module(block, mesh, p)
    return model


def build(path, plan, mesh):
    """(parallelized model, tokens, loss_fn, context) for one rank of a decoder model file: the
    loss is cross-entropy; run it and its backward inside context() (loss_parallel for the
    torchtitan plan, whose backward needs it too)."""
    a = load_args(path)
    torch.manual_seed(0)
    model = parallelize(Transformer(a), mesh, plan)
    tokens = torch.randint(a["vocab_size"], (a["batch"], a["seq_len"]))
    targets = torch.randint(a["vocab_size"], (a["batch"], a["seq_len"]))

    def loss_fn(out):
        return F.cross_entropy(out.flatten(0, 1), targets.flatten(0, 1))

    def context():
        if plan in ("torchtitan", "megatron"):
            from torch.distributed.tensor.parallel import loss_parallel
            return loss_parallel()
        return contextlib.nullcontext()

    return model, tokens, loss_fn, context
