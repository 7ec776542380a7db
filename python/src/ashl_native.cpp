// ashl._ashl — the pybind11 core of `import ashl` (docs/torch.md, "Python"):
// ps::worker and ps::server over UCX or inproc, the runtime contract
// (ps/launch.hpp), plans and telemetry as Python objects, and the adapters'
// shared rules: the update builder (adapt/update_builder.hpp), the bucket
// cycle and the top-k payload layout (rules_bindings.hpp). The torch side
// (ashl/torch.py) flattens a model into buckets with torch's own Python API
// and hands this module plain float32 buffers (numpy views of the buckets,
// or of their float32 staging), so the module needs no libtorch headers and
// no torch ABI: it works
// with whichever torch the interpreter imports, and a torch upgrade does
// not break it (docs/torch.md, "Python").
//
// Errors at the boundary are Python exceptions carrying ashl's message
// ("worker.timeout_ms = 300: passed while ..."): invalid arguments raise
// ValueError, a wait that passed its bound TimeoutError, anything else
// RuntimeError. Blocking calls (create, commit, wait, leave, run, the
// update builder's passes) release the GIL.
#include <ashl/config.hpp>
#include <ashl/adapt/trace.hpp>
#include <ashl/adapt/update_builder.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>
#include <ashl/ps/launch.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/rules/streaming.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/transport/inproc.hpp>
#if ASHL_HAS_UCX()
#include <ashl/transport/ucx.hpp>
#endif

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <thread>
#include <variant>
#include <vector>

namespace py = pybind11;
namespace ps = ashl::ps;
namespace tr = ashl::transport;

namespace {

[[noreturn]] void raise(const ashl::status& s) {
  switch (s.code()) {
    case ashl::errc::invalid_argument:
    case ashl::errc::out_of_range:
    case ashl::errc::not_found:
      throw py::value_error(s.message());
    case ashl::errc::timed_out:
      PyErr_SetString(PyExc_TimeoutError, s.message().c_str());
      throw py::error_already_set();
    default:
      throw std::runtime_error(s.message());
  }
}

void check(const ashl::status& s) {
  if (!s) raise(s);
}

// Seconds from Python as milliseconds, within ps::max_duration_seconds
// (timeout=1e300 was an out-of-range llround: a timeout of -2^63 ms).
std::chrono::milliseconds millis(double seconds, const char* field) {
  auto d = ps::checked_millis(field, seconds);
  if (!d) raise(d.error());
  return *d;
}

// A 1-D float32 array the module writes into or reads from in place: the
// caller's buffer, never a converted copy (a copy would break the views).
using f32_array = py::array_t<float, 0>;  // no forcecast: wrong dtypes are refused, not converted

std::span<float> buffer_of(const py::array& a, const char* field, bool writable) {
  if (!py::isinstance<py::array_t<float>>(a) || a.dtype().kind() != 'f' || a.itemsize() != 4)
    raise(ashl::invalid_argument(std::string(field) + ".dtype", std::string(py::str(a.dtype())),
                                 "must be float32"));
  if (a.ndim() != 1) raise(ashl::invalid_argument(std::string(field) + ".ndim", a.ndim(), "must be 1 (a flat bucket)"));
  if (a.ndim() == 1 && a.shape(0) > 1 && a.strides(0) != static_cast<py::ssize_t>(sizeof(float)))
    raise(ashl::invalid_argument(std::string(field) + ".stride", a.strides(0),
                                 "must be 4 bytes (a contiguous buffer)"));
  if (writable && !a.writeable())
    raise(ashl::invalid_argument(std::string(field) + ".writeable", "false", "the worker writes into it"));
  return {static_cast<float*>(const_cast<void*>(a.data())), static_cast<std::size_t>(a.shape(0))};
}

// -------------------------------------------------------------- the job

py::dict job_dict(const ps::job& j) {
  py::dict d;
  d["role"] = std::string(ps::to_string(j.role));
  d["rank"] = j.rank;
  d["num_workers"] = j.num_workers;
  d["max_workers"] = j.max_workers;
  d["num_servers"] = j.num_servers;
  d["server_addresses"] = j.server_addresses;
  d["backup_addresses"] = j.backup_addresses;  // ASHL_BACKUP_ADDR (docs/elastic.md §4.6)
  d["replica"] = j.replica;
  d["token"] = j.token;
  d["insecure"] = j.insecure;
  d["verbose"] = j.verbose;
  d["progress_seconds"] = j.progress_seconds;
  d["name"] = j.name;
  d["no_worker_grace"] = j.no_worker_grace_seconds;
  d["rest"] = j.rest;
  return d;
}

// The runtime contract from the environment and `argv` (flags win).
py::dict job_from(std::vector<std::string> argv) {
  if (argv.empty()) argv.push_back("python");
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  auto j = ps::job_from(static_cast<int>(argv.size()), args.data());
  if (!j) raise(j.error());
  return job_dict(*j);
}

// -------------------------------------------------------------- plans

// A described struct (core/fields.hpp) as a dict, read off its field table:
// nested tables become dicts, arrays lists, a stage its name. Nothing here
// lists fields by hand, so a counter added to a struct reaches Python.
template <class T>
py::object to_py(const T& v);

template <ashl::described S>
py::dict fields_dict(const S& s) {
  py::dict d;
  ashl::for_each_field(s, [&](std::string_view name, const auto& v) { d[py::str(std::string(name))] = to_py(v); });
  return d;
}

template <class T>
py::object to_py(const T& v) {
  if constexpr (ashl::described<T>) {
    return fields_dict(v);
  } else if constexpr (std::is_same_v<T, ashl::stage_id>) {
    return py::str(std::string(ashl::to_string(v)));
  } else if constexpr (requires { std::tuple_size<T>::value; v.begin(); }) {
    py::list l;
    for (const auto& x : v) l.append(to_py(x));
    return l;
  } else {
    return py::cast(v);
  }
}

py::dict plan_dict(const ashl::worker_plan& p) { return fields_dict(p); }

py::dict worker_telemetry_dict(const ps::worker_telemetry& t) { return fields_dict(t); }

// Derived totals beside the per-reason lists.
py::dict server_telemetry_dict(const ps::server_telemetry& t) {
  py::dict d = fields_dict(t);
  py::dict core = d["core"];
  core["refused"] = t.core.refused_total();
  d["wire_refused"] = t.wire_refused_total();
  // Per reason by name (ps::refusal, wire_refusal), beside the tables' order.
  py::dict by_reason, wire_by_reason;
  for (std::size_t r = 0; r < ps::refusal_count; ++r)
    by_reason[py::str(std::string(ps::to_string(static_cast<ps::refusal>(r))))] = t.core.refused[r];
  for (std::size_t r = 0; r < ps::wire_refusal_count; ++r)
    wire_by_reason[py::str(std::string(ps::to_string(static_cast<ps::wire_refusal>(r))))] = t.wire_refused[r];
  core["refused_by_reason"] = by_reason;
  d["wire_refused_by_reason"] = wire_by_reason;
  return d;
}

// (name, help) of every field of a described struct, in table order.
template <ashl::described S>
py::list field_help() {
  py::list l;
  ashl::for_each_field_of<S>([&](const auto& fd) {
    l.append(py::make_tuple(std::string(fd.name), std::string(fd.help)));
  });
  return l;
}

// -------------------------------------------------------------- policies

// policy_params from a dict of its field names (ps::policy_params); an
// unknown name or a value of the wrong type is named.
ps::policy_params policy_params_from(const py::dict& d) {
  ps::policy_params p;
  for (auto [k, v] : d) {
    const std::string name = py::str(k);
    if (!ashl::has_field<ps::policy_params>(name))
      raise(ashl::invalid_argument("policy." + name, std::string(py::repr(v)), "unknown policy parameter (known: " +
                                                                                  ashl::field_names<ps::policy_params>() + ")"));
    bool bad_type = false;
    ashl::for_each_field(p, [&](std::string_view field, auto& value) {
      if (field != name) return;
      using T = std::decay_t<decltype(value)>;
      try {
        // bool is an int in Python: refuse it for numbers, and numbers for bool.
        if constexpr (std::is_same_v<T, bool>) {
          if (!py::isinstance<py::bool_>(v)) throw py::cast_error();
        } else if constexpr (std::is_arithmetic_v<T>) {
          if (py::isinstance<py::bool_>(v)) throw py::cast_error();
          if constexpr (std::is_integral_v<T>)
            if (!py::isinstance<py::int_>(v)) throw py::cast_error();
        }
        value = v.template cast<T>();
      } catch (const py::cast_error&) {
        bad_type = true;
      }
    });
    if (bad_type) raise(ashl::invalid_argument("policy." + name, std::string(py::repr(v)), "has the wrong type"));
  }
  return p;
}

// -------------------------------------------------------------- worker

// One interface over ps::worker<ucx> and ps::worker<inproc>.
struct any_worker {
  virtual ~any_worker() = default;
  virtual bool iteration_done() = 0;
  virtual bool iteration_done(std::uint64_t samples) = 0;
  virtual std::vector<ps::ledger_lease> leases() const = 0;
  virtual std::pair<std::uint64_t, std::uint64_t> ledger() const = 0;
  virtual bool test() = 0;
  virtual ashl::status commit(std::span<const float>) = 0;
  virtual ashl::status push(std::span<const float>) = 0;
  virtual ashl::status pull() = 0;
  virtual ashl::status wait() = 0;
  virtual std::optional<ashl::status> wait_for(std::chrono::microseconds slice, bool first) = 0;
  virtual ashl::status leave() = 0;
  virtual ashl::status report_metric(ashl::metric_id, double) = 0;
  virtual ashl::worker_plan plan() const = 0;
  virtual std::uint32_t batch() const = 0;
  virtual ashl::codec_id codec() const = 0;
  virtual std::uint64_t staleness() const = 0;
  virtual std::uint64_t incarnation() const = 0;
  virtual ps::worker_telemetry telemetry() const = 0;
  virtual std::string progress_line() const = 0;
  virtual ps::plan_in_force current_plan() const = 0;
  virtual bool compresses() const = 0;
  virtual ashl::status commit_encoded(std::span<const std::span<const std::byte>>) = 0;
  virtual std::vector<std::pair<std::size_t, std::size_t>> shard_ranges() const = 0;
  virtual bool follow(const ps::plan_in_force&, bool, std::uint64_t samples) = 0;
  virtual std::vector<ashl::measurement> reported_measurements() const = 0;
  virtual ashl::status report_measurements(std::span<const ashl::measurement>) = 0;
};

// A leader's measurements, handed to its followers (opaque in Python).
struct measurements {
  std::vector<ashl::measurement> m;
};

template <class T>
struct worker_of final : any_worker {
  ps::worker<T> w;
  explicit worker_of(ps::worker<T>&& x) : w(std::move(x)) {}
  bool iteration_done() override { return w.iteration_done(); }
  bool iteration_done(std::uint64_t samples) override { return w.iteration_done(samples); }
  std::vector<ps::ledger_lease> leases() const override { return w.leases(); }
  std::pair<std::uint64_t, std::uint64_t> ledger() const override {
    return {w.ledger_samples(), w.ledger_shuffle_seed()};
  }
  bool test() override { return w.test(); }
  ashl::status commit(std::span<const float> u) override { return w.commit(u); }
  ashl::status push(std::span<const float> u) override { return w.push(u); }
  ashl::status pull() override { return w.pull(); }
  ashl::status wait() override { return w.wait(); }
  std::optional<ashl::status> wait_for(std::chrono::microseconds slice, bool first) override {
    return w.wait_for(slice, first);
  }
  ashl::status leave() override { return w.leave(); }
  ashl::status report_metric(ashl::metric_id m, double v) override { return w.report_metric(m, v); }
  ashl::worker_plan plan() const override { return w.plan(); }
  std::uint32_t batch() const override { return w.batch(); }
  ashl::codec_id codec() const override { return w.codec(); }
  std::uint64_t staleness() const override { return w.staleness(); }
  std::uint64_t incarnation() const override { return w.incarnation(); }
  ps::worker_telemetry telemetry() const override { return w.telemetry(); }
  std::string progress_line() const override { return w.progress_line(); }
  ps::plan_in_force current_plan() const override { return w.current_plan(); }
  bool compresses() const override { return w.compresses(); }
  ashl::status commit_encoded(std::span<const std::span<const std::byte>> p) override { return w.commit_encoded(p); }
  std::vector<std::pair<std::size_t, std::size_t>> shard_ranges() const override {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (std::uint32_t s = 0; s < w.layout().servers(); ++s)
      out.emplace_back(w.layout().range(s).begin, w.layout().range(s).size());
    return out;
  }
  bool follow(const ps::plan_in_force& p, bool done, std::uint64_t samples) override {
    return w.iteration_done(p, done, samples);  // ~0: the batch
  }
  std::vector<ashl::measurement> reported_measurements() const override { return w.reported_measurements(); }
  ashl::status report_measurements(std::span<const ashl::measurement> m) override { return w.report_measurements(m); }
};

struct fabric {
  std::shared_ptr<tr::inproc_fabric> f;
};

// f() without the GIL (a call that takes a worker's or server's lock).
template <class F>
auto unlocked(F f) {
  py::gil_scoped_release nogil;
  return f();
}

class py_worker {
 public:
  py_worker(py::array parameters, std::vector<std::string> servers, std::uint32_t rank, std::uint32_t batch,
            double timeout, std::uint64_t seed, bool error_feedback, double link_bytes_per_second, double reconnect,
            double progress_seconds, std::string token, bool insecure, bool verbose, std::optional<fabric> inproc,
            std::uint64_t incarnation, std::uint64_t job, bool follower, py::object link,
            std::uint64_t commit_part_bytes, std::uint32_t commit_window, bool allow_non_finite,
            bool trust_local_lanes, std::vector<std::string> backups)
      : link_(std::move(link)), params_obj_(parameters) {
    const auto w = buffer_of(parameters, "parameters", true);
    ps::worker_params p{.rank = rank,
                        .servers = std::move(servers),
                        .batch = batch,
                        .incarnation = incarnation,
                        .job = job,
                        .timeout = millis(timeout, "worker.timeout"),
                        .seed = seed,
                        .progress_seconds = progress_seconds,
                        .error_feedback = error_feedback,
                        .link_bytes_per_second = link_bytes_per_second,
                        .reconnect = millis(reconnect, "worker.reconnect"),
                        .follower = follower};
    p.commit_part_bytes = commit_part_bytes;  // refused by name by worker::create (0, or >= 4096)
    p.commit_window = commit_window;          // likewise (1 .. wire::max_parts_in_flight)
    p.allow_non_finite = allow_non_finite;    // the servers' (rules/commit_check.hpp: a commit is checked whole)
    p.trust_local_lanes = trust_local_lanes;  // the servers' (docs/ps.md "Lanes without CRC")
    p.backups = std::move(backups);           // each shard's backup, "" none (docs/elastic.md §4.5)
    if (!link_.is_none()) {
      if (!PyCallable_Check(link_.ptr()))
        raise(ashl::invalid_argument("worker.link", py::str(py::type::of(link_)).cast<std::string>(),
                                     "must be callable as link(direction, bytes) or None"));
      // Called from commit() and wait(), which released the GIL. The
      // capture is `this` (link_ lives here), so the function copies
      // without touching Python; an exception is kept and raised by the
      // call that ran the hold.
      p.link_hold = [this](ps::link_direction d, std::uint64_t bytes) {
        py::gil_scoped_acquire gil;
        try {
          link_(d == ps::link_direction::up ? "up" : "down", bytes);
        } catch (py::error_already_set& e) {
          if (link_error_.empty()) link_error_ = e.what();
        }
      };
    }
    if (p.timeout.count() == 0) raise(ashl::invalid_argument("worker.timeout", timeout, "must be > 0 seconds"));
    ashl::status failed;
    {
      py::gil_scoped_release nogil;
      if (inproc) {
        auto node = inproc->f->node();
        if (!node) failed = node.error();
        else failed = make(ps::worker<tr::inproc>::create(std::move(p), std::move(*node), w));
      } else {
#if ASHL_HAS_UCX()
        auto t = tr::ucx::create({.token = token, .insecure = insecure, .verbose = verbose});
        if (!t) failed = t.error();
        else failed = make(ps::worker<tr::ucx>::create(std::move(p), std::move(*t), w));
#else
        (void)token, (void)insecure, (void)verbose;
        failed = ashl::make_error(ashl::errc::unavailable, "worker.transport", "ucx",
                                  "this build of ashl has no UCX (libucx-dev); use an InprocFabric");
#endif
      }
    }
    check(failed);
  }

  // Every call that takes the worker's lock releases the GIL first: a
  // `link` hold runs under that lock and takes the GIL (another thread
  // holding the GIL while it waits for the lock would deadlock them), and a
  // communication thread holds the lock through a commit.
  // samples: what the iteration trained (docs/elastic.md §3.6; a data
  // ledger's last batch may be short); None: the cycle's batch.
  bool iteration_done(std::optional<std::uint64_t> samples) {
    py::gil_scoped_release nogil;
    return samples ? w_->iteration_done(*samples) : w_->iteration_done();
  }
  // The data ledger's leases server 0 sent this worker and its commits have
  // not covered (ps::worker::leases), as dicts: number, epoch, begin, end,
  // flags (1 epoch_end, 2 resent).
  py::list leases() const {
    const auto ls = unlocked([&] { return w_->leases(); });
    py::list out;
    for (const auto& l : ls) {
      py::dict d;
      d["number"] = l.number;
      d["epoch"] = l.epoch;
      d["begin"] = l.begin;
      d["end"] = l.end;
      d["flags"] = l.flags;
      out.append(std::move(d));
    }
    return out;
  }
  // (N, shuffle_seed) of the ledger's leases; (0, 0) before the first.
  std::pair<std::uint64_t, std::uint64_t> ledger() const { return unlocked([&] { return w_->ledger(); }); }
  // One progress pass of the transport without blocking (a caller that
  // waits for a lease between cycles); true when nothing is pending.
  bool progress() { return unlocked([&] { return w_->test(); }); }
  ps::plan_in_force current_plan() const {
    py::gil_scoped_release nogil;
    return w_->current_plan();
  }
  bool compresses() const {
    py::gil_scoped_release nogil;
    return w_->compresses();
  }
  std::vector<std::pair<std::size_t, std::size_t>> shard_ranges() const { return w_->shard_ranges(); }
  // Payloads the caller encoded (one uint8 array per shard, of codec at the
  // plan's ratio): ashl.torch encodes a CUDA bucket's top-k on the device.
  void commit_encoded(std::vector<py::array> payloads) {
    std::vector<std::span<const std::byte>> spans;
    for (auto& a : payloads) {
      if (a.dtype().itemsize() != 1 || !(a.flags() & py::array::c_style))
        raise(ashl::invalid_argument("worker.commit_encoded.payload", "dtype", "must be a contiguous uint8 array"));
      spans.emplace_back(static_cast<const std::byte*>(a.data()), static_cast<std::size_t>(a.nbytes()));
    }
    ashl::status s;
    {
      py::gil_scoped_release nogil;
      s = w_->commit_encoded(spans);
    }
    check(s);
    update_obj_ = py::cast(payloads);  // sent from until wait() returns (and again after a reconnect)
  }
  bool follow(const ps::plan_in_force& leader, bool leader_done, std::optional<std::uint64_t> samples) {
    py::gil_scoped_release nogil;
    // A plan it cannot run fails it: commit() says so.
    return w_->follow(leader, leader_done, samples ? *samples : ~std::uint64_t{0});
  }
  measurements reported_measurements() const {
    py::gil_scoped_release nogil;
    return {w_->reported_measurements()};
  }
  void report_measurements(const measurements& m) {
    ashl::status s;
    {
      py::gil_scoped_release nogil;
      s = w_->report_measurements(m.m);
    }
    check(s);
  }

  void commit(py::array update) { send(std::move(update), false); }
  // commit() without the parameters back (ps::worker::push): each server
  // acknowledges once its policy releases the worker; pull() fetches them.
  void push(py::array update) { send(std::move(update), true); }
  void send(py::array update, bool ack_only) {
    const auto u = buffer_of(update, "update", false);
    ashl::status s;
    {
      // An emulated link holds the commit here, and an ashl.torch
      // communication thread commits while backward runs: no GIL.
      py::gil_scoped_release nogil;
      s = ack_only ? w_->push(u) : w_->commit(u);
    }
    check_link();
    check(s);
    update_obj_ = update;  // the worker sends from it until wait() returns
  }
  void pull() {
    ashl::status s;
    {
      py::gil_scoped_release nogil;
      s = w_->pull();
    }
    check(s);
  }
  // On the main thread: drives the transport in slices of 100 ms without
  // the GIL and checks for signals between them, so Ctrl-C raises
  // KeyboardInterrupt within a slice and the worker is as it was (the
  // commit still in flight: wait() again takes it up, or drop the worker).
  // Another thread (ashl.torch's communication threads) cannot receive
  // signals: it waits in one piece, never stopping to take the GIL back.
  void wait() {
    ashl::status s;
    if (on_main_thread()) {
      s = wait_in_slices();
    } else {
      py::gil_scoped_release nogil;
      s = w_->wait();
    }
    // The update is no longer read once the commit completed; after a failure
    // the transport may still send from it, so it is kept until the worker
    // (its transport) is gone.
    if (s.ok()) update_obj_ = py::none();
    check_link();
    check(s);
  }
  void leave() {
    ashl::status s;
    {
      py::gil_scoped_release nogil;
      s = w_->leave();
    }
    check(s);
  }
  void report_metric(const std::string& name, double v) {
    for (std::uint32_t i = 0; i < ashl::metric_id_count; ++i) {
      const auto m = static_cast<ashl::metric_id>(i);
      if (ashl::to_string(m) == name) return check(unlocked([&] { return w_->report_metric(m, v); }));
    }
    raise(ashl::invalid_argument("metric", name, "must be loss, accuracy, samples_per_second or iteration_seconds"));
  }
  py::dict plan() const { return plan_dict(unlocked([&] { return w_->plan(); })); }
  std::uint32_t batch() const { return unlocked([&] { return w_->batch(); }); }
  // The codec with the plan's options, canonical (ps::to_string(codec_spec)):
  // "topk", "block4:64", "qsgd:256".
  std::string codec() const {
    return unlocked([&] {
      return ps::to_string(ps::codec_spec{w_->codec(), w_->plan().compression_options()});
    });
  }
  std::uint64_t staleness() const { return unlocked([&] { return w_->staleness(); }); }
  std::uint64_t incarnation() const { return unlocked([&] { return w_->incarnation(); }); }
  py::dict telemetry() const { return worker_telemetry_dict(unlocked([&] { return w_->telemetry(); })); }
  std::string progress_line() const { return unlocked([&] { return w_->progress_line(); }); }

  // The worker and its transport close without the GIL (a UCX close drives
  // the outstanding operations for a while), before the buffers go.
  ~py_worker() {
    py::gil_scoped_release nogil;
    w_.reset();
  }

 private:
  template <class T>
  ashl::status make(ashl::result<ps::worker<T>>&& r) {
    if (!r) return r.error();
    w_ = std::make_unique<worker_of<T>>(std::move(*r));
    return {};
  }

  // Declared before w_, so destroyed after it: the buffers the transport
  // reads (a commit in flight) and writes (stage_replies false: a reply into
  // the parameters) stay alive until the worker's transport is closed, even
  // when Python drops the Worker between commit() and wait().
  py::object link_;         // the emulated link's hold, or None
  py::object params_obj_;   // the parameter buffer the worker writes replies into
  py::object update_obj_ = py::none();  // the update of the commit in flight
  std::string link_error_;  // what link_ raised, raised by the next commit() or wait() (under the GIL)
  std::unique_ptr<any_worker> w_;

  ashl::status wait_in_slices() {
    for (bool first = true;; first = false) {
      std::optional<ashl::status> r;
      {
        py::gil_scoped_release nogil;
        r = w_->wait_for(std::chrono::milliseconds(100), first);
      }
      if (r) return std::move(*r);
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // the commit stays in flight
    }
  }

  // Python runs signal handlers on the main thread only.
  static bool on_main_thread() {
    static const unsigned long main_ident =
        py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
    return PyThread_get_thread_ident() == main_ident;
  }

  void check_link() {
    if (link_error_.empty()) return;
    std::string e;
    e.swap(link_error_);
    throw std::runtime_error("worker.link raised: " + e);
  }
};

// -------------------------------------------------------------- server

struct any_server {
  virtual ~any_server() = default;
  virtual void run(const std::atomic<bool>& stop, const std::function<void()>& between) = 0;
  virtual std::span<const float> parameters() const = 0;
  virtual ps::server_telemetry telemetry() const = 0;
  virtual std::string progress_line() const = 0;
  virtual bool all_left() const = 0;
  virtual ps::server_end end() const = 0;
  virtual ashl::status final_checkpoint() const = 0;
};

template <class T>
struct server_of final : any_server {
  ps::server<T> s;
  explicit server_of(ps::server<T>&& x) : s(std::move(x)) {}
  void run(const std::atomic<bool>& stop, const std::function<void()>& between) override { s.run(stop, between); }
  std::span<const float> parameters() const override { return s.parameters(); }
  ps::server_telemetry telemetry() const override { return s.telemetry(); }
  std::string progress_line() const override { return s.progress_line(); }
  bool all_left() const override { return s.all_left(); }
  ps::server_end end() const override { return s.end(); }
  ashl::status final_checkpoint() const override { return s.final_checkpoint(); }
};

// The data ledger's parameters (ps::ledger_params, docs/elastic.md §3.2)
// from a dict of its fields; an unknown key or a value of another type is
// refused by name. {} (the default): no ledger.
ps::ledger_params ledger_params_from(const py::dict& d) {
  ps::ledger_params p;
  for (auto [k, v] : d) {
    const std::string key = py::str(k);
    bool known = false;
    ashl::for_each_field(p, [&](std::string_view name, auto& field) {
      if (name != key) return;
      known = true;
      try {
        field = v.cast<std::remove_reference_t<decltype(field)>>();
      } catch (const py::cast_error&) {
        raise(ashl::invalid_argument("server.ledger." + key, py::str(v).cast<std::string>(), "has the wrong type"));
      }
    });
    if (!known)
      raise(ashl::invalid_argument("server.ledger", key,
                                   "is not a field (samples, shuffle_seed, lease_samples, ahead, give_back_after, "
                                   "epochs)"));
  }
  return p;
}

class py_server {
 public:
  py_server(std::uint64_t size, std::optional<py::array> initial, std::string policy, py::dict policy_params,
            std::uint32_t workers, std::uint32_t max_workers, std::string listen, std::uint32_t shard,
            std::uint32_t servers, std::string optimizer, double lr, double momentum, double weight_decay, bool nesterov,
            std::uint32_t nesterov_delay, double nesterov_activation, std::string compression, float compression_ratio, std::string token, bool insecure, bool verbose, double worker_timeout,
            double progress_seconds, std::string checkpoint_dir, double checkpoint_every, bool restore,
            std::uint64_t seed, std::optional<fabric> inproc, std::uint64_t store_bytes, bool allow_non_finite,
            std::uint64_t max_commit_samples, double no_worker_grace, std::uint64_t job, std::uint32_t apply_threads,
            std::uint64_t reply_part_bytes, std::uint32_t apply_batch, bool apply_parts_as_they_land,
            std::string reply_compression, float reply_ratio, bool trust_local_lanes, py::dict ledger) {
    if (workers == 0) raise(ashl::invalid_argument("server.workers", 0, "must be >= 1"));
    std::span<const float> init;
    if (initial) {
      init = buffer_of(*initial, "initial", false);
      if (size != 0 && size != init.size())
        raise(ashl::invalid_argument("server.size", size, "differs from initial's " + std::to_string(init.size()) +
                                                              " elements"));
      size = init.size();
    }
    if (size == 0) raise(ashl::invalid_argument("server.size", 0, "must be >= 1 (the model's elements)"));
    auto layout = ps::shard_layout::even(size, servers);
    if (!layout) raise(layout.error());
    if (shard >= servers) raise(ashl::invalid_argument("server.shard", shard, "must be < servers"));
    const auto r = layout->range(shard);
    if (!init.empty()) init = init.subspan(r.begin, r.size());  // this server's part of the whole model
    auto pp = policy_params_from(policy_params);
    pp.workers = workers;
    auto pol = ps::make_policy(policy, pp);
    if (!pol) raise(pol.error());
    // "" (the default): the policy's optimizer, model_delta or a DiLoCo
    // name's outer optimizer from its outer_* parameters
    // (ps::outer_optimizer_of); a DiLoCo name takes no other.
    ps::optimizer_params opt;
    if (optimizer == "model_delta") opt.mode = ps::optimizer_params::kind::model_delta;
    else if (optimizer == "sgd") opt.mode = ps::optimizer_params::kind::sgd;
    else if (optimizer == "outer") opt.mode = ps::optimizer_params::kind::outer;
    else if (!optimizer.empty())
      raise(ashl::invalid_argument("server.optimizer", optimizer, "must be model_delta, sgd, outer or \"\" (the policy's)"));
    if (ps::runs_outer_optimizer(policy)) {
      if (!optimizer.empty())
        raise(ashl::invalid_argument("server.optimizer", optimizer,
                                     "policy " + policy + " runs its outer optimizer (set it with its outer_* "
                                     "parameters); pass optimizer \"\""));
      auto o = ps::outer_optimizer_of(policy, pp);
      if (!o) raise(o.error());
      opt = *o;
    } else if (!optimizer.empty()) {
      opt.lr = lr;
      opt.momentum = momentum;
      opt.weight_decay = weight_decay;
      opt.nesterov = nesterov;
      opt.nesterov_delay = nesterov_delay;
      opt.nesterov_activation = nesterov_activation;
      if (const auto st = opt.validate(); !st) raise(st);
    }
    // "topk", "block4", "block8:128" (ps::parse_codec_spec): the codec and its options.
    const auto codec = ps::parse_codec_spec(compression, "server.compression");
    if (!codec) raise(codec.error());
    // Compressed pull replies (rules/reply_encoder.hpp): "identity" sends them dense.
    const auto reply_codec = ps::parse_codec_spec(reply_compression, "server.reply_compression");
    if (!reply_codec) raise(reply_codec.error());
    ps::server_params sp{.core = {.layout = *layout,
                                  .shard = shard,
                                  .workers = workers,
                                  .max_workers = max_workers,  // 0 = workers; refused by name by the core
                                  .optimizer = opt,
                                  .store_bytes = store_bytes,
                                  .seed = seed,
                                  .allow_non_finite = allow_non_finite,
                                  .max_commit_samples = max_commit_samples,
                                  .replies = {.codec = reply_codec->id, .options = reply_codec->options,
                                              .ratio = reply_ratio}},
                         .compression = codec->id,
                         .compression_options = codec->options,
                         .compression_ratio = compression_ratio,
                         .progress_seconds = progress_seconds,
                         .worker_timeout = millis(worker_timeout, "server.worker_timeout"),
                         .no_worker_grace = millis(no_worker_grace, "server.no_worker_grace"),
                         .checkpoint_dir = std::move(checkpoint_dir),
                         .checkpoint_every_seconds = checkpoint_every,
                         .restore = restore,
                         .job = job,
                         .policy = policy,
                         .apply_threads = apply_threads};
    sp.reply_part_bytes = reply_part_bytes;  // refused by name by server::create (0, or >= 4096)
    sp.apply_batch = apply_batch;            // refused by name by server::create (1..64)
    sp.apply_parts_as_they_land = apply_parts_as_they_land;
    sp.trust_local_lanes = trust_local_lanes;  // docs/ps.md "Lanes without CRC": the workers must say the same
    sp.ledger = ledger_params_from(ledger);    // checked by name by server::create (server.ledger.<field>)
    if (sp.no_worker_grace.count() <= 0)
      raise(ashl::invalid_argument("server.no_worker_grace", no_worker_grace, "must be > 0 seconds"));
    ashl::status failed;
    if (inproc) {
      auto node = inproc->f->node(listen);
      if (!node) failed = node.error();
      else failed = make(ps::server<tr::inproc>::create(std::move(sp), std::move(*pol), std::move(*node), init));
      address_ = listen;
    } else {
#if ASHL_HAS_UCX()
      auto t = tr::ucx::create({.listen = listen, .token = token, .insecure = insecure, .verbose = verbose});
      if (!t) failed = t.error();
      else {
        address_ = t->listen_address();
        failed = make(ps::server<tr::ucx>::create(std::move(sp), std::move(*pol), std::move(*t), init));
      }
#else
      (void)token, (void)insecure, (void)verbose;
      failed = ashl::make_error(ashl::errc::unavailable, "server.transport", "ucx",
                                "this build of ashl has no UCX (libucx-dev); use an InprocFabric");
#endif
    }
    check(failed);
  }
  ~py_server() { stop_and_join(); }

  const std::string& address() const { return address_; }

  // Serves until every worker left (or stop()); the GIL is released. It
  // serves on a thread of its own and checks for signals every 100 ms:
  // Ctrl-C stops the server (ended "stopped"), joins it and raises
  // KeyboardInterrupt. Raises when the final checkpoint failed (the job's
  // last state is not on disk), naming the file and the error (join()).
  void run() {
    if (thread_.joinable()) raise(ashl::invalid_argument("server.run", "running", "start() ran it already"));
    {
      std::lock_guard g(snap_mu_);
      running_ = true;
    }
    thread_ = std::thread([this] { serve(); });
    while (true) {
      {
        py::gil_scoped_release nogil;
        std::unique_lock g(snap_mu_);
        snap_cv_.wait_for(g, std::chrono::milliseconds(100), [&] { return !running_; });
        if (!running_) break;
      }
      if (PyErr_CheckSignals() != 0) {
        join_stopped();
        throw py::error_already_set();
      }
    }
    join();  // raises if the final checkpoint failed
  }
  void start() {
    if (thread_.joinable()) raise(ashl::invalid_argument("server.start", "running", "already started"));
    {
      std::lock_guard g(snap_mu_);
      running_ = true;
    }
    thread_ = std::thread([this] { serve(); });
  }
  // A copy of this server's parameters (its shard). While run() or start()
  // serves, the copy is taken on the server's thread between two passes, so
  // it is one version (no commit half applied); otherwise directly.
  py::array_t<float> parameters() {
    std::vector<float> v;
    {
      py::gil_scoped_release nogil;
      std::unique_lock g(snap_mu_);
      if (running_) {
        snap_wanted_ = true;
        snap_ready_ = false;
        snap_cv_.wait_for(g, std::chrono::seconds(10), [&] { return snap_ready_ || !running_; });
      }
      if (snap_ready_) {
        v.swap(snap_);
        snap_ready_ = false;
      } else {
        snap_wanted_ = false;
        const auto p = s_->parameters();  // not serving: nothing else writes them
        v.assign(p.begin(), p.end());
      }
    }
    py::array_t<float> out(static_cast<py::ssize_t>(v.size()));
    std::copy(v.begin(), v.end(), out.mutable_data());
    return out;
  }
  void stop() { stop_ = true; }
  // Waits for start()'s thread; raises as run() does.
  void join() {
    {
      py::gil_scoped_release nogil;
      if (thread_.joinable()) thread_.join();
    }
    check_final_checkpoint();
  }
  void stop_and_join() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  void join_stopped() {
    py::gil_scoped_release nogil;
    stop_and_join();
  }
  // Telemetry from another thread than the server's: read while it runs is
  // a racy snapshot of counters; after join() it is exact.
  py::dict telemetry() const { return server_telemetry_dict(s_->telemetry()); }
  std::string progress_line() const { return s_->progress_line(); }
  bool all_left() const { return s_->all_left(); }
  // Why run() returned: "running", "stopped", "all_left" or "no_worker".
  std::string ended() const { return std::string(ps::to_string(s_->end())); }

 private:
  template <class T>
  ashl::status make(ashl::result<ps::server<T>>&& r) {
    if (!r) return r.error();
    s_ = std::make_unique<server_of<T>>(std::move(*r));
    return {};
  }

  std::unique_ptr<any_server> s_;
  void check_final_checkpoint() const {
    if (const ashl::status c = s_->final_checkpoint(); !c)
      throw std::runtime_error("the final checkpoint failed: " + c.message());
  }
  void serve() {
    {
      std::lock_guard g(snap_mu_);
      running_ = true;
    }
    s_->run(stop_, [this] {
      if (!snap_wanted_.load(std::memory_order_acquire)) return;
      std::lock_guard g(snap_mu_);
      const auto p = s_->parameters();
      snap_.assign(p.begin(), p.end());
      snap_wanted_ = false;
      snap_ready_ = true;
      snap_cv_.notify_all();
    });
    std::lock_guard g(snap_mu_);
    running_ = false;
    snap_cv_.notify_all();
  }

  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  // parameters() while serving: asked for by snap_wanted_, copied by the server's thread.
  std::mutex snap_mu_;
  std::condition_variable snap_cv_;
  std::atomic<bool> snap_wanted_{false};
  bool snap_ready_ = false;
  bool running_ = false;
  std::vector<float> snap_;
};

// -------------------------------------------------------------- adapters

// adapt::update_builder over numpy float32 views (ashl.torch's buckets):
// the same update as the C++ adapter builds for the same step.
class py_update_builder {
 public:
  py_update_builder(const std::string& kind, std::size_t size)
      : b_(kind_of(kind), size) {}
  void pulled(const py::array& params) {
    const auto p = sized(params, "params");
    py::gil_scoped_release nogil;
    b_.pulled(p);
  }
  void add(const py::array& grads) {
    const auto g = sized(grads, "grads");
    py::gil_scoped_release nogil;
    b_.add(g);
  }
  void build(const py::array& params, const py::array& out) {
    const auto p = sized(params, "params");
    const auto o = buffer_of(out, "out", true);
    if (o.size() != b_.size()) raise(ashl::invalid_argument("out.size", o.size(), "must be the bucket's " + std::to_string(b_.size())));
    py::gil_scoped_release nogil;
    b_.build(p, o);
  }
  std::uint64_t iterations() const { return b_.iterations(); }
  std::size_t size() const { return b_.size(); }

 private:
  static ashl::adapt::update_kind kind_of(const std::string& k) {
    if (k == "delta") return ashl::adapt::update_kind::delta;
    if (k == "gradient") return ashl::adapt::update_kind::gradient;
    raise(ashl::invalid_argument("update", k, "must be delta or gradient"));
  }
  std::span<float> sized(const py::array& a, const char* field) const {
    const auto s = buffer_of(a, field, false);
    if (s.size() != b_.size())
      raise(ashl::invalid_argument(std::string(field) + ".size", s.size(), "must be the bucket's " + std::to_string(b_.size())));
    return s;
  }
  ashl::adapt::update_builder b_;
};

// The pybind11 this module was built with, for diagnostics and the install
// tests: the build prefers the interpreter's own (cmake/ashlPybind11.cmake).
constexpr const char* pybind11_version_string =
    PYBIND11_TOSTRING(PYBIND11_VERSION_MAJOR) "." PYBIND11_TOSTRING(PYBIND11_VERSION_MINOR) "." PYBIND11_TOSTRING(
        PYBIND11_VERSION_PATCH);

// pybind11 before 2.12 reads a numpy dtype descriptor with numpy 1's layout;
// numpy 2 moved the item size in it, so under numpy 2 such a module would
// refuse every float32 buffer as "not float32" (or read the wrong sizes).
// The build refuses that pair; this catches numpy upgraded under a built
// module, at import, with the fix in the message. Newer pybind11 reads both
// numpy 1 and numpy 2 at run time, so nothing is checked there.
void refuse_numpy_it_cannot_read() {
#if PYBIND11_VERSION_HEX < 0x020C0000
  if (py::module_::import("importlib.util").attr("find_spec")("numpy").is_none()) return;
  const auto numpy_version = py::module_::import("numpy").attr("__version__").cast<std::string>();
  if (std::atoi(numpy_version.c_str()) < 2) return;  // the major version: numpy 1 is what it reads
  throw py::import_error(std::string("ashl._ashl was built with pybind11 ") + pybind11_version_string +
                         ", which cannot read numpy " + numpy_version +
                         "'s arrays; rebuild it with pybind11 >= 2.12 (pip install 'pybind11>=2.12'; pip install .) "
                         "or install numpy < 2 (docs/torch.md)");
#endif
}

}  // namespace

#include "rules_bindings.hpp"

PYBIND11_MODULE(_ashl, m) {
  refuse_numpy_it_cannot_read();
  m.doc() = "ashl's runtime: parameter-server workers and servers over UCX or in-process (docs/torch.md)";
  m.attr("pybind11_version") = pybind11_version_string;
  m.attr("has_ucx") = static_cast<bool>(ASHL_HAS_UCX());
  // The job's bounds (rules/job_limits.hpp), for the Python launcher's checks.
  m.attr("MAX_WORKERS") = ps::max_workers;
  m.attr("MAX_SERVERS") = ps::max_servers;
  m.attr("MAX_DURATION_SECONDS") = ps::max_duration_seconds;

  m.def("job_from", &job_from, py::arg("argv") = std::vector<std::string>{},
        "The runtime contract (ASHL_ROLE, ASHL_RANK, ...; flags in argv win) as a dict");
  m.def("policy_help", [] { return ps::policy_help(); });
  m.def("policy_fields", [] { return field_help<ps::policy_params>(); },
        "(name, help) of every policy parameter (ps::policy_params::fields())");
  m.def("plan_fields", [] { return field_help<ashl::worker_plan>(); },
        "(name, help) of every plan field (worker_plan::fields()), in wire order");
  m.def("plan_defaults", [] { return plan_dict(ashl::worker_plan{}); }, "a default worker_plan as a dict");
  m.def(
      "codec_name",
      [](const std::string& name) {
        auto s = ps::parse_codec_spec(name == "none" ? "identity" : name, "compression");
        if (!s) raise(s.error());
        return ps::to_string(*s);
      },
      py::arg("name"),
      "the canonical name of a codec and its options (ps::parse_codec_spec): \"block4\" -> \"block4:64\", "
      "\"block8:128\", \"topk\"; an unknown name or a bad option raises, naming it");
  m.def("make_job_id", &ps::make_job_id, py::arg("name"), py::arg("elements"), py::arg("max_workers"), py::arg("servers"),
        "The job id (ps::make_job_id): servers refuse a worker of another id and a checkpoint of another job");
  m.def("fresh_incarnation", &ps::fresh_incarnation,
        "A worker incarnation larger than any earlier process's (what Worker uses when incarnation is 0)");

  py::class_<fabric>(m, "InprocFabric", "Nodes of one process that exchange messages (tests, one-process runs)")
      .def(py::init([](std::size_t eager_bytes, bool deterministic, bool same_host) {
             return fabric{tr::inproc_fabric::create(
                 {.eager_bytes = eager_bytes, .deterministic = deterministic, .same_host = same_host})};
           }),
           py::arg("eager_bytes") = 256, py::arg("deterministic") = false, py::arg("same_host") = false);

  py::class_<ps::plan_in_force>(m, "CyclePlan", "a worker's plan and codec for one cycle (ps::plan_in_force)")
      .def_property_readonly("plan", [](const ps::plan_in_force& p) { return plan_dict(p.plan); })
      .def_property_readonly("codec", [](const ps::plan_in_force& p) {
        return ps::to_string(ps::codec_spec{p.codec, p.plan.compression_options()});
      });
  py::class_<measurements>(m, "Measurements", "a worker's measurements of one cycle (core/plan.hpp measurement)")
      .def("__len__", [](const measurements& x) { return x.m.size(); })
      .def_property_readonly("kinds", [](const measurements& x) {
        std::vector<std::string> out;
        for (const auto& e : x.m) out.emplace_back(ashl::to_string(e.kind));
        return out;
      });
  py::class_<py_worker>(m, "Worker", "ps::worker: commits a flat float32 buffer and pulls into another")
      .def(py::init<py::array, std::vector<std::string>, std::uint32_t, std::uint32_t, double, std::uint64_t, bool,
                    double, double, double, std::string, bool, bool, std::optional<fabric>, std::uint64_t,
                    std::uint64_t, bool, py::object, std::uint64_t, std::uint32_t, bool, bool,
                    std::vector<std::string>>(),
           py::arg("parameters"), py::arg("servers"), py::arg("rank") = 0, py::arg("batch") = 1,
           py::arg("timeout") = 30.0, py::arg("seed") = 0, py::arg("error_feedback") = true,
           py::arg("link_bytes_per_second") = 0.0, py::arg("reconnect") = 0.0, py::arg("progress_seconds") = 0.0,
           py::arg("token") = "", py::arg("insecure") = false, py::arg("verbose") = false,
           py::arg("fabric") = std::nullopt, py::arg("incarnation") = 0, py::arg("job") = 0,
           py::arg("follower") = false, py::arg("link") = py::none(), py::arg("commit_part_bytes") = 0,
           py::arg("commit_window") = 4, py::arg("allow_non_finite") = false, py::arg("trust_local_lanes") = false,
           py::arg("backups") = std::vector<std::string>{})
      .def("iteration_done", &py_worker::iteration_done, py::arg("samples") = std::nullopt,
           "one local iteration is done (samples: what it trained, None: the batch); true: commit now")
      .def_property_readonly("leases", &py_worker::leases,
                             "the data ledger's leases server 0 sent that the commits have not covered: dicts of "
                             "number, epoch, begin, end, flags (docs/elastic.md §3.6)")
      .def_property_readonly("ledger", &py_worker::ledger,
                             "(samples, shuffle_seed) of the data ledger's leases; (0, 0) before the first")
      .def("progress", &py_worker::progress, "one progress pass without blocking; true when nothing is pending")
      .def_property_readonly("compresses", &py_worker::compresses,
                             "whether this cycle's commit is compressed (known once iteration_done said true)")
      .def_property_readonly("shard_ranges", &py_worker::shard_ranges, "(begin, size) of each server's shard")
      .def("commit_encoded", &py_worker::commit_encoded, py::arg("payloads"),
           "commit() with one payload per shard, encoded by the caller with the plan's codec and ratio")
      .def_property_readonly("current_plan", &py_worker::current_plan,
                             "the plan and codec of this cycle (what a follower is handed)")
      .def("follow", &py_worker::follow, py::arg("leader_plan"), py::arg("leader_done"),
           py::arg("samples") = std::nullopt,
           "a follower's iteration_done: the leader's plan of this cycle and what its iteration_done said")
      .def_property_readonly("reported_measurements", &py_worker::reported_measurements,
                             "what the end of the last cycle reported to the servers")
      .def("report_measurements", &py_worker::report_measurements, py::arg("measurements"),
           "measurements to the servers as this worker's (a follower: its leader's)")
      .def("commit", &py_worker::commit, py::arg("update"))
      .def("push", &py_worker::push, py::arg("update"),
           "commit() without the parameters back: wait() returns once every server acknowledged it "
           "(its policy released this worker); the parameter buffer is left as it is, pull() fetches it")
      .def("pull", &py_worker::pull)
      .def("wait", &py_worker::wait)
      .def("leave", &py_worker::leave)
      .def("report_metric", &py_worker::report_metric, py::arg("name"), py::arg("value"))
      .def_property_readonly("plan", &py_worker::plan)
      .def_property_readonly("batch", &py_worker::batch)
      .def_property_readonly("codec", &py_worker::codec)
      .def_property_readonly("staleness", &py_worker::staleness)
      .def_property_readonly("incarnation", &py_worker::incarnation)
      .def_property_readonly("telemetry", &py_worker::telemetry)
      .def("progress_line", &py_worker::progress_line);

  py::class_<py_update_builder>(m, "UpdateBuilder",
                                "adapt::update_builder: the commit of a bucket (delta since the pull, or mean gradient)")
      .def(py::init<const std::string&, std::size_t>(), py::arg("update"), py::arg("size"))
      .def("pulled", &py_update_builder::pulled, py::arg("params"))
      .def("add", &py_update_builder::add, py::arg("grads"))
      .def("build", &py_update_builder::build, py::arg("params"), py::arg("out"))
      .def_property_readonly("iterations", &py_update_builder::iterations)
      .def_property_readonly("size", &py_update_builder::size);
  bind_rules(m);  // BucketCycle, topk_layout, topk_encode (rules_bindings.hpp)
  // Streaming DiLoCo's fragment rule (rules/streaming.hpp), for
  // ashl.torch.StreamingDiLoCo: the schedule, the merge and the layer split
  // are the C++ rule's, not a copy.
  py::class_<ps::streaming_schedule>(m, "StreamingSchedule",
                                     "rules/streaming.hpp: which fragment syncs and merges after which inner step")
      .def(py::init([](std::uint32_t fragments, std::uint32_t interval, std::uint32_t delay, double alpha,
                       std::uint64_t units, const std::string& unit_name) {
             const ps::streaming_params sp{.fragments = fragments, .interval = interval, .delay = delay, .alpha = alpha};
             if (auto ok = sp.validate(units, unit_name); !ok) raise(ok);
             return ps::streaming_schedule(sp);
           }),
           py::arg("fragments"), py::arg("interval"), py::arg("delay"), py::arg("alpha"), py::arg("units"),
           py::arg("unit_name") = "layers")
      .def("sync_after", &ps::streaming_schedule::sync_after, py::arg("step"))
      .def("merge_after", &ps::streaming_schedule::merge_after, py::arg("step"))
      .def("offset", &ps::streaming_schedule::offset, py::arg("fragment"))
      .def("first_sync", &ps::streaming_schedule::first_sync, py::arg("fragment"))
      .def_property_readonly("fragments", &ps::streaming_schedule::fragments);
  m.def(
      "streaming_merge",
      [](const py::array& local, const py::array& global, const py::array& reference, double alpha) {
        const auto l = buffer_of(local, "local", true);
        const auto g = buffer_of(global, "global", false);
        const auto r = buffer_of(reference, "reference", true);
        if (g.size() != l.size() || r.size() != l.size())
          raise(ashl::invalid_argument("streaming_merge.global.size", g.size(),
                                       "local, global and reference must have one size (" + std::to_string(l.size()) +
                                           ")"));
        py::gil_scoped_release nogil;
        ps::streaming_merge(l, g, r, alpha);
      },
      py::arg("local"), py::arg("global_"), py::arg("reference"), py::arg("alpha"),
      "rules/streaming.hpp streaming_merge: local = alpha*local + (1-alpha)*global (f32), reference = global");
  m.def(
      "layer_fragments",
      [](const std::vector<std::uint64_t>& sizes, std::uint32_t fragments) {
        std::vector<std::uint32_t> first(fragments);
        if (auto ok = ps::layer_fragments(sizes, first); !ok) raise(ok);
        return first;
      },
      py::arg("sizes"), py::arg("fragments"),
      "rules/streaming.hpp layer_fragments: the first layer of each of P runs of consecutive layers");
  m.def(
      "all_finite",
      [](const py::array& x) {
        const auto s = buffer_of(x, "x", false);
        py::gil_scoped_release nogil;
        return ashl::adapt::all_finite(s);
      },
      py::arg("x"), "adapt::all_finite: no inf or nan (a mixed-precision step that has them is skipped)");
  m.def(
      "first_registrations",
      [](const std::vector<std::int64_t>& keys) {
        return ashl::adapt::first_registrations(std::span<const std::int64_t>(keys));
      },
      py::arg("keys"), "adapt::first_registrations: per parameter, whether it owns a slot (tied ones do not)");
  m.def(
      "partition",
      [](const std::vector<std::string>& dtypes, const std::vector<std::uint64_t>& bytes, std::uint64_t cap_bytes) {
        if (dtypes.size() != bytes.size())
          raise(ashl::invalid_argument("partition.bytes.size", bytes.size(), "must equal dtypes.size()"));
        return ashl::adapt::partition(
            dtypes.size(), [&](std::size_t i) { return dtypes[i]; }, [&](std::size_t i) { return bytes[i]; },
            cap_bytes);
      },
      py::arg("dtypes"), py::arg("bytes"), py::arg("cap_bytes"),
      "adapt::partition: slots into buckets (reverse order, one dtype each, at most cap_bytes)");
  m.def(
      "plan_buckets",
      [](const std::vector<std::string>& dtypes, const std::vector<std::uint64_t>& bytes,
         const std::vector<std::uint64_t>& elems, std::uint64_t cap_bytes, std::optional<double> partition_mb) {
        if (dtypes.size() != bytes.size())
          raise(ashl::invalid_argument("plan_buckets.bytes.size", bytes.size(), "must equal dtypes.size()"));
        if (dtypes.size() != elems.size())
          raise(ashl::invalid_argument("plan_buckets.elems.size", elems.size(), "must equal dtypes.size()"));
        if (partition_mb && !ashl::adapt::valid_partition_mb(*partition_mb))
          raise(ashl::invalid_argument("partition_mb", *partition_mb, "must be > 0 MiB (or None: no partitioning)"));
        const auto plan = ashl::adapt::plan_buckets(
            dtypes.size(), [&](std::size_t i) { return dtypes[i]; }, [&](std::size_t i) { return bytes[i]; },
            [&](std::size_t i) { return elems[i]; }, cap_bytes,
            partition_mb ? ashl::adapt::partition_bytes(*partition_mb) : 0);
        std::vector<std::vector<std::tuple<std::size_t, std::uint64_t, std::uint64_t>>> out(plan.size());
        for (std::size_t i = 0; i < plan.size(); ++i)
          for (const auto& p : plan[i]) out[i].emplace_back(p.slot, p.begin, p.size);
        return out;
      },
      py::arg("dtypes"), py::arg("bytes"), py::arg("elems"), py::arg("cap_bytes"), py::arg("partition_mb"),
      "adapt::plan_buckets: buckets of (slot, begin, size) pieces (reverse order, one dtype each, at most "
      "cap_bytes; a slot larger than partition_mb MiB cut across buckets; None: not cut)");
  m.attr("DEFAULT_PARTITION_MB") = ashl::adapt::default_partition_mb;
  m.def(
      "bucket_cap_bytes",
      [](std::uint64_t model_bytes, std::optional<double> cap_mb) {
        return ashl::adapt::bucket_cap_bytes(model_bytes, cap_mb);
      },
      py::arg("model_bytes"), py::arg("cap_mb") = std::nullopt,
      "adapt::bucket_cap_bytes: None is \"auto\" (min(25 MiB, max(1 MiB, model / 4))); 0: one bucket per dtype");
  m.def(
      "bucket_addresses",
      [](const std::vector<std::string>& addresses, std::size_t bucket, bool inproc) {
        auto out = ashl::adapt::bucket_addresses(addresses, bucket, inproc);
        if (!out)
          raise(ashl::invalid_argument("bucket_addresses.addresses", addresses.empty() ? "" : addresses[0],
                                       "bucket " + std::to_string(bucket) + " needs host:port addresses"));
        return *out;
      },
      py::arg("addresses"), py::arg("bucket"), py::arg("inproc"),
      "adapt::bucket_addresses: where bucket b's servers listen (inproc <node>/b<b>; port + b * servers)");

  m.def(
      "merge_traces",
      [](const std::string& path) {
        auto n = ashl::adapt::merge_traces(path);
        if (!n) raise(n.error());
        return *n;
      },
      py::arg("path"),
      "adapt::merge_traces: every process's \"<path>.*.json\" into <path>; the number of files (0: none, "
      "nothing written)");

  py::class_<py_server>(m, "Server", "ps::server: one shard of the model, a consistency policy, an optimizer")
      .def(py::init<std::uint64_t, std::optional<py::array>, std::string, py::dict, std::uint32_t, std::uint32_t,
                    std::string,
                    std::uint32_t, std::uint32_t, std::string, double, double, double, bool, std::uint32_t, double,
                    std::string, float, std::string,
                    bool, bool, double, double, std::string, double, bool, std::uint64_t, std::optional<fabric>,
                    std::uint64_t, bool, std::uint64_t, double, std::uint64_t, std::uint32_t, std::uint64_t,
                    std::uint32_t, bool, std::string, float, bool, py::dict>(),
           py::arg("size") = 0, py::arg("initial") = std::nullopt, py::arg("policy") = "bsp",
           py::arg("policy_params") = py::dict(), py::arg("workers") = 1, py::arg("max_workers") = 0,
           py::arg("listen") = "127.0.0.1:0",
           py::arg("shard") = 0, py::arg("servers") = 1, py::arg("optimizer") = "", py::arg("lr") = 0.1,
           py::arg("momentum") = 0.0, py::arg("weight_decay") = 0.0, py::arg("nesterov") = false,
           py::arg("nesterov_delay") = 1, py::arg("nesterov_activation") = 0.0,
           py::arg("compression") = "topk", py::arg("compression_ratio") = 1.0f, py::arg("token") = "", py::arg("insecure") = false,
           py::arg("verbose") = false, py::arg("worker_timeout") = 20.0, py::arg("progress_seconds") = 0.0,
           py::arg("checkpoint_dir") = "", py::arg("checkpoint_every") = 0.0, py::arg("restore") = false,
           py::arg("seed") = 0, py::arg("fabric") = std::nullopt, py::arg("store_bytes") = 0,
           py::arg("allow_non_finite") = false, py::arg("max_commit_samples") = std::uint64_t{1} << 30,
           py::arg("no_worker_grace") = 60.0, py::arg("job") = 0, py::arg("apply_threads") = 1,
           py::arg("reply_part_bytes") = 0, py::arg("apply_batch") = 1, py::arg("apply_parts_as_they_land") = false,
           py::arg("reply_compression") = "identity", py::arg("reply_ratio") = 1.0f,
           py::arg("trust_local_lanes") = false, py::arg("ledger") = py::dict())
      .def_property_readonly("address", &py_server::address)
      .def("run", &py_server::run)
      .def("start", &py_server::start)
      .def("stop", &py_server::stop)
      .def("join", &py_server::join)
      .def_property_readonly("telemetry", &py_server::telemetry)
      .def("parameters", &py_server::parameters,
           "a copy of the server's parameters (its shard), one version: taken between two passes while it serves")
      .def_property_readonly("all_left", &py_server::all_left)
      .def_property_readonly("ended", &py_server::ended)
      .def("progress_line", &py_server::progress_line);
}
