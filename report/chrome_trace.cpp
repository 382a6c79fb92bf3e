#include "report/chrome_trace.h"

#include <algorithm>
#include <optional>
#include <string>

#include <fmt/ranges.h>

#include "report/counts.h"
#include "report/names.h"
#include "tracer/collectives.h"

namespace commtrace {

namespace {

// One open slice of the nesting: an iteration, a phase or a module.
struct Frame {
  int kind;  // 0 iteration, 1 phase, 2 module
  std::int64_t key;
  double ts;
};

class RankWriter {
 public:
  RankWriter(const Trace& t, const TraceCost& cost, bool measured, JsonWriter& w)
      : t_(t), cost_(cost), measured_(measured), w_(w) {}

  void write() {
    meta("process_name", fmt::format("rank {}", t_.rank));
    meta("thread_name", "commtrace");
    for (const Block& b : t_.block_list()) {
      // A folded block's repeats are laid after its first occurrence, each its span later.
      double first = 0, span = 0;
      if (b.count > 0) {
        first = t_.records[b.first].start_s;
        for (std::uint32_t i = b.first; i < b.first + b.count; ++i) {
          span = std::max(span, t_.records[i].start_s + t_.records[i].duration_s - first);
        }
      }
      for (std::uint64_t k = 0; k < b.repeat; ++k) {
        for (std::uint32_t i = b.first; i < b.first + b.count; ++i) {
          emit(t_.records[i], b.iteration + std::uint32_t(k), double(k) * span);
        }
      }
    }
    close_to(0);
  }

 private:
  void meta(const char* what, const std::string& name) {
    w_.begin_object();
    w_.key("ph").value("M").key("name").value(what).key("pid").value(t_.rank);
    w_.key("tid").value(0).key("args").begin_object().key("name").value(name).end_object();
    w_.end_object();
  }

  void slice(const std::string& name, const char* cat, double ts, double dur) {
    w_.begin_object();
    w_.key("ph").value("X").key("name").value(name).key("cat").value(cat);
    w_.key("pid").value(t_.rank).key("tid").value(0);
    w_.key("ts").value(ts * 1e6).key("dur").value(dur * 1e6);
  }

  // Closes the open frames above `depth` (their end: the last op's end).
  void close_to(std::size_t depth) {
    while (open_.size() > depth) {
      const Frame f = open_.back();
      open_.pop_back();
      std::string name;
      const char* cat = "";
      if (f.kind == 0) {
        name = fmt::format("iteration {}", f.key), cat = "iteration";
      } else if (f.kind == 1) {
        name = phase_name(Phase(f.key)), cat = "phase";
      } else {
        name = t_.modules[std::size_t(f.key)].fqn, cat = "module";
      }
      slice(name, cat, f.ts, end_ - f.ts);
      w_.end_object();
    }
  }

  void emit(const Record& r, std::uint32_t iteration, double shift) {
    if (r.kind != EventKind::Collective && r.kind != EventKind::Gemm) return;
    const bool coll = r.kind == EventKind::Collective;
    std::optional<CostEstimate> est;
    if (coll) est = cost_.of(r);
    double ts, dur;
    if (measured_) {
      ts = std::max(r.start_s + shift, end_);  // one thread: slices never overlap
      dur = r.duration_s;
    } else {
      ts = end_;
      dur = coll ? est->seconds : estimate_gemm(t_, r, cost_.topology());
    }
    // The frames this record runs in: iteration, phase, the module chain below Global.
    std::vector<Frame> want{{0, iteration, ts}, {1, std::int64_t(r.phase), ts}};
    std::vector<int> chain;
    for (int m = int(r.module), steps = 0;
         m > 0 && m < int(t_.modules.size()) && steps <= kMaxModuleDepth;
         m = t_.modules[std::size_t(m)].parent, ++steps) {
      chain.push_back(m);
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) want.push_back({2, *it, ts});
    std::size_t same = 0;
    while (same < open_.size() && same < want.size() && open_[same].kind == want[same].kind &&
           open_[same].key == want[same].key) {
      ++same;
    }
    close_to(same);
    for (std::size_t i = same; i < want.size(); ++i) open_.push_back(want[i]);

    slice(std::string(t_.name(r)), coll ? "collective" : "gemm", ts, dur);
    w_.key("args").begin_object();
    std::vector<std::string> ins;
    for (const TensorArg& a : t_.inputs(r)) ins.push_back(tensor_arg_str(t_, a, r.sharded));
    if (!ins.empty()) w_.key("inputs").value(fmt::format("{}", fmt::join(ins, ", ")));
    w_.key("dtype").value(dtype_name(r.dtype));
    if (coll) {
      const CollectiveInfo& c = r.collective;
      w_.key("group").value(fmt::format("{}({})", t_.str(c.group), c.group_size));
      w_.key("bytes").value(c.bytes).key("size").value(format_bytes(c.bytes));
      w_.key("seq").value(c.seq);
      if (c.peer >= 0) w_.key("peer").value(c.peer);
      if (c.reduce_op != ReduceOp::None) w_.key("reduce_op").value(reduce_op_name(c.reduce_op));
      w_.key("reason").value(reason_str(t_, r));
      w_.key("estimate_us").value(est->seconds * 1e6);
      if (*est->algorithm) w_.key("algorithm").value(est->algorithm);
    } else if (r.reason != 0) {
      w_.key("reason").value(t_.str(r.reason));
    }
    w_.key("time").value(measured_ ? "measured" : "estimated");
    w_.end_object();
    w_.end_object();
    end_ = ts + dur;
  }

  const Trace& t_;
  const TraceCost& cost_;
  bool measured_;
  JsonWriter& w_;
  std::vector<Frame> open_;
  double end_ = 0;
};

}  // namespace

void write_chrome_trace(const std::vector<Trace>& traces, const Topology& topo,
                        const JsonWriter::Sink& sink) {
  COMMTRACE_CHECK(!traces.empty(), ErrorCode::InvalidArgument, "chrome trace: no trace");
  const Trace& first = traces.front();
  const bool measured = has_times(first);
  JsonWriter w(sink, false);
  w.begin_object();
  w.key("traceEvents").begin_array();
  for (const Trace& t : traces) {
    const TraceCost cost(t, topo);
    RankWriter(t, cost, measured, w).write();
  }
  w.end_array();
  w.key("displayTimeUnit").value("ms");
  w.key("otherData").begin_object();
  w.key("producer").value("commtrace");
  for (const char* k : {"model", "plan", "world_size", "mesh", "backend", "device"}) {
    const std::string v = metadata_of(first, k);
    if (!v.empty()) w.key(k).value(v);
  }
  w.key("times").value(measured ? "measured"
                                : fmt::format("estimated by the cost model on {} ({}): no time "
                                              "was measured, the slices are laid end to end",
                                              topo.name, topo.description));
  w.end_object();
  w.end_object();
  w.flush();
}

}  // namespace commtrace
