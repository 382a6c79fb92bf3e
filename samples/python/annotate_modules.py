"""Module names for torch.profiler traces, read by `commtrace import kineto`.

annotate_modules(model) runs every module's forward inside a record_function range named
"module: <FQN> (<Type>)", with FQNs as commtrace and CommDebugMode name modules: the root is the
model's class name, children are `parent.attr` ("ToyModel.in_proj"). commtrace then files each
forward collective under the innermost module around it, and each backward collective under the
module whose forward created its autograd node.

Call it after parallelize_module (and fully_shard): the range opens before the parallel styles'
input hooks (prepend=True) and closes after their output hooks, so a style's redistributions
belong to its module, as in CommDebugMode. Returns the hook handles (call .remove() on each to
undo). Outside a profiler the ranges cost a few microseconds per module call.

    from annotate_modules import annotate_modules
    annotate_modules(model)
    with torch.profiler.profile(record_shapes=True, schedule=...) as prof: ...
"""
import torch


def annotate_modules(model: torch.nn.Module):
    root = type(model).__name__
    open_ranges = {}  # id(module) -> stack of open ranges (a module may be re-entered)
    handles = []
    for name, module in model.named_modules():
        label = f"module: {root}.{name} ({type(module).__name__})" if name else \
            f"module: {root} ({type(module).__name__})"

        def pre_hook(mod, args, label=label):
            rf = torch.autograd.profiler.record_function(label)
            rf.__enter__()
            open_ranges.setdefault(id(mod), []).append(rf)

        def post_hook(mod, args, output):
            stack = open_ranges.get(id(mod))
            if stack:
                stack.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(pre_hook, prepend=True))
        handles.append(module.register_forward_hook(post_hook, always_call=True))
    return handles
