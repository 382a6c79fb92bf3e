// Sequence-parallel families over a context-parallel group "cp" (DESIGN §2's styles do not
// cover them): every rank holds a contiguous sub-sequence of every batch row, T/W tokens, and
// the whole (replicated) model; only core attention talks to the other ranks. Each rank's loss
// is the mean over its own sub-sequence; after backward every parameter gradient is reduced
// over cp in one flat all_reduce (avg, as ColossalAI's SequenceParallelGradientHandler and
// DeepSpeed's data-parallel reduction do; or sum), so with the exact families the result is the
// single-device gradient of the mean over the whole sequence.
//
//  - ulysses (DeepSpeed-Ulysses): q, k, v go from sequence- to head-sharded with an all_to_all
//    each, attention runs on whole sequences of H/W heads, one all_to_all brings the output
//    back; backward mirrors them. Needs W | heads.
//  - ring (ring attention, context parallel): q stays local; the k and v blocks travel the
//    ring with batched send/recv, one blockwise attention per step merged by log-sum-exp (with
//    the causal offsets: blocks of later ranks are skipped); backward sends them around again
//    with their dk, dv, which return to their owner after one more step.
//  - rsa (ColossalAI's ring self-attention, RingQK and RingAV of
//    colossalai/legacy/nn/layer/parallel_sequence): the scores q kᵀ (T/W, T) and the product
//    with v are built by passing sub-k and sub-v around the ring (W-1 send/recv steps each,
//    again in backward); the gradient of the full k (v) is reduced over cp and sliced to the
//    local chunk, and q's, k's and v's gradients are divided by W when divide_by_world_size, as
//    published.
#pragma once

#include <memory>
#include <string>

#include "parallel/comm/mesh.h"
#include "parallel/nn/models.h"
#include "parallel/nn/nn.h"

namespace commtrace {

struct ContextParallel {
  std::string family = "ulysses";  // "ulysses", "ring" or "rsa"
  // rsa: divide the gradients of q, k and v by the cp size (ColossalAI's published code).
  bool divide_by_world_size = true;
  // rsa: how the gradient of the full k (v) reaches its owner: "all_reduce" and a slice (as
  // published) or "reduce_scatter".
  std::string grad_reduction = "all_reduce";
  // How parameter gradients are reduced over cp after backward: "avg" or "sum".
  std::string param_grad_reduction = "avg";
  // A deliberate fault, for the tests that show verify catches it (never set by plan files):
  // "no_backward_all_to_all" (ulysses: the output's backward all_to_all is replaced by keeping
  // the rank's own block of the gradient), "skip_ring_step" (rsa: RingQK's last forward ring
  // step is not taken and its block of scores is zero; ring: the forward's last step is not
  // taken, so the last block is the previous one again).
  std::string fault;

  // Checks the fields (InvalidArgument naming the field and the choices).
  void check() const;
  // "rsa (divide_by_world_size, all_reduce + slice; parameter gradients avg over cp)".
  std::string str() const;
};

// The family's core attention over the 1-D mesh `cp` for a rank whose sub-sequence starts at
// global position `q_offset` (attention heads are not checked here: ulysses needs the cp size to
// divide them). Used by apply_context_parallel and by the oracle that runs the cores alone.
std::shared_ptr<const AttentionCore> make_context_core(const std::shared_ptr<const DeviceMesh>& cp,
                                                       const ContextParallel& opts,
                                                       std::int64_t q_offset);

// Installs the family's core into every Attention module of `model` (a transformer; else
// InvalidArgument) over the 1-D mesh `cp`, and sets the model's position offset for this rank's
// chunk of a sequence of `seq_len` tokens. With TP on another dim (`tp_size` > 1) a core runs on
// this rank's heads (attention's q, k, v are DTensors sharded on heads over tp). REQUIRES: cp
// divides seq_len (and, for ulysses, every attention's heads per tp rank); else
// InvalidArgument naming the numbers.
void apply_context_parallel(Module& model, const std::shared_ptr<const DeviceMesh>& cp,
                            const ContextParallel& opts, std::int64_t seq_len, int tp_size = 1);

}  // namespace commtrace
