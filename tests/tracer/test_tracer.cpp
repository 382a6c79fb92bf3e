// The tracer core on its own: the module tree, phases, scopes and activation, interning,
// iteration folding and the clock.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/catch_compat.h"
#include "tests/test_util.h"
#include "tracer/tracer.h"

using namespace commtrace;

namespace {
void op(Tracer& tr, const char* name, std::uint64_t start = 0) {
  EventView e;
  e.name = name;
  tr.record(e, start);
}

// A collective record with one input of `shape` at sequence number seq.
void coll(Tracer& tr, Collective c, std::uint64_t seq, std::span<const std::int64_t> shape) {
  const ArgView in{shape, {}, {}};
  EventView e;
  e.kind = EventKind::Collective;
  e.name = collective_name(c);
  e.inputs = {&in, 1};
  CollectiveView v;
  v.op = c;
  v.seq = seq;
  v.group = "tp";
  v.group_size = 2;
  v.bytes = 16;
  tr.finish(tr.begin(e, &v));
}
}  // namespace

TEST_CASE("module scopes build the FQN tree under Global", "[tracer]") {
  Tracer tr(3);
  {
    TracerActivation on(tr);
    ModuleScope root("M", "MLPModule");
    {
      ModuleScope a("M.net1", "Linear");
      op(tr, "addmm");
    }
    {
      ModuleScope b("M.net2", "Linear");
      op(tr, "addmm");
    }
    {
      ModuleScope a_again("M.net1", "Linear");  // reuse: the same node, not a new one
      op(tr, "mm");
    }
  }
  const Trace t = tr.take();
  REQUIRE(t.rank == 3);
  REQUIRE(t.modules.size() == 4);
  REQUIRE(t.modules[0].fqn == "Global");
  REQUIRE(t.modules[1].fqn == "M");
  REQUIRE(t.modules[1].depth == 1);
  REQUIRE(t.modules[1].children == std::vector<int>{2, 3});
  REQUIRE(t.modules[2].type == "Linear");
  REQUIRE(t.records.size() == 3);
  REQUIRE(t.records[0].module == 2);
  REQUIRE(t.records[1].module == 3);
  REQUIRE(t.records[2].module == 2);
  REQUIRE(t.name(t.records[2]) == "mm");
  REQUIRE(t.records[0].name == t.records[1].name);  // interned once
  REQUIRE(t.is_within(2, 1));
  REQUIRE(t.is_within(2, 0));
  REQUIRE_FALSE(t.is_within(2, 3));
  REQUIRE(t.find_module("M.net2") == 3);
  REQUIRE(t.find_module("M.nope") == -1);
}

TEST_CASE("a module's slot finds its node again, under its own parent only", "[tracer]") {
  Tracer tr;
  TracerActivation on(tr);
  const TraceSlot shared;  // one module object entered from two parents
  int first = -1, again = -1, elsewhere = -1;
  {
    ModuleScope a("A", "Block");
    ModuleScope m("A.m", "Linear", &shared);
    first = m.module();
  }
  {
    ModuleScope a("A", "Block");
    ModuleScope m("A.m", "Linear", &shared);
    again = m.module();
  }
  {
    ModuleScope b("B", "Block");
    ModuleScope m("B.m", "Linear", &shared);
    elsewhere = m.module();
  }
  REQUIRE(first == again);
  REQUIRE(elsewhere != first);
  const Trace t = tr.take();
  REQUIRE(t.modules[std::size_t(first)].fqn == "A.m");
  REQUIRE(t.modules[std::size_t(elsewhere)].fqn == "B.m");
  REQUIRE(t.modules.size() == 5);
}

TEST_CASE("modules nest at most kMaxModuleDepth levels", "[tracer]") {
  Tracer tr(0);
  TracerActivation on(tr);
  std::vector<std::unique_ptr<ModuleScope>> scopes;
  std::string fqn = "m";
  for (int d = 1; d <= kMaxModuleDepth; ++d, fqn += ".m") {
    scopes.push_back(std::make_unique<ModuleScope>(fqn, "X"));
  }
  REQUIRE(std::string(testing::error_of([&] { ModuleScope too_deep(fqn, "X"); }).what()) ==
          fmt::format("tracer: module '{}' nests {} levels deep, more than {}", fqn,
                      kMaxModuleDepth + 1, kMaxModuleDepth));
  op(tr, "mm");  // the stack is intact: recorded in the deepest module that was entered
  scopes.clear();
  const Trace t = tr.take();
  REQUIRE(t.modules.size() == std::size_t(kMaxModuleDepth) + 1);
  REQUIRE(t.records.back().module == kMaxModuleDepth);
}

TEST_CASE("phases and attribution scopes stamp records", "[tracer]") {
  Tracer tr;
  TracerActivation on(tr);
  int net = -1;
  {
    ModuleScope m("M", "T");
    net = m.module();
  }
  {
    PhaseScope p(Phase::Optimizer);
    op(tr, "step");
  }
  REQUIRE(tr.phase() == Phase::Forward);
  {
    AttributionScope a(&tr, net, Phase::Backward);
    op(tr, "mm");
  }
  {
    Tracer other;
    AttributionScope foreign(&other, net, Phase::Backward);  // another tracer's module: Global
    op(tr, "add");
  }
  REQUIRE(tr.current_module() == 0);
  const Trace t = tr.take();
  const auto& r = t.records;
  REQUIRE(r[0].phase == Phase::Optimizer);
  REQUIRE(r[0].module == 0);
  REQUIRE(r[1].phase == Phase::Backward);
  REQUIRE(int(r[1].module) == net);
  REQUIRE(r[2].module == 0);
}

TEST_CASE("activation nests and restores, and no tracer means no recording", "[tracer]") {
  REQUIRE(Tracer::current() == nullptr);
  {
    ModuleScope idle("M", "T");  // harmless without a tracer
    REQUIRE(idle.module() == -1);
  }
  Tracer a, b;
  {
    TracerActivation on_a(a);
    {
      TracerActivation on_b(b);
      REQUIRE(Tracer::current() == &b);
    }
    REQUIRE(Tracer::current() == &a);
  }
  REQUIRE(Tracer::current() == nullptr);
}

TEST_CASE("take() moves the trace out and resets", "[tracer]") {
  Tracer tr(1);
  TracerActivation on(tr);
  {
    ModuleScope m("M", "T");
    op(tr, "mm");
  }
  Trace t = tr.take();
  REQUIRE(t.records.size() == 1);
  REQUIRE(t.rank == 1);
  REQUIRE(tr.record_count() == 0);
  REQUIRE(tr.module_count() == 1);
  REQUIRE(tr.take().rank == 1);
}

TEST_CASE("records intern shapes, placements, meshes and strings", "[tracer]") {
  Tracer tr;
  const Shape local{2, 8}, global{8, 8};
  const std::vector<Placement> pl{Placement::shard(0)};
  const MeshInfo mesh{{4}, {"tp"}, false, Device::CPU};
  const ArgView sharded{local, global, pl};
  const ArgView plain{global, {}, {}};
  for (int i = 0; i < 3; ++i) {
    EventView e;
    e.kind = EventKind::Gemm;
    e.name = "mm";
    e.sharded = true;
    e.mesh = &mesh;
    e.reason = "why";
    const ArgView ins[] = {sharded, plain};
    e.inputs = ins;
    tr.record(e, tr.now());
  }
  const Trace t = tr.take();
  REQUIRE(t.records.size() == 3);
  REQUIRE(t.pools.mesh_count() == 1);
  REQUIRE(mesh_str(t.pools.mesh(t.records[2].mesh)) == "DeviceMesh((4,), 'cpu', stride=(1,))");
  const auto in = t.inputs(t.records[1]);
  REQUIRE(in.size() == 2);
  REQUIRE(shape_str(t.shape(in[0].shape)) == "[2, 8]");
  REQUIRE(shape_str(t.shape(in[0].global_shape)) == "[8, 8]");
  REQUIRE(placements_str(t.placements(in[0].placements)) == "(Shard(dim=0),)");
  REQUIRE(in[1].shape == in[0].global_shape);  // one id per distinct shape
  REQUIRE(in[1].placements == 0);
  REQUIRE(t.str(t.records[0].reason) == "why");
  REQUIRE(t.records[0].duration_s >= 0.0);
  // Four distinct strings ("", mm, default, why) however many records.
  REQUIRE(t.pools.string_count() == 4);
}

TEST_CASE("identical iterations fold into one block with a repeat count", "[tracer]") {
  Tracer tr;
  TracerActivation on(tr);
  const Shape s{4};
  std::uint64_t seq = 0;
  for (int it = 0; it < 5; ++it) {
    if (it == 2) op(tr, "extra");  // iteration 2 differs
    op(tr, "relu");
    coll(tr, Collective::AllReduce, seq++, s);
    coll(tr, Collective::AllGather, seq++, s);
    tr.next_iteration();
  }
  const Trace t = tr.take();
  // Iterations 0-1 fold; 2 differs; 3-4 fold (seq strides 2).
  REQUIRE(t.blocks.size() == 3);
  REQUIRE(t.blocks[0].iteration == 0);
  REQUIRE(t.blocks[0].repeat == 2);
  REQUIRE(t.blocks[1].iteration == 2);
  REQUIRE(t.blocks[1].repeat == 1);
  REQUIRE(t.blocks[2].iteration == 3);
  REQUIRE(t.blocks[2].repeat == 2);
  REQUIRE(t.records.size() == 3 + 4 + 3);
  REQUIRE(t.event_count() == 3 * 2 + 4 + 3 * 2);
  REQUIRE(t.records[1].collective.seq_stride == 2);
  std::vector<std::uint64_t> seqs;
  t.for_each_event([&](const Record& r, std::uint64_t q) {
    if (r.kind == EventKind::Collective) seqs.push_back(q);
  });
  REQUIRE(seqs == std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
}

TEST_CASE("an iteration that diverges keeps its own records, times and sequence numbers",
          "[tracer]") {
  Tracer tr;
  TracerActivation on(tr);
  const Shape s{4};
  auto names = [](const Trace& t) {
    std::vector<std::string> out;
    t.for_each_event([&](const Record& r, std::uint64_t) { out.emplace_back(t.name(r)); });
    return out;
  };
  const std::vector<std::vector<const char*>> iterations = {
      {"relu", "all_reduce", "gelu"},           // 0
      {"relu", "all_reduce", "tanh"},           // 1: differs at its last event
      {"relu", "all_reduce", "tanh", "extra"},  // 2: one more
      {"relu"},                                 // 3: a prefix of the one before
      {"relu"},                                 // 4: folds into 3
  };
  std::uint64_t seq = 10;
  for (const auto& it : iterations) {
    for (const char* n : it) {
      if (std::string(n) == "all_reduce") {
        coll(tr, Collective::AllReduce, seq++, s);
      } else {
        op(tr, n, tr.now());
      }
    }
    tr.next_iteration();
  }
  const Trace t = tr.take();
  REQUIRE(t.blocks.size() == 4);
  REQUIRE(t.blocks[3].iteration == 3);
  REQUIRE(t.blocks[3].repeat == 2);
  std::vector<std::string> want;
  for (const auto& it : iterations) want.insert(want.end(), it.begin(), it.end());
  REQUIRE(names(t) == want);
  REQUIRE(t.records[4].collective.seq == 11);  // iteration 1's own number, not a copy
  REQUIRE(t.records[4].collective.seq_stride == 0);
  REQUIRE(t.records[3].start_s > t.records[0].start_s);
}

TEST_CASE("outputs added after begin() take part in folding", "[tracer]") {
  Tracer tr;
  TracerActivation on(tr);
  const Shape a{2, 3}, b{3, 2};
  auto sharded_op = [&](std::span<const std::int64_t> out_shape, bool finished) {
    const ArgView in{a, {}, {}};
    EventView e;
    e.name = "mm";
    e.inputs = {&in, 1};
    const std::uint32_t i = tr.begin(e);
    if (!finished) return;  // the op threw before its outputs were known
    const ArgView out{out_shape, {}, {}};
    tr.finish(i, {&out, 1});
  };
  sharded_op(a, true);
  tr.next_iteration();
  sharded_op(a, true);  // folds
  tr.next_iteration();
  sharded_op(b, true);  // other output shape: a block of its own
  tr.next_iteration();
  sharded_op(b, false);  // no outputs: differs from the one before
  const Trace t = tr.take();
  REQUIRE(t.blocks.size() == 3);
  REQUIRE(t.blocks[0].repeat == 2);
  REQUIRE(t.records.size() == 3);
  REQUIRE(t.shape(t.outputs(t.records[1])[0].shape)[0] == 3);
  REQUIRE(t.records[2].n_outputs == 0);
}

TEST_CASE("tensor slots stand in for their views, per tracer, and never hide a change",
          "[tracer]") {
  const Shape a{2, 3}, b{4, 3}, global{8, 3};
  const std::vector<Placement> row{Placement::shard(0)}, col{Placement::shard(1)};
  // Two plain inputs and their outputs, and two DTensors over x (what a slot's tensor shows
  // never changes: another placement is another DTensor).
  const TraceSlot x, y, out_x, out_y, by_row, by_col;
  // relu(in) -> out, then a sharded mm of DTensor `d` (local: x's shape) with placements p.
  auto step = [&](Tracer& tr, std::span<const std::int64_t> in_shape, const TraceSlot& in,
                  const TraceSlot& d, const std::vector<Placement>& p) {
    const ArgView ins[] = {ArgView::plain(in_shape, &in)};
    const ArgView outs[] = {ArgView::plain(in_shape, &in == &x ? &out_x : &out_y)};
    EventView e;
    e.name = "relu";
    e.inputs = ins;
    e.outputs = outs;
    tr.record(e, tr.now());
    const ArgView dts[] = {ArgView{a, global, p, &d, &x}};
    EventView m;
    m.name = "mm";
    m.sharded = true;
    m.inputs = dts;
    tr.record(m, tr.now());
    tr.next_iteration();
  };
  Tracer tr, other;
  step(tr, a, x, by_row, row);
  step(tr, b, y, by_row, row);     // y's shape differs: its own block; y's slot now names [4, 3]
  step(tr, b, y, by_row, row);     // folds by slot compares alone
  step(other, a, x, by_row, row);  // another tracer takes the slots over
  step(tr, a, x, by_row, row);     // slots of the other tracer are ignored: compared by value
  step(tr, a, x, by_col, col);     // same local shape (x's slot), other placements: seen
  step(tr, b, y, by_row, row);     // slots that hold other arguments of this tracer: seen
  const Trace t = tr.take();
  REQUIRE(t.blocks.size() == 5);
  REQUIRE(t.blocks[1].repeat == 2);
  REQUIRE(t.blocks[2].repeat == 1);
  auto first_input = [&](std::size_t block, int k) {
    return t.inputs(t.records[t.blocks[block].first + std::uint32_t(k)])[0];
  };
  REQUIRE(shape_str(t.shape(first_input(0, 0).shape)) == "[2, 3]");
  REQUIRE(shape_str(t.shape(first_input(1, 0).shape)) == "[4, 3]");
  REQUIRE(shape_str(t.shape(first_input(2, 0).shape)) == "[2, 3]");
  REQUIRE(placements_str(t.placements(first_input(2, 1).placements)) == "(Shard(dim=0),)");
  REQUIRE(placements_str(t.placements(first_input(3, 1).placements)) == "(Shard(dim=1),)");
  REQUIRE(shape_str(t.shape(first_input(3, 1).global_shape)) == "[8, 3]");
  REQUIRE(shape_str(t.shape(first_input(4, 0).shape)) == "[4, 3]");
  REQUIRE(placements_str(t.placements(first_input(4, 1).placements)) == "(Shard(dim=0),)");
  // After take() the slots name arguments of the old trace: the new one interns from the views.
  step(tr, b, y, by_row, row);
  const Trace u = tr.take();
  REQUIRE(u.records.size() == 2);
  REQUIRE(shape_str(u.shape(u.inputs(u.records[0])[0].shape)) == "[4, 3]");
  REQUIRE(shape_str(u.shape(u.inputs(u.records[1])[0].shape)) == "[2, 3]");
}

TEST_CASE("take() during a matching iteration keeps the events so far", "[tracer]") {
  Tracer tr;
  TracerActivation on(tr);
  op(tr, "relu");
  op(tr, "gelu");
  tr.next_iteration();
  op(tr, "relu");
  const Trace t = tr.take();
  REQUIRE(t.blocks.size() == 2);
  REQUIRE(t.records.size() == 3);
  REQUIRE(t.name(t.records[2]) == "relu");
  REQUIRE(t.blocks[1].count == 1);
}

TEST_CASE("iterations whose sequence numbers do not advance evenly are kept apart", "[tracer]") {
  Tracer tr;
  const Shape s{4};
  for (std::uint64_t seq : {0, 1, 5}) {  // strides 1, then 4
    coll(tr, Collective::AllReduce, seq, s);
    tr.next_iteration();
  }
  const Trace t = tr.take();
  REQUIRE(t.blocks.size() == 2);
  REQUIRE(t.blocks[0].repeat == 2);
  REQUIRE(t.blocks[1].repeat == 1);
}

TEST_CASE("a long run keeps the memory of one iteration", "[tracer]") {
  Tracer tr;
  const Shape s{16, 16};
  std::size_t after_two = 0;
  for (int it = 0; it < 1000; ++it) {
    for (int k = 0; k < 50; ++k) op(tr, "relu");
    coll(tr, Collective::AllReduce, std::uint64_t(it), s);
    tr.next_iteration();
    if (it == 1) after_two = tr.memory_bytes();
  }
  REQUIRE(tr.record_count() == 51);
  REQUIRE(tr.memory_bytes() == after_two);
}

TEST_CASE("the clock converts to seconds", "[tracer]") {
  Tracer tr;
  const std::uint64_t start = tr.now();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  op(tr, "sleep", start);
  const Trace t = tr.take();
  REQUIRE(t.records[0].duration_s > 0.015);
  REQUIRE(t.records[0].duration_s < 1.0);
  REQUIRE(t.records[0].start_s >= 0.0);
}

namespace {
// A device timer whose measurements are set by the test: token t measures seconds[t].
class ScriptedTimer final : public DeviceTimer {
 public:
  explicit ScriptedTimer(std::vector<double> seconds) : seconds_(std::move(seconds)) {}
  std::uint32_t start() override {
    ++outstanding;
    return next_++;
  }
  void stop(std::uint32_t) override { ++stopped; }
  double elapsed_s(std::uint32_t t) override {
    --outstanding;
    return seconds_.at(t);
  }
  int outstanding = 0, stopped = 0;

 private:
  std::vector<double> seconds_;
  std::uint32_t next_ = 0;
};

void timed_op(Tracer& tr, DeviceTimer& timer, const char* name) {
  DeviceTiming timing(&timer);
  EventView e;
  e.kind = EventKind::Gemm;
  e.name = name;
  timing.end(tr, tr.record(e, tr.now()));
}
}  // namespace

TEST_CASE("device-timed events take the device's durations", "[tracer]") {
  // Device seconds become ticks when an iteration closes and seconds again at take(), each with
  // the clock's calibration so far: a tracer that has run for 20 ms converts to ~1e-5, one that
  // has run for microseconds (nothing recorded yet) may be off by percents.
  auto calibrate = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  SECTION("one iteration: the device time replaces the host's") {
    Tracer tr;
    calibrate();
    ScriptedTimer timer({0.25, 0.5});
    timed_op(tr, timer, "mm");
    op(tr, "relu", tr.now());
    timed_op(tr, timer, "mm");
    REQUIRE(timer.outstanding == 2);  // held until the iteration closes
    const Trace t = tr.take();
    REQUIRE(timer.outstanding == 0);
    REQUIRE(timer.stopped == 2);
    REQUIRE(t.records[0].duration_s == Approx(0.25).epsilon(0.01));
    REQUIRE(t.records[1].duration_s < 0.1);  // host-timed
    REQUIRE(t.records[2].duration_s == Approx(0.5).epsilon(0.01));
  }
  SECTION("folded iterations average the device times, matched or not") {
    Tracer tr;
    calibrate();
    ScriptedTimer timer({0.1, 0.2, 0.6});
    for (int it = 0; it < 3; ++it) {
      timed_op(tr, timer, "mm");
      tr.next_iteration();
    }
    REQUIRE(timer.outstanding == 0);  // each iteration resolves its own
    const Trace t = tr.take();
    REQUIRE(t.records.size() == 1);
    REQUIRE(t.blocks[0].repeat == 3);
    REQUIRE(t.records[0].duration_s == Approx(0.3).epsilon(0.01));
  }
  SECTION("an iteration that diverges after a device-timed match keeps its time") {
    Tracer tr;
    calibrate();
    ScriptedTimer timer({0.1, 0.4});
    timed_op(tr, timer, "mm");
    tr.next_iteration();
    timed_op(tr, timer, "mm");  // matches the record of iteration 0: pending
    op(tr, "extra");            // diverges: the pending event becomes a record
    const Trace t = tr.take();
    REQUIRE(t.records.size() == 3);
    REQUIRE(t.records[1].duration_s == Approx(0.4).epsilon(0.01));
  }
  SECTION("work that throws before end() returns its token") {
    ScriptedTimer timer({0.1});
    try {
      DeviceTiming timing(&timer);
      throw Error(ErrorCode::Backend, "kernel failed");
    } catch (const Error&) {
    }
    REQUIRE(timer.outstanding == 0);
    REQUIRE(timer.stopped == 1);
  }
  SECTION("no timer: nothing is timed on a device") {
    Tracer tr;
    DeviceTiming timing(nullptr);
    EventView e;
    timing.end(tr, tr.record(e, tr.now()));
    REQUIRE(tr.take().records.size() == 1);
  }
}

namespace {
// A device-timed GEMM as the op layer records it: a timer only while the tracer times.
void sampled_gemm(Tracer& tr, DeviceTimer& timer) {
  DeviceTiming timing(tr.timing() ? &timer : nullptr);
  EventView e;
  e.kind = EventKind::Gemm;
  e.name = "mm";
  timing.end(tr, tr.record(e, tr.start_time()));
}
}  // namespace

TEST_CASE("a long run times a sample of its repeats", "[tracer]") {
  Tracer tr(0, TimingPolicy{2, 4});  // occurrences 0 and 1, then every 4th
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // calibrates the tick clock
  ScriptedTimer timer({0.1, 0.2, 0.6, 0.3});                   // occurrences 0, 1, 4, 8
  std::vector<bool> timed;
  for (int it = 0; it < 10; ++it) {
    timed.push_back(tr.timing());
    REQUIRE((tr.start_time() == kNoTime) == !tr.timing());
    sampled_gemm(tr, timer);
    tr.next_iteration();
  }
  REQUIRE(timed ==
          std::vector<bool>{true, true, false, false, true, false, false, false, true, false});
  REQUIRE(timer.outstanding == 0);
  const Trace t = tr.take();
  REQUIRE(t.records.size() == 1);
  REQUIRE(t.blocks[0].repeat == 10);
  REQUIRE(t.blocks[0].untimed == 6);
  REQUIRE(t.records[0].duration_s == Approx(0.3).epsilon(0.01));  // the timed four's mean
  REQUIRE_FALSE(t.records[0].estimated);
}

TEST_CASE("an untimed repeat that diverges keeps estimated times", "[tracer]") {
  Tracer tr(0, TimingPolicy{1, 0});  // only a block's first occurrence is timed
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ScriptedTimer timer({0.4});
  sampled_gemm(tr, timer);
  op(tr, "relu", tr.start_time());
  tr.next_iteration();
  REQUIRE_FALSE(tr.timing());
  sampled_gemm(tr, timer);          // matched, untimed
  op(tr, "gelu", tr.start_time());  // diverges: began untimed
  REQUIRE(tr.timing());             // the rest of the iteration is written, and timed
  op(tr, "tanh", tr.start_time());
  const Trace t = tr.take();
  REQUIRE(t.records.size() == 5);
  const Record& mm = t.records[2];
  REQUIRE(mm.estimated);  // the mean of the record it repeated, from its iteration's start
  REQUIRE(mm.duration_s == Approx(0.4).epsilon(0.01));
  REQUIRE(mm.start_s >= t.records[1].start_s);
  REQUIRE(t.records[3].estimated);  // nothing it repeated: no duration
  REQUIRE(t.records[3].duration_s == 0);
  REQUIRE_FALSE(t.records[4].estimated);
  REQUIRE(t.blocks[1].untimed == 0);
}

TEST_CASE("a keyed event implies the events recorded inside it", "[tracer]") {
  Tracer tr;
  const Shape s{4};
  int described = 0;
  // A keyed op with one input, and inside it a plain op and a collective.
  auto step = [&](std::uint64_t key, const char* inner, std::uint64_t seq) {
    EventHead h;
    h.name = "mm";
    h.sharded = true;
    h.key = key;
    const std::uint32_t i = tr.begin(h, [&](auto& sink) {
      ++described;
      sink.input(ArgView{s, {}, {}});
    });
    op(tr, inner, tr.start_time());
    coll(tr, Collective::AllReduce, seq, s);
    tr.finish(i, [&](auto& sink) {
      ++described;
      sink.output(ArgView{s, {}, {}});
    });
    tr.next_iteration();
  };
  step(7, "relu", 0);  // written: the key and its 2 inner events stored
  REQUIRE(described == 2);
  step(7, "relu", 1);  // matched by the key: nothing described
  REQUIRE(described == 2);
  step(8, "relu", 2);  // another key: compared argument by argument, and equal
  REQUIRE(described == 4);
  const Trace t = tr.take();
  REQUIRE(t.blocks.size() == 1);
  REQUIRE(t.blocks[0].repeat == 3);
  REQUIRE(t.records.size() == 3);
  REQUIRE(t.records[2].collective.seq_stride == 1);  // the inner collective's numbers checked

  // The key promises the events inside: a different count is a bug, reported, not folded.
  Tracer other;
  EventHead h;
  h.name = "mm";
  h.key = 9;
  for (int inner : {2, 1}) {
    const std::uint32_t i = other.begin(h, [](auto&) {});
    for (int k = 0; k < inner; ++k) op(other, "relu", other.start_time());
    if (inner == 1) {
      REQUIRE_THROWS_AS(other.finish(i), Error);
      break;
    }
    other.finish(i);
    other.next_iteration();
  }
}

TEST_CASE("an untimed repeat counts the events inside a keyed event without describing them",
          "[tracer]") {
  for (const std::uint64_t first : {1, 4}) {  // repeat 1 untimed, then timed
    Tracer tr(0, TimingPolicy{first, 0});
    EventHead h;
    h.name = "mm";
    h.key = 5;
    auto step = [&](int inner_implied) {
      const std::uint32_t i = tr.begin(h, [](auto&) {});
      for (int k = 0; k < 2; ++k) {
        if (k < inner_implied && tr.next_implied()) {
          tr.record_implied();
        } else {
          op(tr, "relu", tr.start_time());
        }
      }
      REQUIRE_FALSE(tr.next_implied());  // past the keyed event's insides
      tr.finish(i);
      tr.next_iteration();
    };
    step(0);
    REQUIRE_FALSE(tr.next_implied());  // outside any keyed event
    const std::uint32_t i = tr.begin(h, [](auto&) {});
    REQUIRE(tr.next_implied() == (first == 1));  // only where the repeat is untimed
    op(tr, "relu", tr.start_time());
    op(tr, "relu", tr.start_time());
    tr.finish(i);
    tr.next_iteration();
    step(2);
    const Trace t = tr.take();
    REQUIRE(t.records.size() == 3);
    REQUIRE(t.blocks.size() == 1);
    REQUIRE(t.blocks[0].repeat == 3);
    REQUIRE(t.blocks[0].untimed == (first == 1 ? 2 : 0));
  }
  // The count is still checked: one implied event missing is reported at finish().
  Tracer tr(0, TimingPolicy{1, 0});
  EventHead h;
  h.name = "mm";
  h.key = 6;
  std::uint32_t i = tr.begin(h, [](auto&) {});
  op(tr, "relu");
  op(tr, "relu");
  tr.finish(i);
  tr.next_iteration();
  i = tr.begin(h, [](auto&) {});
  REQUIRE(tr.next_implied());
  tr.record_implied();
  REQUIRE_THROWS_AS(tr.finish(i), Error);
}

TEST_CASE("a keyed region implies the events recorded inside it", "[tracer]") {
  Tracer tr;
  TracerActivation on(tr);
  const Shape s{4};
  int described = 0;
  auto relu = [&](const char* name = "relu") {
    EventHead h;
    h.name = name;
    tr.record(
        h,
        [&](auto& sink) {
          ++described;
          sink.input(ArgView{s, {}, {}});
        },
        tr.start_time());
  };
  std::uint64_t seq = 0;
  // An op, then a region of two ops and a collective, then an op.
  auto step = [&](std::uint64_t key, const char* first = "a", int inner = 2) {
    relu(first);
    KeyedRegion region(key);
    for (int k = 0; k < inner; ++k) relu();
    coll(tr, Collective::AllReduce, seq++, s);
    region.end();
    relu("b");
    tr.next_iteration();
  };
  auto described_by = [&](auto&& f) {
    const int before = described;
    f();
    return described - before;
  };
  REQUIRE(described_by([&] { step(7); }) == 4);       // written
  REQUIRE(described_by([&] { step(7); }) == 2);       // the region's ops implied
  REQUIRE(described_by([&] { step(8); }) == 4);       // another key: compared, and equal
  REQUIRE(described_by([&] { step(7, "c"); }) == 4);  // diverges before the region: written
  REQUIRE(described_by([&] { step(7, "c"); }) == 2);  // the region stored with the new block
  const Trace t = tr.take();
  REQUIRE(t.blocks.size() == 2);
  REQUIRE(t.blocks[0].repeat == 3);
  REQUIRE(t.blocks[1].repeat == 2);
  REQUIRE(t.records.size() == 10);
  REQUIRE(t.records[3].collective.seq_stride == 1);  // the implied collective's number checked
  REQUIRE(t.records[8].collective.seq == 3);         // diverged: its own number

  // The key promises the events inside: a different count is a bug, reported, not folded.
  Tracer other;
  TracerActivation on_other(other);
  const std::uint64_t key = new_trace_key();
  REQUIRE(new_trace_key() != key);
  for (int inner : {2, 1}) {
    KeyedRegion region(key);
    for (int k = 0; k < inner; ++k) op(other, "relu", other.start_time());
    if (inner == 1) {
      REQUIRE_THROWS_AS(region.end(), Error);
      break;
    }
    region.end();
    other.next_iteration();
  }
  // An iteration does not end inside a region; one left by an exception is dropped unchecked.
  Tracer third;
  TracerActivation on_third(third);
  {
    KeyedRegion region(key);
    REQUIRE_THROWS_AS(third.next_iteration(), Error);
  }
  third.next_iteration();
  const KeyedRegion none(0);  // key 0: no region
  third.next_iteration();

  // A matched region left by an exception implies nothing after the events that ran in it.
  Tracer fifth;
  TracerActivation on_fifth(fifth);
  for (int it = 0; it < 2; ++it) {
    {
      KeyedRegion region(key);
      op(fifth, "relu");
      if (it == 0) {  // the repeat leaves the region without end(), as an exception would
        op(fifth, "relu");
        region.end();
      }
    }
    op(fifth, "b");
    fifth.next_iteration();
  }
  std::vector<std::string> names;
  const Trace ft = fifth.take();
  ft.for_each_event([&](const Record& r, std::uint64_t) { names.emplace_back(ft.name(r)); });
  REQUIRE(names == std::vector<std::string>{"relu", "relu", "b", "relu", "b"});

  // In an untimed repeat an implied collective is only counted, its sequence number checked: one
  // that does not advance by the stride keeps its iteration apart, with its own number.
  Tracer fourth(0, TimingPolicy{1, 0});
  TracerActivation on_fourth(fourth);
  for (const std::uint64_t seq : {0, 1, 2, 7}) {
    KeyedRegion region(key);
    if (seq > 0) REQUIRE(fourth.next_implied());
    if (fourth.next_implied()) {
      fourth.finish(fourth.begin_implied(seq));
    } else {
      coll(fourth, Collective::AllReduce, seq, s);
    }
    region.end();
    fourth.next_iteration();
  }
  const Trace f = fourth.take();
  REQUIRE(f.blocks.size() == 2);
  REQUIRE(f.blocks[0].repeat == 3);
  REQUIRE(f.records[1].collective.seq == 7);
}

TEST_CASE("serialized enum names round-trip", "[tracer]") {
  for (Phase p : {Phase::Forward, Phase::Backward, Phase::Optimizer, Phase::Recompute}) {
    REQUIRE(parse_phase(phase_name(p)) == p);
  }
  for (EventKind k :
       {EventKind::Collective, EventKind::Gemm, EventKind::Compute, EventKind::Trivial}) {
    REQUIRE(parse_event_kind(event_kind_name(k)) == k);
  }
  for (ReduceOp r : {ReduceOp::None, ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    REQUIRE(parse_reduce_op(reduce_op_name(r)) == r);
  }
  for (int i = 0; i < kCollectiveCount; ++i) {
    const Collective c = Collective(i);
    REQUIRE(parse_collective(collective_name(c)) == c);
    REQUIRE(parse_collective(collective_spec(c).torch_name) == c);
  }
  REQUIRE(parse_collective("c10d.allreduce_") == Collective::AllReduce);
  REQUIRE(find_collective("allreduce") == nullptr);
  REQUIRE_THROWS_AS(parse_phase("sideways"), Error);
}

TEST_CASE("the collective table: bytes, buffers and busbw factors", "[tracer]") {
  REQUIRE(busbw_factor(Collective::AllReduce, 4) == 1.5);
  REQUIRE(busbw_factor(Collective::AllReduce, 1) == 0.0);
  REQUIRE(busbw_factor(Collective::AllGather, 4) == 0.75);
  REQUIRE(busbw_factor(Collective::ReduceScatter, 2) == 0.5);
  REQUIRE(busbw_factor(Collective::AllToAll, 8) == 0.875);
  REQUIRE(busbw_factor(Collective::Broadcast, 4) == 1.0);
  REQUIRE(busbw_factor(Collective::Send, 2) == 1.0);
  REQUIRE(busbw_factor(Collective::Recv, 2) == 1.0);
  REQUIRE(busbw_factor(Collective::Barrier, 4) == 0.0);
  REQUIRE_THROWS_AS(busbw_factor(Collective::AllReduce, 0), Error);
  REQUIRE(collective_spec(Collective::AllGather).bytes == ByteSource::Output);
  REQUIRE(collective_spec(Collective::ReduceScatter).bytes == ByteSource::Input);
  REQUIRE(collective_spec(Collective::Send).p2p);
  REQUIRE(collective_spec(Collective::Broadcast).rooted);
  REQUIRE(collective_spec(Collective::AllToAll).buffers == BufferRule::Exchange);
}

TEST_CASE("placements and meshes render as PyTorch and parse back", "[tracer]") {
  const std::vector<Placement> p{Placement::shard(0), Placement::replicate(),
                                 Placement::partial(ReduceOp::Avg)};
  REQUIRE(placements_str(p) == "(Shard(dim=0), Replicate(), Partial(avg))");
  REQUIRE(parse_placements(placements_str(p)) == p);
  REQUIRE(parse_placements("(Replicate(),)") == std::vector<Placement>{Placement::replicate()});
  REQUIRE(parse_placements("").empty());
  REQUIRE(parse_placement("S(0)") == Placement::shard(0));
  REQUIRE(parse_placement("Shard(dim=-1)") == Placement::shard(-1));
  REQUIRE_THROWS_AS(parse_placement("Shard(x)"), Error);
  const MeshInfo m2{{2, 4}, {"dp", "tp"}, true, Device::CPU};
  const std::string s2 = mesh_str(m2);
  REQUIRE(s2 == "DeviceMesh((2, 4), 'cpu', mesh_dim_names=('dp', 'tp'), stride=(4, 1))");
  REQUIRE(parse_mesh_str(s2) == m2);
  const MeshInfo m1{{4}, {"tp"}, false, Device::CPU};
  REQUIRE(parse_mesh_str(mesh_str(m1)) == m1);
  const MeshInfo m3{{2, 2, 2}, {"dp", "sp", "tp"}, true, Device::CUDA};
  REQUIRE(parse_mesh_str(mesh_str(m3)) == m3);
  REQUIRE(parse_mesh_str("DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('a', 'b'))") ==
          MeshInfo{{2, 2}, {"a", "b"}, true, Device::CPU});
  REQUIRE_THROWS_AS(parse_mesh_str("DeviceMesh((4,)"), Error);
  REQUIRE_THROWS_AS(parse_mesh_str("Mesh((4,), 'cpu')"), Error);
  REQUIRE_THROWS_AS(parse_mesh_str("DeviceMesh((4,,2), 'cpu')"), Error);  // an empty item
  REQUIRE_THROWS_AS(parse_mesh_str("DeviceMesh('cpu', [, 1])"), Error);
  REQUIRE_THROWS_AS(parse_mesh_str("DeviceMesh('cpu', [0, [1, 2]])"), Error);  // ragged
  REQUIRE_THROWS_AS(parse_mesh_str("DeviceMesh('cpu', [[0, 1], [2]])"), Error);
  REQUIRE_THROWS_AS(parse_mesh_str("DeviceMesh('cpu', [[0, 1], [[2], [3]]])"), Error);
}
