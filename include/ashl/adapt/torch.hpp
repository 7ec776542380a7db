// ashl/adapt/torch.hpp — libtorch under ashl's parameter servers, the C++
// side of ashl.torch (docs/torch.md, "C++"; docs/design.md "Layers", adapt/).
// A module's parameters and gradients are flattened once into buckets (every
// parameter's data and grad are views into them, as PyTorch DDP's
// gradient_as_bucket_view), so a step copies nothing into the model: each
// bucket's ps::worker commits from its gradients (or a model delta) and
// pulls into its parameters, following the servers' plan.
//
//   Net net;                                                  // a torch::nn::Module
//   torch::optim::SGD local(net->parameters(), 0.05);
//   auto d = ashl::adapt::torch_worker<ashl::transport::ucx>::create(
//       *net, &local, {.rank = j.rank, .servers = j.server_addresses, .batch = 64},
//       [&](std::size_t) { return ashl::transport::ucx::create({.token = j.token}); },  // one per bucket
//       {.update = ashl::adapt::torch_update::gradient});       // buckets "auto", overlap
//   while (training) {
//     d->zero_grad();
//     auto [x, y] = next_batch(d->batch());                    // the plan's batch size
//     if (auto s = d->before_forward(); !s) return fail(s);    // or d->wait_for(layer) before each layer
//     torch::nll_loss(net->forward(x), y).backward();          // full buckets commit while backward runs
//     if (auto s = d->step(); !s) return fail(s);              // the rest; pulls run on
//   }
//   d->leave();
//
// Buckets (torch_buckets): the parameters that own a slot (tied ones at
// their first registration, adapt::first_registrations) in reverse
// registration order, one dtype (float32, float16, bfloat16) and device per
// bucket, at most bucket_cap_bytes() each ("auto": min(25 MiB, max(1 MiB,
// model / 4))), the partition ashl.torch makes (adapt::partition). Each
// bucket is one parameter-server tensor: its own ps::worker over its own
// transport, served by its own ps::server at bucket_addresses() (inproc
// "<node>/b<b>", UCX port + b * servers). Bucket 0's worker leads; the
// others are followers (worker_params::follower): one cycle, one plan (H,
// interval, batch, compression ratio) for the model, the leader's
// measurements reported by all, under every policy.
//
// Overlap (torch_options::overlap, default true): a post hook on each
// parameter's gradient accumulator (DDP's reducer does the same) marks it
// ready; a full bucket's update (update::gradient) is built and handed to a
// communication thread, which commits it while backward continues; a
// second thread waits for the pulls, the highest bucket (the first layers)
// first. libtorch's C++ modules have no forward pre-hooks, so the pull is
// waited for explicitly: wait_for(layer) / wait_bucket_for(param) just
// before a layer runs (the pull of the other buckets overlaps the forward
// of the layers before), or before_forward() for all. A forward that reads
// the parameters without waiting races with the pull thread writing them.
// update::delta steps the local optimizer in step() first, so its buckets
// are committed from step(). no_sync(true) keeps full buckets from being
// committed during gradient accumulation. overlap false: every bucket is
// committed and pulled inside step(), on the caller's thread (the serial
// exchange; the same parameters bit for bit under BSP).
//
// The update a bucket commits is built by adapt::update_builder, the same
// code ashl.torch runs through the Python module, so both adapters send the
// same bytes for the same step. 16-bit buckets: the worker's buffers are
// float32 host copies (torch_bucket::host_params, host_grads); a step whose
// gradients hold inf or nan (check_finite, default for 16-bit buckets;
// adapt::all_finite) is skipped: no local step, no commit, not counted.
//
// Updates (torch_update): delta (servers with optimizer model_delta, the
// default): the local optimizer steps every iteration and the change since
// the last pull is committed after the plan's local iterations (local SGD).
// gradient (servers with optimizer sgd): nothing steps locally; the
// gradient bucket itself is committed (the mean over the plan's local
// iterations when H > 1) and the servers take the SGD step. With BSP, one
// worker and the identity codec that is plain SGD, bit for bit
// (test/adapt/torch.cpp, torch_buckets.cpp).
//
// Timeline: torch_options::trace (default ASHL_TRACE) writes a Chrome trace
// of the worker, the Python adapter's events (compute, encode, commit,
// pull, wait, per bucket; adapt/trace.hpp), which ashl-run --trace merges.
//
// Streaming DiLoCo's fragments (runs of whole layers, each synchronised by
// ps::streaming_worker on its own schedule) are adapt/torch_streaming.hpp's
// torch_streaming_worker, included here.
//
// The create() that takes one Transport keeps the adapter as it was: one
// bucket of every trainable parameter in registration order, exchanged
// inside step() (overlap false).
//
// CUDA tensors: the buckets live on the device and the worker reads and
// writes pinned host copies (one device-host copy of the update and one
// host-device copy of the parameters per commit); the host codecs encode
// them (ps/device_worker.cuh is the path for device encoding, unused here).
//
// Errors are values naming the parameter and the value: a dtype other than
// float32/float16/bfloat16, a non-contiguous tensor, tensors on different
// devices in one bucket, a model whose size differs from the servers'
// (ps::worker's join). Compiled only with libtorch (the ashl::torch
// component, ASHL_HAS_TORCH()); without it this header is empty.
#pragma once

#include <ashl/config.hpp>

#if ASHL_HAS_TORCH()

#include <ashl/adapt/torch_bucket.hpp>
#include <ashl/adapt/torch_streaming.hpp>  // torch_streaming_worker: Streaming DiLoCo's fragments
#include <ashl/adapt/trace.hpp>
#include <ashl/adapt/update_builder.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/status.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/rules/bucket_cycle.hpp>
#include <ashl/transport/concepts.hpp>
#include <ashl/transport/inproc.hpp>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace adapt {

// How a torch_worker exchanges (docs/torch.md, "C++").
struct torch_options {
  torch_update update = torch_update::delta;
  // Bucket size in MiB; nullopt: "auto" (bucket_cap_bytes); 0: one bucket
  // per dtype and device. Ignored by the create() that takes buckets.
  std::optional<double> bucket_cap_mb;
  // A parameter larger than this many MiB is cut across consecutive
  // buckets, its pieces committed and pulled as a pipeline (default 4 MiB,
  // adapt::default_partition_mb; infinity: not cut; must be > 0). Ignored
  // by the create() that takes buckets (torch_buckets' partition_mb).
  double partition_mb = default_partition_mb;
  // true: a full bucket's update (update::gradient) is committed from a
  // communication thread while backward runs, and step() returns with the
  // pulls in flight: before the next forward reads a bucket's parameters
  // the caller waits for it (wait_for(layer), wait_bucket_for(param) or
  // before_forward()); libtorch's C++ modules have no forward pre-hooks.
  // false: every bucket is committed and pulled inside step(), serially.
  bool overlap = true;
  // A step whose gradients hold inf or nan is skipped and not committed;
  // nullopt: when a bucket is 16-bit.
  std::optional<bool> check_finite;
  // Bucket b's worker_params.job from its element count (a job id is per
  // tensor: ps::job_id_of(job, elements)); unset: worker_params.job as given.
  std::function<std::uint64_t(std::uint64_t)> job_of;
  // The ports ashl-run reserved per server (its ASHL_PORTS_PER_SERVER;
  // bucket b listens at port + b * servers inside that block): a model with
  // more buckets is refused by name, as ashl.torch does. 0: no bound.
  std::uint32_t ports_per_server = 0;
  // A Chrome trace of this worker (adapt/trace.hpp, the Python adapter's
  // events): written to "<trace>.worker<rank>.json" at leave() or
  // destruction, merged by ashl-run --trace. nullopt: ASHL_TRACE; "": off.
  std::optional<std::string> trace;
  std::size_t trace_events = tracer::default_capacity;  // the trace's buffer (events past it are dropped, counted)
};

// A training loop's side of ps::worker for a torch module (see the top).
template <transport::transport Transport>
class torch_worker {
 public:
  // The adapter as it was: one bucket (every trainable parameter, in
  // registration order, one dtype and device), one transport, exchanged
  // inside step() (overlap false). `local` steps the module each iteration
  // (torch_update::delta; required there) and is unused with
  // torch_update::gradient (may be null). Joins the servers and pulls
  // their parameters into the module.
  static result<torch_worker> create(torch::nn::Module& model, torch::optim::Optimizer* local, ps::worker_params p,
                                     Transport t, torch_update update = torch_update::delta) {
    auto b = torch_bucket::create(model);
    if (!b) return b.error();
    return create(std::move(*b), local, std::move(p), std::move(t), update);
  }

  static result<torch_worker> create(torch_bucket bucket, torch::optim::Optimizer* local, ps::worker_params p,
                                     Transport t, torch_update update = torch_update::delta) {
    std::vector<torch_bucket> bs;
    bs.push_back(std::move(bucket));
    std::optional<Transport> one(std::move(t));
    return create(std::move(bs), local, std::move(p),
                  [&](std::size_t) -> result<Transport> { return std::move(*one); },
                  torch_options{.update = update, .overlap = false});
  }

  // Buckets (torch_buckets(model, o.bucket_cap_mb): reverse registration
  // order, one dtype and device each), one ps::worker per bucket, each over
  // its own transport, make_transport(b) (a result<Transport> or a
  // Transport), at bucket_addresses(p.servers, b) (inproc: "<node>/b<b>";
  // UCX: port + b * servers). Buckets > 0 are followers of bucket 0's
  // worker (one cycle and plan for the model). Hooks on the parameters'
  // gradient accumulators mark them ready in backward.
  template <class MakeTransport>
    requires std::invocable<MakeTransport&, std::size_t>
  static result<torch_worker> create(torch::nn::Module& model, torch::optim::Optimizer* local, ps::worker_params p,
                                     MakeTransport&& make_transport, torch_options o = {}) {
    auto bs = torch_buckets(model, o.bucket_cap_mb, o.partition_mb);
    if (!bs) return bs.error();
    return create(std::move(*bs), local, std::move(p), make_transport, std::move(o));
  }

  template <class MakeTransport>
    requires std::invocable<MakeTransport&, std::size_t>
  static result<torch_worker> create(std::vector<torch_bucket> buckets, torch::optim::Optimizer* local,
                                     ps::worker_params p, MakeTransport&& make_transport, torch_options o = {}) {
    if (o.update != torch_update::delta && o.update != torch_update::gradient)
      return invalid_argument("torch_worker.update", static_cast<unsigned>(o.update),
                              "must be delta (0) or gradient (1)");
    if (o.update == torch_update::delta && local == nullptr)
      return invalid_argument("torch_worker.local", "null", "torch_update::delta steps a local optimizer: pass one");
    if (buckets.empty()) return invalid_argument("torch_worker.buckets.size", 0, "needs at least one bucket");
    if (!std::is_same_v<Transport, transport::inproc> && o.ports_per_server != 0 &&
        buckets.size() > o.ports_per_server)
      return invalid_argument("torch_worker.buckets.size", buckets.size(),
                              "ashl-run reserved ASHL_PORTS_PER_SERVER=" + std::to_string(o.ports_per_server) +
                                  " ports per server, room for " + std::to_string(o.ports_per_server) +
                                  " buckets; raise ashl-run's --ports-per-server, bucket_cap_mb or partition_mb");
    auto st = std::make_unique<state>(local, o, p.rank);
    bool sixteen = false;
    for (const auto& b : buckets) sixteen = sixteen || b.dtype() != torch::kFloat;
    st->check_finite = o.check_finite.value_or(sixteen);
    st->wait_bound = 3 * p.timeout + std::chrono::milliseconds(10000);
    st->ex.reserve(buckets.size());
    for (std::size_t bi = 0; bi < buckets.size(); ++bi) {
      auto addresses = bucket_addresses(p.servers, bi, std::is_same_v<Transport, transport::inproc>);
      if (!addresses) {
        st->leave_joined();
        return invalid_argument("torch_worker.servers", p.servers.empty() ? std::string() : p.servers[0],
                                "bucket " + std::to_string(bi) + " needs host:port addresses (port + bucket * servers)");
      }
      ps::worker_params wp = p;
      wp.servers = std::move(*addresses);
      wp.follower = bi > 0;
      if (bi > 0) wp.progress_seconds = 0.0;
      if (o.job_of) wp.job = o.job_of(buckets[bi].size());
      result<Transport> t = [&]() -> result<Transport> {
        if constexpr (std::is_same_v<std::invoke_result_t<MakeTransport&, std::size_t>, result<Transport>>)
          return make_transport(bi);
        else
          return Transport(make_transport(bi));
      }();
      if (!t) {
        st->leave_joined();
        return t.error();
      }
      auto& e = st->ex.emplace_back(std::move(buckets[bi]), static_cast<update_kind>(o.update));
      auto wk = ps::worker<Transport>::create(std::move(wp), std::move(*t), span_of(e.bucket.host_params()));
      if (!wk) {
        st->leave_joined();
        return wk.error();
      }
      e.worker.emplace(std::move(*wk));
      e.bucket.stage_in();
      e.builder.pulled(span_of(e.bucket.host_params()));
    }
    st->install_hooks();
    if (o.overlap) st->start_threads();
    return torch_worker(std::move(st));
  }

  torch_worker(torch_worker&&) noexcept = default;
  torch_worker& operator=(torch_worker&&) noexcept = default;
  ~torch_worker() = default;

  // Zeroes the gradient buckets (gradients stay views into them).
  void zero_grad() {
    std::lock_guard g(s_->train_mu);
    for (auto& e : s_->ex) {
      e.bucket.attach();
      e.bucket.grads().zero_();
    }
  }

  // One local iteration, after backward(): the buckets backward did not
  // commit (all of them with overlap false or update::delta) are added to
  // the cycle, the local step runs (delta), and every bucket commits when
  // the plan's iterations or interval are done. With overlap the pulls are
  // in flight when it returns (see torch_options::overlap); without, they
  // are in the module. A non-finite step (check_finite) is skipped:
  // nothing steps, nothing is committed or counted (skipped()).
  status step() {
    torch::NoGradGuard no_grad;
    std::lock_guard g(s_->train_mu);
    return s_->step();
  }

  // Waits for the exchanges in flight of the buckets holding `param` / the
  // parameters of `layer` (recursively): call it just before the layer
  // runs in the next forward, so the other buckets' pulls overlap the
  // forward of the layers before them.
  // A parameter cut across buckets (torch_options::partition_mb): all of them.
  status wait_bucket_for(const torch::Tensor& param) {
    std::lock_guard g(s_->train_mu);
    return s_->wait_buckets_of(param);
  }
  // A layer's buckets are looked up once (its parameters() allocates) and
  // remembered by the layer's address, so a training loop that waits per
  // layer allocates nothing after its first forward.
  status wait_for(const torch::nn::Module& layer) {
    std::lock_guard g(s_->train_mu);
    for (std::size_t b : s_->buckets_of(layer)) ASHL_TRY(s_->wait_bucket(b));
    return {};
  }
  // Waits for every bucket's exchange in flight: the module then holds the
  // servers' parameters (before a forward that does not wait per layer, or
  // before reading the parameters).
  status before_forward() {
    std::lock_guard g(s_->train_mu);
    return s_->wait_all();
  }
  status wait() { return before_forward(); }

  // Gradient accumulation over several backward passes (DDP's no_sync):
  // while set, a full bucket is not committed in backward; the backward
  // after it (or step()) commits the sum.
  void no_sync(bool on) {
    std::lock_guard g(s_->train_mu);
    s_->no_sync = on;
  }

  // Waits for the exchanges in flight and pulls the servers' parameters
  // into the module now (outside a cycle).
  status synchronize() {
    std::lock_guard g(s_->train_mu);
    ASHL_TRY(s_->wait_all());
    for (auto& e : s_->ex) {
      ASHL_TRY(e.worker->pull());
      ASHL_TRY(e.worker->wait());
      e.bucket.stage_in();
      e.builder.pulled(span_of(e.bucket.host_params()));
    }
    return {};
  }

  // A metric to every bucket's servers (each runs a copy of the policy); a
  // bucket whose exchange is in flight sends it when its parameters are back.
  status report_metric(metric_id m, double v) {
    std::lock_guard g(s_->train_mu);
    for (std::size_t b = 0; b < s_->ex.size(); ++b) ASHL_TRY(s_->deliver_metric(b, m, v));
    return {};
  }

  // Waits for the exchanges in flight, stops the communication threads and
  // leaves every bucket's servers.
  status leave() {
    std::lock_guard g(s_->train_mu);
    status first = s_->wait_all();
    s_->stop_threads();
    for (auto& e : s_->ex) {
      const auto l = e.worker->leave();
      if (first.ok() && !l.ok()) first = l;
    }
    if (auto t = s_->trace.close(); first.ok() && !t.ok()) first = t;
    return first;
  }

  // Bucket 0's plan (every bucket's worker follows it).
  [[nodiscard]] worker_plan plan() const { return s_->ex[0].worker->plan(); }
  [[nodiscard]] std::uint32_t batch() const { return s_->ex[0].worker->batch(); }
  [[nodiscard]] float data_share() const { return plan().data_share; }
  [[nodiscard]] std::uint64_t iterations() const noexcept { return s_->cycle->totals().iterations; }
  // Iterations in which the buckets committed.
  [[nodiscard]] std::uint64_t commits() const noexcept { return s_->cycle->totals().commits; }
  // Steps skipped as non-finite.
  [[nodiscard]] std::uint64_t skipped() const noexcept { return s_->cycle->totals().skipped; }
  [[nodiscard]] std::size_t buckets() const noexcept { return s_->ex.size(); }
  [[nodiscard]] torch_bucket& bucket(std::size_t b = 0) noexcept { return s_->ex[b].bucket; }
  [[nodiscard]] ps::worker<Transport>& worker(std::size_t b = 0) noexcept { return *s_->ex[b].worker; }
  // Gradient-accumulator hook calls of bucket b's slot `slot` (names()[slot]).
  [[nodiscard]] std::uint64_t hook_calls(std::size_t b, std::size_t slot) const {
    std::lock_guard g(s_->train_mu);
    return s_->ex[b].hook_calls[slot];
  }
  [[nodiscard]] bool overlapped() const noexcept { return s_->overlap; }
  // Whether bucket b's exchange (commit, then pull) is in flight: what
  // wait_for / wait_bucket_for wait out.
  [[nodiscard]] bool in_flight(std::size_t b) const {
    std::lock_guard g(s_->mu);
    return !s_->ex[b].arrived;
  }
  // This worker's trace (torch_options::trace): off unless asked for.
  [[nodiscard]] const tracer& trace() const noexcept { return s_->trace; }

 private:
  // One bucket's worker, update builder and state in the cycle.
  struct exchange {
    torch_bucket bucket;
    std::optional<ps::worker<Transport>> worker;
    update_builder builder;  // delta: w0; gradient: the cycle's sum
    // Training side (state::train_mu): hook calls per slot (the slots'
    // readiness and the iteration's progress are state::cycle's).
    std::vector<std::uint64_t> hook_calls;
    // Communication side (state::mu): no exchange in flight; its error;
    // what waits to be sent when it is back (a metric, the leader's
    // measurements).
    bool arrived = true;
    status error;
    std::vector<std::pair<metric_id, double>> pending_metrics;
    std::vector<ashl::measurement> pending_measurements;
    bool measurements_pending = false;

    exchange(torch_bucket b, update_kind k)
        : bucket(std::move(b)), builder(k, bucket.size()), hook_calls(bucket.tensors().size(), 0) {}
  };

  struct state;

  // The gradient accumulator's post hook (DDP's reducer and Horovod do
  // the same): it runs once per backward, after the parameter's gradient
  // (summed over a tied parameter's uses) is accumulated into the bucket.
  // A parameter cut across buckets has one hook, which readies its slot
  // in each of them (`slots`: (bucket, slot), in element order).
  struct ready_hook final : torch::autograd::FunctionPostHook {
    state* s;
    std::vector<std::pair<std::size_t, std::size_t>> slots;
    ready_hook(state* st, std::vector<std::pair<std::size_t, std::size_t>> sl) : s(st), slots(std::move(sl)) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list& /*inputs*/) override {
      for (const auto& [b, slot] : slots) s->on_ready(b, slot);
      return outputs;
    }
  };

  struct state {
    torch::optim::Optimizer* local;
    torch_update update;
    bool overlap;
    bool in_backward;  // commit full buckets in backward: overlap with update::gradient
    bool check_finite = false;
    std::vector<exchange> ex;

    // Training side: the caller's thread and the autograd threads that
    // run the hooks.
    mutable std::mutex train_mu;
    bool no_sync = false;
    // The bucket cycle (rules/bucket_cycle.hpp, the rule ashl.torch runs
    // too): full buckets, the leader's decision, commits, skipped steps,
    // the counts. Made once the buckets are (install_hooks).
    std::optional<bucket_cycle> cycle;
    // The leader's plan of this iteration's cycle (bucket 0's worker; taken
    // when the cycle asks it to lead), every follower's plan.
    ps::plan_in_force lead_plan;
    status hook_error;  // a failure inside a hook, returned by step()
    std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, std::uintptr_t>> hooks;
    std::chrono::milliseconds wait_bound{100000};  // 3 x the worker's timeout + 10 s
    std::vector<std::pair<const void*, std::size_t>> bucket_of_impl;
    std::vector<std::pair<const torch::nn::Module*, std::vector<std::size_t>>> layer_buckets;  // wait_for's

    // Communication side: a send thread commits buckets in the order they
    // filled; a pull thread waits for their parameters, the highest bucket
    // (the first layers, which the next forward needs first) first.
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::size_t> to_send, sent;
    bool stopping = false;
    std::thread send_thread, pull_thread;

    // Spans of compute (from one step() to the next), encode, commit, pull
    // and the training thread's waits, per bucket (adapt/trace.hpp).
    tracer trace;
    double compute_start = 0.0;

    state(torch::optim::Optimizer* l, const torch_options& o, std::uint32_t rank)
        : local(l), update(o.update), overlap(o.overlap),
          in_backward(o.overlap && o.update == torch_update::gradient),
          trace(trace_path_of(o.trace, "worker", rank), "worker", rank, o.trace_events) {}
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      stop_threads();
      for (auto& [node, key] : hooks) node->del_post_hook(key);
    }

    void install_hooks() {
      std::vector<std::size_t> slots;
      for (const auto& e : ex) slots.push_back(e.bucket.tensors().size());
      cycle.emplace(slots);
      for (std::size_t b = 0; b < ex.size(); ++b)
        for (std::size_t i = 0; i < ex[b].bucket.tensors().size(); ++i)
          bucket_of_impl.emplace_back(ex[b].bucket.tensors()[i].unsafeGetTensorImpl(), b);
      for (std::size_t b = 0; b < ex.size(); ++b)
        for (std::size_t i = 0; i < ex[b].bucket.tensors().size(); ++i) {
          const auto& p = ex[b].bucket.tensors()[i];
          if (ex[b].bucket.pieces()[i].first != 0) continue;  // a later piece: the first piece's hook readies it
          // Every bucket holding p (one; or its pieces', consecutive).
          std::vector<std::pair<std::size_t, std::size_t>> slots{{b, i}};
          for (std::size_t c = b + 1; c < ex.size(); ++c)
            for (std::size_t j = 0; j < ex[c].bucket.tensors().size(); ++j)
              if (ex[c].bucket.tensors()[j].unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) slots.emplace_back(c, j);
          // The accumulator is held weakly by the parameter: keep it (and
          // its hook) alive, as DDP's reducer does.
          auto acc = torch::autograd::impl::grad_accumulator(p);
          if (!acc) continue;  // no gradient (requires_grad false): its bucket is completed in step()
          const auto key = acc->add_post_hook(std::make_unique<ready_hook>(this, std::move(slots)));
          hooks.emplace_back(std::move(acc), key);
        }
    }

    // Waits for every bucket holding p (all its pieces' when it is cut).
    status wait_buckets_of(const torch::Tensor& p) {
      for (const auto& [impl, b] : bucket_of_impl)
        if (impl == p.unsafeGetTensorImpl()) ASHL_TRY(wait_bucket(b));
      return {};
    }

    // The buckets holding `layer`'s parameters (recursively), each once,
    // computed at the layer's first wait and kept (wait_for).
    std::span<const std::size_t> buckets_of(const torch::nn::Module& layer) {
      for (const auto& [m, bs] : layer_buckets)
        if (m == &layer) return bs;
      std::vector<std::size_t> bs;
      for (const auto& p : layer.parameters(/*recurse=*/true))
        for (const auto& [impl, b] : bucket_of_impl)  // every piece's bucket of a cut parameter
          if (impl == p.unsafeGetTensorImpl() && std::find(bs.begin(), bs.end(), b) == bs.end()) bs.push_back(b);
      layer_buckets.emplace_back(&layer, std::move(bs));
      return layer_buckets.back().second;
    }

    void start_threads() {
      to_send.reserve(ex.size());  // a bucket is queued at most once: no allocation per commit
      sent.reserve(ex.size());
      send_thread = std::thread([this] { send_loop(); });
      pull_thread = std::thread([this] { pull_loop(); });
    }
    void stop_threads() {
      {
        std::lock_guard g(mu);
        stopping = true;
      }
      cv.notify_all();
      if (send_thread.joinable()) send_thread.join();
      if (pull_thread.joinable()) pull_thread.join();
    }
    // A failed create(): the workers that joined leave.
    void leave_joined() {
      for (auto& e : ex)
        if (e.worker) (void)e.worker->leave();
    }

    // -- training side (train_mu held) ----------------------------------

    void on_ready(std::size_t b, std::size_t slot) {
      std::lock_guard g(train_mu);
      ++ex[b].hook_calls[slot];
      if (!cycle->slot_ready(b, slot)) return;
      if (in_backward && !no_sync)
        if (auto s = bucket_done(b); !s.ok() && hook_error.ok()) hook_error = s;
    }

    // Bucket b's gradient of this local iteration is complete: the cycle
    // takes it (a non-finite one skips the step) and says what follows.
    status bucket_done(std::size_t b) {
      if (cycle->taken(b)) return {};
      ASHL_TRY(wait_bucket(b));  // its last exchange (a bucket no forward waited for) is complete
      exchange& e = ex[b];
      e.bucket.stage_grads_out();
      const auto g = span_of(e.bucket.host_grads());
      cycle->take(b, !check_finite || all_finite(g));
      return run_cycle(b, g);
    }

    // What the cycle asks of bucket b after take(): add its gradient (g;
    // delta: counts the iteration), count the iteration, commit.
    status run_cycle(std::size_t b, std::span<const float> g) {
      for (;;) switch (cycle->next()) {
          case bucket_cycle::action::none:
            return {};
          case bucket_cycle::action::add:
            ex[b].builder.add(g);
            break;
          case bucket_cycle::action::count:
            count(b);
            break;
          case bucket_cycle::action::commit:
            build(b, false);
            return commit(b);
          case bucket_cycle::action::commit_held:
            build(b, ex[b].builder.iterations() == 0);
            return commit(b);
        }
    }

    // Bucket b's worker counts this iteration: bucket 0's worker leads
    // (its plan of the cycle is every follower's: ps::worker_params::follower).
    void count(std::size_t b) {
      for (;;) switch (cycle->count_next()) {
          case bucket_cycle::count_action::lead: {
            if (b != 0)  // its last exchange is complete: its plan is this cycle's
              if (auto s = wait_bucket(0); !s.ok() && hook_error.ok()) hook_error = s;
            auto& lw = *ex[0].worker;
            lead_plan = lw.current_plan();
            cycle->led(lw.iteration_done());
            break;
          }
          case bucket_cycle::count_action::follow:
            cycle->followed(ex[b].worker->iteration_done(lead_plan, cycle->lead_done()));
            break;
          case bucket_cycle::count_action::decided:
            return;
        }
    }

    void build(std::size_t b, bool zero) {
      exchange& e = ex[b];
      if (zero) {
        e.bucket.send().zero_();
        return;
      }
      const double t0 = trace.enabled() ? tracer::now() : 0.0;
      if (update == torch_update::delta) e.bucket.stage_params_out();
      e.builder.build(span_of(e.bucket.host_params()), span_of(e.bucket.send()));
      if (trace.enabled()) trace.span("encode", trace_lane::train, t0, tracer::now(), static_cast<long>(b));
    }

    status commit(std::size_t b) {
      exchange& e = ex[b];
      if (!overlap) {
        {
          std::lock_guard g(mu);
          e.arrived = false;
        }
        const double t0 = trace.enabled() ? tracer::now() : 0.0;
        if (auto s = e.worker->commit(span_of(e.bucket.send())); !s.ok()) {
          std::lock_guard g(mu);
          e.arrived = true;
          return s;
        }
        if (trace.enabled()) trace.span("commit", trace_lane::comm, t0, tracer::now(), static_cast<long>(b));
        return {};
      }
      {
        std::lock_guard g(mu);
        e.arrived = false;
        to_send.push_back(b);
      }
      cv.notify_all();
      return {};
    }

    status wait_bucket(std::size_t b) {
      exchange& e = ex[b];
      if (!overlap) {
        bool in_flight;
        {
          std::lock_guard g(mu);
          in_flight = !e.arrived;
        }
        if (in_flight) receive(b);
      } else {
        // The threads' commit() and wait() end within the worker's timeout
        // each; this bound only catches a thread that stopped.
        std::unique_lock g(mu);
        const double t0 = trace.enabled() && !e.arrived ? tracer::now() : 0.0;
        if (!cv.wait_for(g, wait_bound, [&] { return e.arrived; }))
          return make_error(errc::timed_out, "torch_worker.bucket[" + std::to_string(b) + "]",
                            std::to_string(wait_bound.count()) + " ms",
                            "its exchange did not end in time (the communication threads stopped?)");
        if (t0 != 0.0) trace.span("wait", trace_lane::train, t0, tracer::now(), static_cast<long>(b));
      }
      std::lock_guard g(mu);
      status s = e.error;
      e.error = {};
      return s;
    }

    status wait_all() {
      status first;
      // The highest bucket first: its pull was asked first.
      for (std::size_t b = ex.size(); b-- > 0;)
        if (auto s = wait_bucket(b); !s.ok() && first.ok()) first = s;
      return first;
    }

    status step() {
      if (trace.enabled() && compute_start != 0.0) trace.span("compute", trace_lane::train, compute_start, tracer::now());
      for (auto& e : ex) e.bucket.attach();
      if (!hook_error.ok()) {
        status s = hook_error;
        hook_error = {};
        end_iteration();
        return s;
      }
      if (check_finite && !cycle->skipping())
        for (std::size_t b = 0; b < ex.size(); ++b)
          if (!cycle->taken(b)) {
            ex[b].bucket.stage_grads_out();
            if (!all_finite(span_of(ex[b].bucket.host_grads()))) {
              cycle->skip();
              break;
            }
          }
      if (!cycle->begin_step()) {
        // Skipped: no local step, no commit, no iteration.
        end_iteration();
        return {};
      }
      status result;
      if (update == torch_update::delta) {
        result = wait_all();
        if (result.ok()) {
          if (!cycle->skipping()) local->step();
          for (std::size_t b = 0; b < ex.size() && result.ok(); ++b) {
            cycle->take(b, true);
            result = run_cycle(b, {});  // add: counts the iteration
          }
        }
      } else {
        for (std::size_t b = 0; b < ex.size() && result.ok(); ++b)
          result = bucket_done(b);  // the buckets not committed in backward
      }
      cycle->end_step();
      if (!overlap && result.ok()) result = wait_all();
      if (result.ok() && !hook_error.ok()) result = hook_error;
      hook_error = {};
      end_iteration();
      return result;
    }

    void end_iteration() {
      cycle->end_iteration();
      if (trace.enabled()) compute_start = tracer::now();
    }

    status deliver_metric(std::size_t b, metric_id m, double v) {
      exchange& e = ex[b];
      std::lock_guard g(mu);
      if (e.arrived) return e.worker->report_metric(m, v);
      e.pending_metrics.emplace_back(m, v);
      return {};
    }

    // -- communication side ---------------------------------------------

    // The parameters of bucket b's commit arrive: into the module, the
    // builder's next cycle starts from them; the leader's measurements go
    // to the followers; what waited is sent.
    void receive(std::size_t b) {
      exchange& e = ex[b];
      const double t0 = trace.enabled() ? tracer::now() : 0.0;
      status s = e.worker->wait();
      if (trace.enabled()) trace.span("pull", trace_lane::pull, t0, tracer::now(), static_cast<long>(b));
      if (s.ok()) {
        try {
          e.bucket.stage_in();
        } catch (const std::exception& x) {  // on a communication thread: handed to the caller
          s = make_error(errc::internal, "torch_worker.bucket[" + std::to_string(b) + "].stage_in", x.what(),
                         "copying the pulled parameters into the bucket failed");
        }
      }
      if (s.ok()) {
        e.builder.pulled(span_of(e.bucket.host_params()));
        if (b == 0 && ex.size() > 1) {
          const auto ms = e.worker->reported_measurements();
          if (!ms.empty())
            for (std::size_t f = 1; f < ex.size(); ++f) {
              std::lock_guard g(mu);
              if (ex[f].arrived) {
                if (auto r = ex[f].worker->report_measurements(ms); !r.ok() && ex[f].error.ok()) ex[f].error = r;
              } else {
                ex[f].pending_measurements.assign(ms.begin(), ms.end());
                ex[f].measurements_pending = true;
              }
            }
        }
      }
      {
        std::lock_guard g(mu);
        if (!s.ok() && e.error.ok()) e.error = s;
        for (const auto& [m, v] : e.pending_metrics)
          if (auto r = e.worker->report_metric(m, v); !r.ok() && e.error.ok()) e.error = r;
        e.pending_metrics.clear();
        if (e.measurements_pending) {
          e.measurements_pending = false;
          if (auto r = e.worker->report_measurements(e.pending_measurements); !r.ok() && e.error.ok()) e.error = r;
        }
        e.arrived = true;
      }
      cv.notify_all();
    }

    void send_loop() {
      for (;;) {
        std::size_t b;
        {
          std::unique_lock g(mu);
          cv.wait(g, [&] { return stopping || !to_send.empty(); });
          if (to_send.empty()) return;
          b = to_send.front();
          to_send.erase(to_send.begin());
        }
        exchange& e = ex[b];
        const double t0 = trace.enabled() ? tracer::now() : 0.0;
        const status s = e.worker->commit(span_of(e.bucket.send()));
        if (trace.enabled()) trace.span("commit", trace_lane::comm, t0, tracer::now(), static_cast<long>(b));
        {
          std::lock_guard g(mu);
          if (s.ok()) {
            sent.push_back(b);
          } else {
            if (e.error.ok()) e.error = s;
            e.arrived = true;
          }
        }
        cv.notify_all();
      }
    }

    void pull_loop() {
      for (;;) {
        std::size_t b;
        {
          std::unique_lock g(mu);
          cv.wait(g, [&] { return stopping || !sent.empty(); });
          if (sent.empty()) {
            if (to_send.empty()) return;
            continue;
          }
          const auto it = std::max_element(sent.begin(), sent.end());
          b = *it;
          sent.erase(it);
        }
        receive(b);
      }
    }
  };

  explicit torch_worker(std::unique_ptr<state> s) : s_(std::move(s)) {}

  static std::span<float> span_of(const torch::Tensor& t) {
    return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())};
  }

  std::unique_ptr<state> s_;
};

}  // namespace adapt
ASHL_NAMESPACE_END

#endif  // ASHL_HAS_TORCH()
