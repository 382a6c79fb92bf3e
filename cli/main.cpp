// The commtrace binary: CLI11 wiring, one function per subcommand. This is the only place that
// maps errors to exit codes: 0 success, 1 a failed check (verify, diff, check, --expect,
// --rank all), 2 bad input or any other error.
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>

#include "kernels/backend.h"
#include "parallel/nn/models.h"
#include "parallel/run/bench.h"
#include "parallel/run/runner.h"
#include "parallel/run/train.h"
#include "parallel/tensor/ops.h"
#include "report/advise.h"
#include "report/baseline.h"
#include "report/chrome_trace.h"
#include "report/consistency.h"
#include "report/cost.h"
#include "report/diff.h"
#include "report/html.h"
#include "report/kineto.h"
#include "report/names.h"
#include "report/torch_compat.h"
#include "report/trace_json.h"
#include "report/tree.h"
#include "tracer/json_io.h"

namespace commtrace {
namespace {

// Prints "commtrace: <kind><what>" to stderr; never throws (stderr may be full or closed too).
// Control characters in the message (from an argument or a file) are shown as \xNN, so a
// message cannot carry a terminal escape sequence.
void print_error(const char* kind, const char* what) noexcept {
  // The line is built first and written at once (stderr is unbuffered: a write per character
  // would let the lines of processes sharing the stream, mpirun's ranks, interleave). A line
  // longer than the buffer is written in pieces.
  char buf[4096];
  std::size_t n = 0;
  auto flush = [&] {
    std::fwrite(buf, 1, n, stderr);
    n = 0;
  };
  auto put = [&](const char* s, std::size_t len) {
    for (std::size_t i = 0; i < len; ++i) {
      if (n == sizeof buf) flush();
      buf[n++] = s[i];
    }
  };
  put("commtrace: ", 11);
  put(kind, std::strlen(kind));
  for (const char* p = what; *p != '\0'; ++p) {
    const auto c = static_cast<unsigned char>(*p);
    const bool c1 = c == 0xc2 && static_cast<unsigned char>(p[1]) >= 0x80 &&
                    static_cast<unsigned char>(p[1]) <= 0x9f;
    if (c < 0x20 || c == 0x7f || c1) {
      char esc[5];
      std::snprintf(esc, sizeof esc, "\\x%02x", c1 ? static_cast<unsigned char>(*++p) : c);
      put(esc, 4);
    } else {
      put(p, 1);
    }
  }
  put("\n", 1);
  flush();
}

// Option checks with short messages (CLI11's numeric ranges print 309-digit bounds) that refuse
// what a conversion would silently change: a negative seed wrapping, inf or nan as a rate.
CLI::Validator positive_finite() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (end == s.c_str() || *end != '\0' || !std::isfinite(v) || v <= 0) {
          return "must be a positive finite number, got " + s;
        }
        return {};
      },
      "POSITIVE");
}

// A whole number in [lo, hi], written in decimal digits.
CLI::Validator whole_number(std::uint64_t lo, std::uint64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        std::uint64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) {
          return fmt::format("must be a whole number in [{}, {}], got {}", lo, hi, s);
        }
        return {};
      },
      fmt::format("UINT in [{}, {}]", lo, hi));
}
constexpr std::uint64_t kMaxSeed = std::numeric_limits<std::uint64_t>::max();

// One of `names`; a typo gets the closest one suggested.
CLI::Validator one_of(std::vector<std::string> names) {
  const std::string desc = fmt::format("{{{}}}", fmt::join(names, ","));
  return CLI::Validator(
      [names = std::move(names)](std::string& s) -> std::string {
        if (std::find(names.begin(), names.end(), s) != names.end()) return {};
        return fmt::format("{} not in {{{}}}{}", s, fmt::join(names, ","), did_you_mean(s, names));
      },
      desc);
}

// A parse error's message with a suggestion for an unknown subcommand or option: the closest
// subcommand name or option name of the subcommand being parsed.
std::string with_suggestion(const CLI::App& app, const CLI::ParseError& e) {
  std::string msg = e.what();
  const CLI::App* at = &app;
  for (bool deeper = true; deeper;) {
    deeper = false;
    for (const CLI::App* sub : at->get_subcommands()) {
      at = sub, deeper = true;
      break;
    }
  }
  std::vector<std::string> names;
  for (const CLI::App* sub : at->get_subcommands({})) names.push_back(sub->get_name());
  for (const CLI::Option* o : at->get_options()) {
    for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
  }
  for (const std::string& extra : at->remaining()) {
    const std::string hint = did_you_mean(extra.substr(0, extra.find('=')), names);
    if (!hint.empty()) return fmt::format("{}: '{}'{}", msg, extra, hint);
  }
  return msg;
}

// Colour only on a terminal and never with NO_COLOR set.
bool use_color() { return isatty(STDOUT_FILENO) && std::getenv("NO_COLOR") == nullptr; }

int cmd_models() {
  fmt::print("{:<13} {:>8}  {:<18} {}\n", "model", "params", "input", "description");
  for (const ModelEntry& e : model_zoo()) {
    std::int64_t count = 0;
    for (const Tensor& p : e.build(0, ModuleOptions{DType::F32, Device::Meta})->parameters()) {
      count += p.numel();
    }
    fmt::print("{:<13} {:>8}  {:<18} {}\n", e.name, count, e.input, e.description);
  }
  // Which --device values run here (cuda: built with the CUDA backend and a device visible).
  std::string devices;
  for (Device d : {Device::CPU, Device::CUDA, Device::Meta}) {
    const std::string why = kernels_unavailable_reason(d);
    devices += fmt::format("{}{} {}", devices.empty() ? "" : ", ", device_name(d),
                           why.empty() ? "yes" : fmt::format("no ({})", why));
  }
  fmt::print("\ndevices: {}\n", devices);
  return 0;
}

struct TrainArgs {
  TrainOptions opts;
  std::string device = "cpu";
  std::string dtype = "f32";
  bool allow_tf32 = false;
};

int cmd_train(TrainArgs& a) {
  set_allow_tf32(a.allow_tf32);
  a.opts.module.device = parse_device(a.device);
  a.opts.module.dtype = parse_dtype(a.dtype);
  const bool meta = a.opts.module.device == Device::Meta;
  fmt::print("train {} on {} ({}, {}, lr {}, seed {})\n", a.opts.model, a.device, a.dtype,
             a.opts.optimizer, a.opts.lr, a.opts.seed);
  train(a.opts, [&](const StepResult& r) {
    if (meta) {
      fmt::print("step {:>3}  output {}  loss {}  (meta: shapes only)\n", r.step,
                 describe(r.output), describe(r.loss));
    } else {
      fmt::print("step {:>3}  loss {:.6f}\n", r.step, r.loss.item());
    }
    std::fflush(stdout);
  });
  return 0;
}

void add_topology_option(CLI::App* c, std::string& topology) {
  c->add_option("--topology", topology,
                fmt::format("Estimate times with the cost model on a topology: {} (presets), or a "
                            "topology JSON file",
                            fmt::join(topology_presets(), ", ")));
}

// Options shared by run and verify: what to run in parallel.
// How many processes an MPI launcher (mpirun, srun) started this one among, from the
// environment it sets; 1 when none did.
int mpi_launched_processes() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* v = std::getenv(var)) {
      int n = 0;
      const auto [end, ec] = std::from_chars(v, v + std::strlen(v), n);
      if (ec == std::errc() && n > 1) return n;
    }
  }
  return 1;
}

struct ParallelArgs {
  ParallelConfig cfg;
  std::string mesh;
  std::string device = "cpu";
  std::string dtype = "f32";
  std::string ddp_buckets = "default";
  bool no_reshard = false;
  bool allow_tf32 = false;
  std::string context_parallel;  // --context-parallel FAMILY
  CLI::Option* world_opt = nullptr;
  Processes procs;  // this process among the launch's (after resolve)

  void add_to(CLI::App* c) {
    c->add_option("--model", cfg.model, "Zoo model or model JSON file")->capture_default_str();
    c->add_option(
         "--plan", cfg.plan,
         "Built-in plan (tp, sp; decoder: torchtitan, megatron, megatron-sp) or plan JSON file")
        ->capture_default_str();
    world_opt = c->add_option("--world-size", cfg.world_size,
                              "Ranks (with --backend mpi: the processes mpirun started)")
                    ->capture_default_str()
                    ->check(CLI::Range(1, 4096));
    c->add_option("--mesh", mesh,
                  "Mesh shape: N, DPxTP for data parallel × plan (e.g. 2x2); with a "
                  "context-parallel family CP, DPxCP, or CPxTP / DPxCPxTP beside a plan's styles");
    c->add_option("--context-parallel", context_parallel,
                  "A sequence-parallel family on the cp dim beside the plan's styles on tp: "
                  "ulysses, ring, rsa (as published), or a plan file whose context_parallel "
                  "to take (e.g. samples/plans/rsa_exact.json)");
    c->add_flag("--input-requires-grad", cfg.input_requires_grad,
                "The model input requires grad (backward collectives for its gradient)");
    c->add_option("--seed", cfg.seed, "Seed of weights and batch")
        ->capture_default_str()
        ->check(whole_number(0, kMaxSeed));
    c->add_option("--dtype", dtype, "f32, f64, or bf16 (f32 accumulation)")
        ->capture_default_str()
        ->check(one_of({"f32", "f64", "bf16"}));
    c->add_option("--timeout", cfg.timeout_s,
                  "Seconds a rank waits for the others of its group before the run fails")
        ->capture_default_str()
        ->check(positive_finite());
    c->add_option("--ddp-buckets", ddp_buckets,
                  "DDP on the dp dim of a 2-D mesh: default (PyTorch's: 1 MiB first bucket, then "
                  "25 MiB), a cap in MiB, or none (one all_reduce per gradient)")
        ->capture_default_str()
        ->check([](const std::string& v) -> std::string {
          if (v == "default" || v == "none") return {};
          char* end = nullptr;
          const double x = std::strtod(v.c_str(), &end);
          if (end == v.c_str() || *end != '\0' || !(x > 0) || !(x <= 1e6)) {
            return "must be default, none, or a cap in MiB in (0, 1e6], got " + v;
          }
          return {};
        });
    c->add_option("--data-parallel", cfg.data_parallel,
                  "The dp dim of a 2-D mesh: ddp (gradient buckets) or fsdp (FSDP2's fully_shard "
                  "on every layers.<i> block and the root)")
        ->capture_default_str()
        ->check(one_of({"ddp", "fsdp"}));
    c->add_flag("--allow-tf32", allow_tf32,
                "f32 GEMMs on cuda may use TF32 tensor cores (PyTorch's "
                "torch.backends.cuda.matmul.allow_tf32); no effect on cpu");
    c->add_flag("--no-reshard-after-forward", no_reshard,
                "fsdp: keep the gathered parameters from forward to backward (no second "
                "all_gather)");
  }
  // REQUIRES: cfg.backend set. Starts MPI for the mpi backend.
  void resolve() {
    if (!mesh.empty()) cfg.mesh = parse_mesh_shape(mesh);
    if (names_a_file(context_parallel)) {
      const Plan p = load_plan_file(context_parallel);
      COMMTRACE_CHECK(p.context_parallel.has_value(), ErrorCode::InvalidArgument,
                      "--context-parallel {}: the plan file has no \"context_parallel\"",
                      context_parallel);
      cfg.context_parallel = p.context_parallel;
    } else if (!context_parallel.empty()) {
      ContextParallel cp;
      cp.family = context_parallel;
      cp.check();  // names the families
      cfg.context_parallel = cp;
    }
    cfg.ddp_bucket_mb = ddp_buckets == "default" ? 0.0
                        : ddp_buckets == "none"  ? -1.0
                                                 : std::strtod(ddp_buckets.c_str(), nullptr);
    cfg.reshard_after_forward = !no_reshard;
    set_allow_tf32(allow_tf32);
    cfg.module.dtype = parse_dtype(dtype);
    cfg.module.device = parse_device(device);
    const int launched = mpi_launched_processes();
    COMMTRACE_CHECK(launched == 1 || cfg.backend == "mpi" || cfg.backend == "nccl",
                    ErrorCode::InvalidArgument,
                    "mpirun started {} processes: pass --backend mpi or nccl (one rank per "
                    "process); with the {} backend every process would run the whole job",
                    launched, cfg.backend);
    procs = processes_of(launcher_for(cfg.backend));
    if (launcher_for(cfg.backend) == "mpi" && world_opt->count() == 0) {
      cfg.world_size = procs.size;
    }
  }
};

struct VerifyArgs {
  ParallelArgs p;
  double tolerance = 0;  // from --tolerance, else the dtype's default
  CLI::Option* tolerance_opt = nullptr;
};

int cmd_verify(VerifyArgs& a) {
  a.p.resolve();
  const ParallelConfig& cfg = a.p.cfg;
  if (a.tolerance_opt->count() == 0) {
    a.tolerance = default_tolerance(cfg.module.dtype, allow_tf32(), cfg.world_size);
  }
  const std::vector<int> shape = mesh_shape(cfg);
  if (a.p.procs.rank == 0) {
    fmt::print(
        "verify {} plan {} on {} ranks (mesh {}, {} backend) against one device, seed {}{}\n",
        cfg.model, cfg.plan, cfg.world_size, fmt::join(shape, "x"), cfg.backend, cfg.seed,
        cfg.input_requires_grad ? ", input requires grad" : "");
    std::fflush(stdout);
  }
  const VerifyReport r = verify(cfg, a.tolerance);
  if (!r.reported) return 0;  // another process (rank 0's) compares and prints
  if (!r.note.empty()) fmt::print("note: {}\n", r.note);
  std::size_t width = 6;
  for (const TensorCheck& c : r.checks) width = std::max(width, c.name.size());
  fmt::print("  {:<{}}  {:>12}  {}\n", "tensor", width, "max rel err", "status");
  for (const TensorCheck& c : r.checks) {
    fmt::print("  {:<{}}  {:>12.3e}  {}{}\n", c.name, width, c.max_rel_err,
               c.pass ? "PASS" : "FAIL", c.factor.empty() ? "" : "  differs by " + c.factor);
  }
  const bool ok = r.pass();
  fmt::print("{}: {} tensors, tolerance {:.0e}\n", ok ? "PASS" : "FAIL", r.checks.size(),
             a.tolerance);
  return ok ? 0 : 1;
}

// How a trace is shown by run and show.
struct ViewArgs {
  int noise = 0;
  bool explain = false;
  std::string compat;
  std::string topology;      // a preset or a topology JSON file
  std::string chrome_trace;  // --chrome-trace FILE
  bool memory = false;       // --memory: per module
  std::optional<AtomicFile> timeline_file;

  void add_to(CLI::App* c) {
    c->add_option("--noise", noise,
                  "0: collectives; 1: + types, params, sharded ops, reasons; "
                  "2: + local ops; 3: + trivial ops")
        ->capture_default_str()
        ->check(CLI::Range(0, 3));
    c->add_flag("--explain", explain, "Show why every collective happened");
    c->add_option("--compat", compat, "torch: CommDebugMode's table layout")
        ->check(one_of({"torch"}));
    add_topology_option(c, topology);
    c->add_flag("--memory", memory,
                "Memory per module: parameters, gradients, optimizer state, activations saved for "
                "backward");
    c->add_option("--chrome-trace", chrome_trace,
                  "Write the timeline as Chrome trace-event JSON (Perfetto, chrome://tracing): "
                  "measured times, or the cost model's (--topology, default h100) where none "
                  "were measured");
  }
  // --chrome-trace: every traced rank's timeline, written through a temporary file that
  // open_timeline() creates (before a run, so that a path that cannot be written fails first).
  void open_timeline() {
    if (!chrome_trace.empty() && !timeline_file) timeline_file.emplace(chrome_trace);
  }
  void write_timeline(const std::vector<Trace>& traces, std::FILE* report) {
    if (chrome_trace.empty()) return;
    open_timeline();
    write_chrome_trace(traces, load_topology(topology.empty() ? "h100" : topology),
                       [&](std::string_view s) { timeline_file->write(s); });
    timeline_file->commit();
    timeline_file.reset();
    fmt::print(report, "wrote {} (Chrome trace events, {} rank{})\n", chrome_trace, traces.size(),
               traces.size() == 1 ? "" : "s");
  }
  void print(const Trace& t, std::FILE* out = stdout) const {
    if (const auto w = t.metadata.find("warning"); w != t.metadata.end()) {
      print_error("warning: ", w->second.c_str());
    }
    const bool color = out == stdout && use_color();
    if (compat == "torch") {
      fmt::print(out, "{}", torch_table(t, noise, color));
      return;
    }
    std::optional<TraceCost> cost;
    if (!topology.empty()) cost.emplace(t, load_topology(topology));
    const TraceCost* c = cost ? &*cost : nullptr;
    fmt::print(out, "{}\n{}", render_tree(t, TreeOptions{noise, explain, color, c}),
               render_summary(t, c));
    if (memory) {
      const std::string m = render_memory(t);
      fmt::print(out, "\n{}", m.empty() ? "(the trace holds no memory figures)\n" : m);
    }
  }
};

// Cross-rank consistency of the traces (--rank all): 0 when consistent, else 1 after naming
// every divergence.
int print_consistency(const std::vector<Trace>& traces, std::FILE* out) {
  const auto problems = check_rank_consistency(traces);
  if (problems.empty()) {
    fmt::print(out, "ranks consistent: {} ranks issue the same collectives in the same order\n",
               traces.size());
    return 0;
  }
  fmt::print(out, "ranks diverge ({} problem{}):\n", problems.size(),
             problems.size() == 1 ? "" : "s");
  for (const auto& p : problems) fmt::print(out, "  {}\n", p);
  return 1;
}

// The tracer's timing sample (run, bench step).
void add_timing_options(CLI::App* cmd, TimingPolicy& t) {
  cmd->add_option(
         "--time-first", t.first,
         "Time the first N occurrences of a repeated iteration (the first is always timed)")
      ->capture_default_str()
      ->check(whole_number(1, 1000000000));
  cmd->add_option("--time-every", t.every,
                  "Then time one repeat in N (1: every repeat; 0: none after the first ones)")
      ->capture_default_str()
      ->check(whole_number(0, 1000000000));
}

struct RunArgs {
  ParallelArgs p;
  ViewArgs view;
  int iters = 1;
  TimingPolicy timing;
  std::string backend = "threads";
  std::string rank = "0";
  double lr = 1e-3;
  std::string json, torch_json, per_rank_dir;
  bool pretty = false;
  std::vector<std::string> expect;
};

// A run's identity for `merge`: random, made by process 0 and shared with the others.
std::string new_run_id() {
  std::random_device rd;
  const std::uint64_t v =
      (std::uint64_t(rd()) << 32) ^ rd() ^
      std::uint64_t(std::chrono::system_clock::now().time_since_epoch().count());
  return fmt::format("{:016x}", v);
}

// With one process per rank: every process's traces, in rank order, on process 0 (which
// returns true); the others return false with `traces` unchanged.
bool gather_traces(const ParallelArgs& p, std::vector<Trace>& traces) {
  if (p.procs.size == 1) return true;
  const std::string launcher = launcher_for(p.cfg.backend);
  const std::vector<std::string> all = gather_to_first(
      launcher, traces.empty() ? std::string() : trace_json_string(traces), p.cfg.timeout_s);
  if (p.procs.rank != 0) return false;
  std::vector<Trace> merged;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].empty()) continue;
    for (Trace& t : read_trace_json(all[i], fmt::format("the trace of process {}", i))) {
      merged.push_back(std::move(t));
    }
  }
  traces = std::move(merged);
  return true;
}

// --per-rank-files DIR, before the run: DIR exists (made when missing) and can be written.
void prepare_per_rank_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  COMMTRACE_CHECK(!ec, ErrorCode::Io, "--per-rank-files: cannot create {}: {}", dir, ec.message());
  COMMTRACE_CHECK(::access(dir.c_str(), W_OK) == 0, ErrorCode::Io,
                  "--per-rank-files: cannot write to {}: {}", dir, std::strerror(errno));
}

// --per-rank-files DIR: this process's traces, one file per rank (DIR/rank-<r>.json).
void write_per_rank_files(const std::string& dir, const std::vector<Trace>& traces) {
  for (const Trace& t : traces) {
    write_trace_file(fmt::format("{}/rank-{}.json", dir, t.rank), {t});
  }
}

int cmd_run(RunArgs& a) {
  COMMTRACE_CHECK(!(a.json == "-" && a.torch_json == "-"), ErrorCode::InvalidArgument,
                  "--json - and --torch-json -: only one of them can go to standard output");
  validate_expectations(a.expect);  // a typo fails now, not after the run
  a.p.cfg.backend = a.backend;
  a.p.resolve();
  TraceOptions o;
  o.cfg = a.p.cfg;
  o.iters = a.iters;
  o.timing = a.timing;
  o.lr = a.lr;
  const bool all = a.rank == "all";
  int shown = 0;
  if (all) {
    for (int r = 0; r < o.cfg.world_size; ++r) o.ranks.push_back(r);
  } else {
    try {
      std::size_t used = 0;
      shown = std::stoi(a.rank, &used);
      if (used != a.rank.size()) throw std::invalid_argument(a.rank);
    } catch (const std::exception&) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("--rank: expected a rank number or 'all', got '{}'", a.rank));
    }
    o.ranks = {shown};
  }
  // A long run shows its progress on a terminal: one line, rewritten at most 10 times a second.
  const bool progress = a.iters > 1 && isatty(STDERR_FILENO) && a.p.procs.rank == 0;
  std::chrono::steady_clock::time_point last{};
  if (progress) {
    o.on_iteration = [&](int done, int total) {
      const auto now = std::chrono::steady_clock::now();
      if (done < total && now - last < std::chrono::milliseconds(100)) return;
      last = now;
      fmt::print(stderr, "\rcommtrace run: iteration {}/{}", done, total);
      std::fflush(stderr);
    };
  }
  // The output files are created (as temporaries) before the run: a path that cannot be
  // written fails now, not after a long run. Process 0 writes them. --json and --torch-json
  // replace their targets only when both were written, so a failure of either leaves both as
  // they were; the timeline is committed after them.
  std::optional<AtomicFile> json_file, torch_file;
  if (a.p.procs.rank == 0) {
    if (!a.json.empty() && a.json != "-") json_file.emplace(a.json);
    if (!a.torch_json.empty() && a.torch_json != "-") torch_file.emplace(a.torch_json);
    a.view.open_timeline();
  }
  if (!a.per_rank_dir.empty()) prepare_per_rank_dir(a.per_rank_dir);
  std::vector<double> losses;
  std::vector<Trace> traces = trace_run(o, &losses);
  if (progress) fmt::print(stderr, "\r\x1b[K");
  std::vector<Trace> local;  // this process's traces, for --per-rank-files
  if (!a.per_rank_dir.empty()) {
    const std::string id = broadcast_from_first(launcher_for(o.cfg.backend), new_run_id());
    for (Trace& t : traces) t.metadata["run_id"] = id;
    local = traces;
  }
  const bool reports = gather_traces(a.p, traces);
  if (!a.per_rank_dir.empty()) write_per_rank_files(a.per_rank_dir, local);
  if (!reports) return 0;  // process 0 prints and writes the run's files
  const Trace& t = traces.front();
  const auto& md = t.metadata;
  // With --compat torch stdout holds CommDebugMode's table alone (byte-comparable with
  // PyTorch's); the run's header goes to stderr. With --json - (or --torch-json -) stdout holds
  // that JSON alone and every report goes to stderr.
  const bool json_out = a.json == "-" || a.torch_json == "-";
  std::FILE* head = a.view.compat == "torch" || json_out ? stderr : stdout;
  fmt::print(head,
             "commtrace run: {} with plan {} on {} ranks ({}), {} backend, {}, {} iteration{}{}\n",
             md.at("model"), md.at("plan"), md.at("world_size"), md.at("mesh"), md.at("backend"),
             md.at("device"), a.iters, a.iters == 1 ? "" : "s",
             o.cfg.input_requires_grad ? ", input requires grad" : "");
  if (!losses.empty()) {
    fmt::print(head, "loss: {:.6f}{}\n", losses.front(),
               losses.size() > 1 ? fmt::format(" → {:.6f}", losses.back()) : "");
  }
  fmt::print(head, "trace of rank {}:\n", t.rank);
  std::fflush(head);
  a.view.print(t, json_out ? stderr : stdout);

  if (a.json == "-") {
    write_trace_json(
        traces, [](std::string_view s) { std::fwrite(s.data(), 1, s.size(), stdout); }, a.pretty);
    std::fputc('\n', stdout);
  } else if (a.torch_json == "-") {
    fmt::print("{}\n", torch_json_dump(t, a.view.noise));
  }
  if (json_file) {
    write_trace_json(
        traces, [&](std::string_view s) { json_file->write(s); }, a.pretty);
  }
  if (torch_file) {
    torch_file->write(torch_json_dump(t, a.view.noise));
  }
  if (json_file) {
    json_file->commit();
    fmt::print(head, "wrote {} ({} rank{})\n", a.json, traces.size(),
               traces.size() == 1 ? "" : "s");
  }
  if (torch_file) {
    torch_file->commit();
    fmt::print(head, "wrote {} (PyTorch generate_json_dump, noise {})\n", a.torch_json,
               a.view.noise);
  }
  if (!a.per_rank_dir.empty()) {
    fmt::print(head, "wrote {}/rank-<r>.json ({} rank{}, one file each; join with merge)\n",
               a.per_rank_dir, traces.size(), traces.size() == 1 ? "" : "s");
  }
  a.view.write_timeline(traces, head);
  int rc = all ? print_consistency(traces, head) : 0;
  if (!a.expect.empty()) {
    const CheckResult r = check_expectations(t, a.expect);
    for (const Mismatch& d : r.differences) {
      fmt::print(head, "expectation failed: {}\n", d.str());
    }
    if (r.ok) fmt::print(head, "expectations met: {}\n", a.expect.size());
    if (!r.ok) rc = 1;
  }
  return rc;
}

struct ReportArgs {
  std::vector<std::string> files;
  std::string out;
  int rank = 0;
  std::string topology = "h100";
};

// One self-contained HTML page of one trace, or two side by side.
int cmd_report(ReportArgs& a) {
  COMMTRACE_CHECK(a.files.size() == 1 || a.files.size() == 2, ErrorCode::InvalidArgument,
                  "report: give one trace, or two to compare (got {})", a.files.size());
  std::vector<HtmlSide> sides;
  for (const std::string& f : a.files) sides.push_back(HtmlSide{f, load_traces(f)});
  write_text_file(a.out, html_report(sides, a.rank, load_topology(a.topology)));
  fmt::print("wrote {} ({}, rank {})\n", a.out,
             a.files.size() == 1 ? a.files[0] : a.files[0] + " against " + a.files[1], a.rank);
  return 0;
}

struct AdviseArgs {
  std::string model = "transformer";
  int world_size = 8;
  std::string mesh;  // "", "DPxTP", or "all"
  std::string data_parallel = "ddp";
  std::vector<std::string> plans;  // plan files beside the built-in ones
  std::string topology = "h100";
  std::string format = "text";
};

// Every built-in plan of the model (and the files given) on the mesh (or every DPxTP split of
// the world with --mesh all), traced shape-only on every rank, ranked by the cost model's time
// and peak memory.
int cmd_advise(AdviseArgs& a) {
  const Topology topo = load_topology(a.topology);
  const ModelEntry& entry = resolve_model(a.model);
  std::vector<std::string> plans = builtin_plan_names(entry.family);
  plans.insert(plans.end(), a.plans.begin(), a.plans.end());
  std::vector<std::vector<int>> meshes;
  if (a.mesh == "all") {
    meshes.push_back({a.world_size});
    for (int dp = 2; dp <= a.world_size; ++dp) {
      if (a.world_size % dp == 0) meshes.push_back({dp, a.world_size / dp});
    }
  } else {
    meshes.push_back(a.mesh.empty() ? std::vector<int>{a.world_size} : parse_mesh_shape(a.mesh));
  }
  std::vector<PlanCandidate> candidates;
  for (const std::vector<int>& mesh : meshes) {
    for (const std::string& plan : plans) {
      PlanCandidate c;
      c.plan = plan;
      c.mesh = fmt::format("{}", fmt::join(mesh, "x"));
      if (mesh.size() == 2) c.data_parallel = a.data_parallel;
      TraceOptions o;
      o.cfg.model = a.model;
      o.cfg.plan = plan;
      o.cfg.world_size = a.world_size;
      o.cfg.backend = "fake";
      o.cfg.module.device = Device::Meta;
      if (mesh.size() == 2) o.cfg.mesh = mesh;
      o.cfg.data_parallel = a.data_parallel;
      for (int r = 0; r < a.world_size; ++r) o.ranks.push_back(r);
      try {
        c.traces = trace_run(o);
      } catch (const Error& e) {
        c.error = e.what();
      }
      candidates.push_back(std::move(c));
    }
  }
  const std::vector<PlanAdvice> advice = rank_plans(candidates, topo);
  if (a.format == "json") {
    fmt::print("{}", advice_json(advice, a.model, a.world_size, topo));
  } else {
    fmt::print("{}", render_advice(
                         advice, fmt::format("advise: {} on {} ranks, shape-only (meta "
                                             "device, fake backend), times on {} ({})",
                                             a.model, a.world_size, topo.name, topo.description)));
  }
  const bool any =
      std::any_of(advice.begin(), advice.end(), [](const PlanAdvice& x) { return x.applies; });
  COMMTRACE_CHECK(any, ErrorCode::InvalidArgument,
                  "advise: no plan applies to {} on {} ranks (see above)", a.model, a.world_size);
  return 0;
}

struct BenchArgs {
  ParallelArgs p;
  std::string backend = "threads";
  StepBenchOptions step;
  std::string rank = "all";
  int ar_world = 2;
  std::string ar_backend = "threads";
  std::string ar_device = "cpu";
  double mib = 64;
  int rounds = 15;
};

int cmd_bench_step(BenchArgs& a) {
  a.p.cfg.backend = a.backend;
  a.p.resolve();
  a.step.cfg = a.p.cfg;
  COMMTRACE_CHECK(a.rank == "all" || a.rank == "0", ErrorCode::InvalidArgument,
                  "--rank: expected 0 or all, got '{}'", a.rank);
  a.step.trace_all_ranks = a.rank == "all";
  const ParallelConfig& cfg = a.step.cfg;
  fmt::print(
      "commtrace bench step: {} plan {} on {} ranks, {} backend, {}; {} rounds of {} steps, "
      "each traced and untraced in turn\n",
      cfg.model, cfg.plan, cfg.world_size, cfg.backend, device_name(cfg.module.device),
      a.step.rounds, a.step.steps);
  std::fflush(stdout);
  const StepBenchResult r = bench_step(a.step);
  fmt::print("  untraced step     {:>10.1f} us  (median)\n", r.untraced_s * 1e6);
  fmt::print("  traced step       {:>10.1f} us  (median; {} rank{} traced)\n", r.traced_s * 1e6,
             r.traced_ranks, r.traced_ranks == 1 ? "" : "s");
  fmt::print(
      "  traced/untraced   {:>10.3f}     (a round of {} steps; the rounds' quartiles: {:.3f} to "
      "{:.3f})\n",
      r.ratio, a.step.steps, r.ratio_q1, r.ratio_q3);
  fmt::print("  events per step   {:>10}     (per traced rank)\n", r.events_per_step);
  fmt::print(
      "  cost per event    {:>10.0f} ns  ((traced/untraced - 1) x untraced / events; wall time)\n",
      r.ns_per_event());
  const auto kind = [&](const char* name, const StepBenchResult::Kind& k, const char* what) {
    if (k.steps == 0) return;
    fmt::print("    {:<15} {:>10.0f} ns  ({}: {:.1f} / {:.1f} us, pairs {:.3f}; {} of {})\n", name,
               r.ns_per_event(k), what, k.traced_s * 1e6, k.untraced_s * 1e6, k.ratio, k.steps,
               r.first.steps + r.timed.steps + r.untimed.steps);
  };
  kind("first step", r.first, "a new tracer's first iteration, interning all it sees");
  kind("timed repeats", r.timed, "each event compared with the last step's, and timed");
  kind("untimed repeats", r.untimed, "each event only compared: the steady state of a long run");
  fmt::print(
      "  cpu per step      {:>10.1f} us  (rank 0's thread, waits excluded; untraced {:.1f} us: "
      "{:.3f})\n",
      r.traced_cpu_s * 1e6, r.untraced_cpu_s * 1e6, r.ratio_cpu());
  fmt::print(
      "  stored record     {:>10} B   (with its arguments and tables; {} stored for {} "
      "recorded: identical iterations fold)\n",
      r.record_bytes, r.stored_records, r.recorded_events);
  return 0;
}

int cmd_bench_allreduce(BenchArgs& a) {
  const auto bytes = std::uint64_t(a.mib * 1024 * 1024);
  const std::string launcher = launcher_for(a.ar_backend);
  const Processes procs = processes_of(launcher);
  if (launcher == "mpi") a.ar_world = procs.size;
  ParallelConfig cfg;  // the device checks of run and verify
  cfg.backend = a.ar_backend;
  cfg.module.device = parse_device(a.ar_device);
  check_device(cfg);
  if (procs.rank == 0) {
    fmt::print(
        "commtrace bench allreduce: {} of f32 on {} {} ranks ({}), {} rounds, a copy of the "
        "same bytes after each\n",
        format_bytes(bytes), a.ar_world, a.ar_backend, a.ar_device, a.rounds);
    std::fflush(stdout);
  }
  const AllReduceBenchResult r =
      bench_all_reduce(a.ar_world, bytes, a.rounds, a.ar_backend, cfg.module.device);
  if (!r.reported) return 0;
  fmt::print(
      "  all_reduce        {:>10.2f} ms  (median)   algbw {:>7.2f} GB/s   busbw {:>7.2f} GB/s\n",
      r.all_reduce_s * 1e3, r.algbw_gbs, r.busbw_gbs);
  fmt::print("  memcpy            {:>10.2f} ms  (median)   {:>13.2f} GB/s\n", r.memcpy_s * 1e3,
             r.memcpy_gbs);
  fmt::print(
      "  busbw / memcpy    {:>10.2f}     ({} ranks on {} cores; a memcpy moves 2·S on one "
      "core)\n",
      r.busbw_gbs / r.memcpy_gbs, r.world_size, r.cores);
  return 0;
}

const Trace& pick_rank(const std::vector<Trace>& traces, int rank, const std::string& path) {
  for (const Trace& t : traces) {
    if (t.rank == rank) return t;
  }
  std::vector<int> held;
  for (const Trace& t : traces) held.push_back(t.rank);
  const std::string holds = held.empty()
                                ? std::string("none")
                                : fmt::format("rank{} {}; pick one with --rank",
                                              held.size() == 1 ? "" : "s", fmt::join(held, ", "));
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("{} holds no trace of rank {} (it holds {})", path, rank, holds));
}

struct ShowArgs {
  std::string file;
  std::string rank = "0";  // or "all": rank 0, then the ranks' consistency
  ViewArgs view;
};

int cmd_show(ShowArgs& a) {
  const std::vector<Trace> traces = load_traces(a.file);
  const bool all = a.rank == "all";
  a.view.print(pick_rank(traces, all ? traces.front().rank : std::stoi(a.rank), a.file));
  a.view.write_timeline(traces, stdout);
  return all ? print_consistency(traces, stdout) : 0;
}

struct DiffArgs {
  std::string a, b;
  int rank = 0;
  int depth = -1;
  std::string format = "text";
  std::string topology;
};

int cmd_diff(DiffArgs& d) {
  const std::vector<Trace> ta = load_traces(d.a), tb = load_traces(d.b);
  DiffOptions o;
  o.label_a = d.a;
  o.label_b = d.b;
  o.max_depth = d.depth;
  std::optional<Topology> topo;
  if (!d.topology.empty()) topo = load_topology(d.topology);
  o.topology = topo ? &*topo : nullptr;
  const DiffResult r = diff_traces(pick_rank(ta, d.rank, d.a), pick_rank(tb, d.rank, d.b), o);
  fmt::print("{}", d.format == "json" ? diff_json(r) : render_diff(r, use_color()));
  return r.equal ? 0 : 1;
}

struct ImportArgs {
  std::vector<std::string> paths;
  std::string out;
  std::string model, plan;               // labels for headers and baselines
  std::vector<std::string> group_names;  // OLD=NEW
  bool pretty = false;
};

// PyTorch profiler traces (one file per rank, or folders of them) into one commtrace trace file;
// prints rank 0's summary and what the traces could not tell.
int cmd_import_kineto(ImportArgs& a) {
  std::vector<std::pair<std::string, std::string>> renames;
  for (const std::string& g : a.group_names) {
    const std::size_t eq = g.find('=');
    COMMTRACE_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < g.size(),
                    ErrorCode::InvalidArgument,
                    "--group-name: expected OLD=NEW (e.g. default_pg=tp), got '{}'", g);
    renames.emplace_back(g.substr(0, eq), g.substr(eq + 1));
  }
  KinetoImport in = import_kineto(a.paths);
  for (Trace& t : in.traces) {
    if (!a.model.empty()) t.metadata["model"] = a.model;
    if (!a.plan.empty()) t.metadata["plan"] = a.plan;
    for (const auto& [from, to] : renames) {
      const StrId id = t.pools.intern(to);
      for (Record& r : t.records) {
        if (r.kind == EventKind::Collective && t.str(r.collective.group) == from) {
          r.collective.group = id;
        }
      }
    }
  }
  write_trace_file(a.out, in.traces, a.pretty);
  const Trace& t = in.traces.front();
  fmt::print("imported {} rank{} ({} iterations) into {}\n", in.traces.size(),
             in.traces.size() == 1 ? "" : "s", t.metadata.at("iterations"), a.out);
  for (const auto& [key, value] : t.metadata) {
    if (key == "modules" || key == "group_size") fmt::print("note: {}: {}\n", key, value);
  }
  for (const std::string& n : in.notes) fmt::print("note: {}\n", n);
  fmt::print("\n{}", render_summary(t));
  return 0;
}

struct MergeArgs {
  std::vector<std::string> files;
  std::string out;
  bool pretty = false;
};

// Joins per-rank trace files of one run (run --per-rank-files) into one trace file: the files
// must hold the same metadata (the same run_id: one run) and distinct ranks.
int cmd_merge(MergeArgs& a) {
  std::vector<Trace> merged;
  std::vector<std::string> source;  // the file of each merged trace
  for (const std::string& file : a.files) {
    for (Trace& t : load_traces(file)) {
      COMMTRACE_CHECK(t.metadata.count("run_id") == 1, ErrorCode::InvalidArgument,
                      "{}: rank {} has no run_id; merge joins the files of one run written with "
                      "run --per-rank-files",
                      file, t.rank);
      if (!merged.empty() && t.metadata != merged.front().metadata) {
        // Name the first key (in either file) whose values differ.
        const auto& want = merged.front().metadata;
        auto value = [](const auto& md, const std::string& key) {
          const auto it = md.find(key);
          return it == md.end() ? std::string("(none)") : it->second;
        };
        std::string key;
        const std::map<std::string, std::string>& got = t.metadata;
        for (const auto* md : {&want, &got}) {
          for (const auto& kv : *md) {
            if (key.empty() && value(want, kv.first) != value(got, kv.first)) {
              key = kv.first;
            }
          }
        }
        throw Error(
            ErrorCode::InvalidArgument,
            fmt::format("{}: {} is {} but {} has {}: the files come from different runs", file, key,
                        value(t.metadata, key), source.front(), value(want, key)));
      }
      for (std::size_t i = 0; i < merged.size(); ++i) {
        COMMTRACE_CHECK(merged[i].rank != t.rank, ErrorCode::InvalidArgument,
                        "{}: rank {} is also in {}", file, t.rank, source[i]);
      }
      merged.push_back(std::move(t));
      source.push_back(file);
    }
  }
  std::sort(merged.begin(), merged.end(),
            [](const Trace& x, const Trace& y) { return x.rank < y.rank; });
  write_trace_file(a.out, merged, a.pretty);
  const auto world = merged.front().metadata.find("world_size");
  fmt::print("wrote {}: {} rank{} of a world of {} from {} file{}\n", a.out, merged.size(),
             merged.size() == 1 ? "" : "s",
             world == merged.front().metadata.end() ? "?" : world->second, a.files.size(),
             a.files.size() == 1 ? "" : "s");
  return 0;
}

struct CheckArgs {
  std::string trace, baseline;
  bool update = false;
  int rank = 0;
  std::string format = "text";
  std::string tolerance = "0";
};

// "5%" or "0.05": a non-negative fraction.
double parse_tolerance(const std::string& s) {
  const bool percent = !s.empty() && s.back() == '%';
  const std::string num = percent ? s.substr(0, s.size() - 1) : s;
  char* end = nullptr;
  const double v = std::strtod(num.c_str(), &end);
  COMMTRACE_CHECK(!num.empty() && end == num.c_str() + num.size() && std::isfinite(v),
                  ErrorCode::InvalidArgument, "--tolerance: '{}' is not a number or percentage", s);
  const double f = percent ? v / 100 : v;
  COMMTRACE_CHECK(f >= 0, ErrorCode::InvalidArgument, "--tolerance: {} must not be negative", s);
  return f;
}

int cmd_check(CheckArgs& c) {
  const std::vector<Trace> traces = load_traces(c.trace);
  const Trace& t = pick_rank(traces, c.rank, c.trace);
  if (c.update) {
    write_text_file(c.baseline, make_baseline(t));
    fmt::print("wrote baseline {} from {}\n", c.baseline, c.trace);
    return 0;
  }
  CheckOptions o;
  o.tolerance = parse_tolerance(c.tolerance);
  const CheckResult r = check_baseline(t, read_text_file(c.baseline, "baseline"), c.baseline, o);
  if (c.format == "json") {
    fmt::print("{}", check_json(r, c.trace, c.baseline));
    return r.ok ? 0 : 1;
  }
  for (const std::string& n : r.notes) fmt::print("note: {}\n", n);
  if (r.ok) {
    fmt::print("OK: {} matches baseline {}\n", c.trace, c.baseline);
    return 0;
  }
  fmt::print("FAIL: {} differs from baseline {}:\n", c.trace, c.baseline);
  for (const Mismatch& d : r.differences) fmt::print("  {}\n", d.str());
  return 1;
}

}  // namespace
}  // namespace commtrace

namespace {

using commtrace::print_error;

// Exit status when stdout could not be written: 2 with the reason (a closed pipe ends the
// process by SIGPIPE before this, as `| head` users expect).
int stdout_failed() noexcept {
  const int err = errno;
  print_error("error: cannot write to standard output: ", std::strerror(err));
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace commtrace;
  // Past a file-size limit (ulimit -f) a write fails with EFBIG, reported and cleaned up like a
  // full disk, instead of SIGXFSZ killing the process with a temporary file left behind.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{
      "commtrace: a communication-trace debugger for tensor- and sequence-parallel models"};
  app.set_version_flag("--version", std::string("commtrace ") + COMMTRACE_VERSION);
  app.require_subcommand(1);

  auto* models = app.add_subcommand("models", "List the model zoo: parameters and inputs");

  TrainArgs train_args;
  auto* train_cmd =
      app.add_subcommand("train", "Train a zoo model on one device, printing the loss");
  train_cmd->add_option("--model", train_args.opts.model, "Model (zoo name or model JSON)")
      ->capture_default_str();
  train_cmd->add_option("--steps", train_args.opts.steps, "Training steps")
      ->capture_default_str()
      ->check(whole_number(0, 1000000));
  train_cmd->add_option("--lr", train_args.opts.lr, "Learning rate")
      ->capture_default_str()
      ->check(positive_finite());
  train_cmd->add_option("--optimizer", train_args.opts.optimizer, "adamw or sgd")
      ->capture_default_str()
      ->check(one_of({"adamw", "sgd"}));
  train_cmd->add_option("--device", train_args.device, "cpu, cuda, or meta (shapes only)")
      ->capture_default_str()
      ->check(one_of({"cpu", "cuda", "meta"}));
  train_cmd->add_option("--dtype", train_args.dtype, "f32, f64, or bf16 (f32 accumulation)")
      ->capture_default_str()
      ->check(one_of({"f32", "f64", "bf16"}));
  train_cmd->add_flag("--allow-tf32", train_args.allow_tf32,
                      "f32 GEMMs on cuda may use TF32 tensor cores; no effect on cpu");
  train_cmd->add_option("--seed", train_args.opts.seed, "Seed of weights and batch")
      ->capture_default_str()
      ->check(whole_number(0, kMaxSeed));

  RunArgs run_args;
  run_args.p.cfg.model = "transformer";
  run_args.p.cfg.world_size = 4;
  auto* run_cmd = app.add_subcommand(
      "run", "Train K iterations in parallel under the tracer; print the collectives");
  run_args.p.add_to(run_cmd);
  run_args.view.add_to(run_cmd);
  run_cmd->add_option("--iters", run_args.iters, "Training iterations")
      ->capture_default_str()
      ->check(whole_number(1, 1000000));
  add_timing_options(run_cmd, run_args.timing);
  run_cmd->add_option("--device", run_args.p.device, "cpu, cuda, or meta (with --backend fake)")
      ->capture_default_str()
      ->check(one_of({"cpu", "cuda", "meta"}));
  run_cmd
      ->add_option("--backend", run_args.backend,
                   "threads (real data), fake (records only), mpi (one process per rank, under "
                   "mpirun) or nccl (one GPU per rank; --device cuda)")
      ->capture_default_str()
      ->check(one_of({"threads", "fake", "mpi", "nccl"}));
  run_cmd->add_option("--rank", run_args.rank, "Rank to show, or 'all' (checks consistency)")
      ->capture_default_str();
  run_cmd->add_option("--lr", run_args.lr, "AdamW learning rate")
      ->capture_default_str()
      ->check(positive_finite());
  run_cmd->add_option("--json", run_args.json,
                      "Write commtrace's trace JSON (all traced ranks); - for standard output");
  run_cmd->add_flag("--pretty", run_args.pretty, "Indent the --json file (compact by default)");
  run_cmd->add_option("--per-rank-files", run_args.per_rank_dir,
                      "Also write each traced rank's trace to DIR/rank-<r>.json (join: merge)");
  run_cmd->add_option("--torch-json", run_args.torch_json,
                      "Write PyTorch's generate_json_dump format (at --noise); - for standard "
                      "output");
  run_cmd->add_option("--expect", run_args.expect,
                      "Expected per-iteration count, e.g. forward.all_reduce=1 (repeatable)");

  VerifyArgs verify_args;
  auto* verify_cmd = app.add_subcommand(
      "verify",
      "Run a model in parallel (threads, mpi or nccl backend) and on one device; compare");
  verify_args.p.add_to(verify_cmd);
  verify_cmd
      ->add_option("--backend", verify_args.p.cfg.backend,
                   "threads, mpi (one process per rank, under mpirun), or nccl (one GPU per "
                   "rank; --device cuda)")
      ->capture_default_str()
      ->check(one_of({"threads", "mpi", "nccl"}));
  verify_cmd
      ->add_option("--device", verify_args.p.device,
                   "cpu or cuda (the ranks and the one-device reference both run there)")
      ->capture_default_str()
      ->check(one_of({"cpu", "cuda"}));
  verify_args.tolerance_opt =
      verify_cmd
          ->add_option("--tolerance", verify_args.tolerance,
                       fmt::format("Max relative error (default: {:.0e} for f32 and f64, {:.0e} "
                                   "for bf16, {:.0e} for f32 with --allow-tf32; in f32 at least "
                                   "world size x 2^-23)",
                                   default_tolerance(DType::F32, false),
                                   default_tolerance(DType::BF16, false),
                                   default_tolerance(DType::F32, true)))
          ->check(positive_finite());

  ShowArgs show_args;
  auto* show_cmd = app.add_subcommand("show", "Render a saved trace (ours or a PyTorch dump)");
  show_cmd->add_option("file", show_args.file, "Trace JSON")->required();
  show_cmd->add_option("--rank", show_args.rank, "Rank to show, or 'all' (checks consistency)")
      ->capture_default_str()
      ->check([](const std::string& v) -> std::string {
        if (v == "all") return {};
        char* end = nullptr;
        const long r = std::strtol(v.c_str(), &end, 10);
        return end != v.c_str() && *end == '\0' && r >= 0 && r < 4096
                   ? std::string()
                   : "must be a rank in [0, 4096) or all, got " + v;
      });
  show_args.view.add_to(show_cmd);

  DiffArgs diff_args;
  auto* diff_cmd = app.add_subcommand(
      "diff", "Collective counts and bytes that differ per module and phase (exit 1 if any)");
  diff_cmd->add_option("a", diff_args.a, "Trace JSON (ours or a PyTorch dump)")->required();
  diff_cmd->add_option("b", diff_args.b, "Trace JSON (ours or a PyTorch dump)")->required();
  diff_cmd->add_option("--rank", diff_args.rank, "Rank to compare")->capture_default_str();
  diff_cmd->add_option("--format", diff_args.format, "text, or json for scripts")
      ->capture_default_str()
      ->check(one_of({"text", "json"}));
  add_topology_option(diff_cmd, diff_args.topology);
  diff_cmd->add_option("--depth", diff_args.depth,
                       "Compare modules down to this depth (0: totals only); default all");

  MergeArgs merge_args;
  auto* merge_cmd = app.add_subcommand(
      "merge", "Join the per-rank trace files of one run (run --per-rank-files) into one");
  merge_cmd->add_option("files", merge_args.files, "Per-rank trace JSON files")->required();
  merge_cmd->add_option("-o,--output", merge_args.out, "The merged trace JSON")->required();
  merge_cmd->add_flag("--pretty", merge_args.pretty, "Indent the output (compact by default)");

  ImportArgs import_args;
  auto* import_cmd = app.add_subcommand("import", "Read another tool's traces into a trace file");
  import_cmd->require_subcommand(1);
  auto* kineto_cmd = import_cmd->add_subcommand(
      "kineto", "PyTorch profiler traces (torch.profiler's Chrome trace JSON, one file per rank)");
  kineto_cmd->add_option("paths", import_args.paths, "Trace files, or folders of them")->required();
  kineto_cmd->add_option("-o,--output", import_args.out, "The commtrace trace JSON")->required();
  kineto_cmd->add_option("--model", import_args.model,
                         "Name the run's model (trace headers; check matches baselines by it)");
  kineto_cmd->add_option("--plan", import_args.plan, "Name the run's plan, as --model");
  kineto_cmd->add_option("--group-name", import_args.group_names,
                         "Rename a process group, OLD=NEW (e.g. default_pg=tp, as a commtrace "
                         "baseline names it); repeatable");
  kineto_cmd->add_flag("--pretty", import_args.pretty, "Indent the output (compact by default)");

  CheckArgs check_args;
  auto* check_cmd =
      app.add_subcommand("check", "Compare a trace with a CI baseline (exit 1 on any change)");
  check_cmd->add_option("trace", check_args.trace, "Trace JSON")->required();
  check_cmd->add_option("--baseline", check_args.baseline, "Baseline JSON")->required();
  check_cmd->add_flag("--update", check_args.update, "Write the baseline from the trace");
  check_cmd->add_option("--rank", check_args.rank, "Rank to check")->capture_default_str();
  check_cmd
      ->add_option("--tolerance", check_args.tolerance,
                   "How far bytes may stray from the baseline's: a fraction (0.05) or 5%")
      ->capture_default_str();
  check_cmd->add_option("--format", check_args.format, "text, or json for scripts")
      ->capture_default_str()
      ->check(one_of({"text", "json"}));

  ReportArgs report_args;
  auto* report_cmd = app.add_subcommand(
      "report", "Write a self-contained HTML report of a trace, or of two side by side");
  report_cmd->add_option("traces", report_args.files, "One trace JSON, or two to compare")
      ->required();
  report_cmd->add_option("-o,--output", report_args.out, "The HTML file")->required();
  report_cmd->add_option("--rank", report_args.rank, "Rank to show")->capture_default_str();
  add_topology_option(report_cmd, report_args.topology);
  report_cmd->get_option("--topology")->capture_default_str();

  AdviseArgs advise_args;
  auto* advise_cmd = app.add_subcommand(
      "advise", "Rank every plan of a model by estimated comm time and peak memory per rank");
  advise_cmd->add_option("--model", advise_args.model, "Zoo model or model JSON file")
      ->capture_default_str();
  advise_cmd->add_option("--world-size", advise_args.world_size, "Ranks")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  advise_cmd->add_option("--mesh", advise_args.mesh,
                         "DPxTP (the plan on tp, data parallel on dp), or all: every DPxTP split");
  advise_cmd->add_option("--data-parallel", advise_args.data_parallel, "ddp or fsdp on dp")
      ->capture_default_str()
      ->check(one_of({"ddp", "fsdp"}));
  advise_cmd->add_option("--plan", advise_args.plans, "A plan file to rank too (repeatable)");
  add_topology_option(advise_cmd, advise_args.topology);
  advise_cmd->get_option("--topology")->capture_default_str();
  advise_cmd->add_option("--format", advise_args.format, "text, or json for scripts")
      ->capture_default_str()
      ->check(one_of({"text", "json"}));

  BenchArgs bench_args;
  auto* bench_cmd =
      app.add_subcommand("bench", "Measure tracing cost and the threads backend's bandwidth");
  bench_cmd->require_subcommand(1);
  auto* bench_step_cmd = bench_cmd->add_subcommand(
      "step", "A training step untraced and traced, interleaved: the cost of tracing");
  bench_args.p.cfg.model = "transformer";
  bench_args.p.cfg.world_size = 4;
  bench_args.p.add_to(bench_step_cmd);
  bench_step_cmd
      ->add_option("--device", bench_args.p.device, "cpu, cuda, or meta (with --backend fake)")
      ->capture_default_str()
      ->check(one_of({"cpu", "cuda", "meta"}));
  bench_step_cmd->add_option("--backend", bench_args.backend, "threads, fake, or nccl (cuda)")
      ->capture_default_str()
      ->check(one_of({"threads", "fake", "nccl"}));
  bench_step_cmd->add_option("--rank", bench_args.rank, "Ranks traced: all, or 0")
      ->capture_default_str();
  bench_step_cmd->add_option("--steps", bench_args.step.steps, "Traced steps per round")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  bench_step_cmd->add_option("--rounds", bench_args.step.rounds, "Rounds, each on a new tracer")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  add_timing_options(bench_step_cmd, bench_args.step.timing);
  auto* bench_ar_cmd = bench_cmd->add_subcommand(
      "allreduce", "A backend's all_reduce bus bandwidth (threads or mpi) against memcpy");
  bench_ar_cmd->add_option("--world-size", bench_args.ar_world, "Ranks (nccl: from 1)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  bench_ar_cmd
      ->add_option("--backend", bench_args.ar_backend,
                   "threads, mpi (under mpirun: one rank per process), or nccl (--device cuda)")
      ->capture_default_str()
      ->check(one_of({"threads", "mpi", "nccl"}));
  bench_ar_cmd->add_option("--device", bench_args.ar_device, "cpu or cuda")
      ->capture_default_str()
      ->check(one_of({"cpu", "cuda"}));
  bench_ar_cmd->add_option("--mib", bench_args.mib, "Buffer size in MiB")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 4096.0));
  bench_ar_cmd->add_option("--rounds", bench_args.rounds, "All-reduces (medians)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    print_error("error: ", with_suggestion(app, e).c_str());
    std::fputs("Run with --help for more information.\n", stderr);
    return 2;
  }
  int rc = 0;
  try {
    if (*models) rc = cmd_models();
    if (*train_cmd) rc = cmd_train(train_args);
    if (*run_cmd) rc = cmd_run(run_args);
    if (*verify_cmd) rc = cmd_verify(verify_args);
    if (*show_cmd) rc = cmd_show(show_args);
    if (*diff_cmd) rc = cmd_diff(diff_args);
    if (*check_cmd) rc = cmd_check(check_args);
    if (*merge_cmd) rc = cmd_merge(merge_args);
    if (*kineto_cmd) rc = cmd_import_kineto(import_args);
    if (*advise_cmd) rc = cmd_advise(advise_args);
    if (*report_cmd) rc = cmd_report(report_args);
    if (*bench_step_cmd) rc = cmd_bench_step(bench_args);
    if (*bench_ar_cmd) rc = cmd_bench_allreduce(bench_args);
  } catch (const Error& e) {
    print_error("error: ", e.what());
    return 2;
  } catch (const std::exception& e) {
    if (std::ferror(stdout)) return stdout_failed();
    print_error("internal error: ", e.what());
    return 2;
  }
  // Buffered output is written here: a write that fails (a full disk) is an error, not success.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) return stdout_failed();
  return rc;
}
