// python/src/rules_bindings.hpp — the pure rules ashl/torch.py calls instead
// of writing them again in Python (docs/design.md, "Where the rules live"):
//
//   _ashl.BucketCycle(slots)       rules/bucket_cycle.hpp: when a bucket is
//                                  full, who leads, when it commits, what a
//                                  skipped step does; torch.py keeps the
//                                  hooks and the tensor plumbing.
//   _ashl.topk_layout(n, ratio)    compress/topk.hpp's k rule and the sparse
//                                  payload's layout (compress/layout.hpp) with
//                                  its header written by the codecs' writer,
//                                  for the device top-k of torch.py.
//   _ashl.topk_encode(x, ratio)    the host codec itself (what the device
//                                  payload must equal; test/python).
//
// Included once, by ashl_native.cpp, after its helpers (raise, buffer_of).
#pragma once

#include <ashl/compress/detail/sparse.hpp>
#include <ashl/compress/layout.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/rules/bucket_cycle.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace {

// The rule with the bounds and order checks a Python caller gets as
// ValueError / RuntimeError (the C++ rule asserts them: a programming error).
class py_bucket_cycle {
 public:
  using rule = ashl::adapt::bucket_cycle;

  explicit py_bucket_cycle(const std::vector<std::size_t>& slots) : c_(slots) {
    if (slots.empty()) raise(ashl::invalid_argument("bucket_cycle.slots.size", 0, "needs at least one bucket"));
  }

  bool slot_ready(std::size_t b, std::size_t slot) {
    bucket(b);
    if (slot >= c_.slots(b))
      raise(ashl::invalid_argument("bucket_cycle.slot", slot,
                                   "must be below bucket " + std::to_string(b) + "'s " + std::to_string(c_.slots(b))));
    return c_.slot_ready(b, slot);
  }
  bool taken(std::size_t b) const { return c_.taken(bucket(b)); }
  void take(std::size_t b, bool finite) {
    if (c_.taken(bucket(b)))
      throw std::runtime_error("bucket_cycle.take: bucket " + std::to_string(b) + " was taken in this iteration");
    c_.take(b, finite);
  }
  rule::action next() {
    if (counting_) throw std::runtime_error("bucket_cycle.next: the count is not decided (count_next() first)");
    const auto a = c_.next();
    counting_ = a == rule::action::count;
    return a;
  }
  rule::count_action count_next() {
    if (!counting_ || awaiting_) throw std::runtime_error("bucket_cycle.count_next: no count in progress");
    const auto a = c_.count_next();
    awaiting_ = a != rule::count_action::decided;
    counting_ = awaiting_;  // decided: next() may go on
    last_ = a;
    return a;
  }
  void led(bool done) {
    if (!awaiting_ || last_ != rule::count_action::lead)
      throw std::runtime_error("bucket_cycle.led: not after count_next() said lead");
    awaiting_ = false;
    c_.led(done);
  }
  void followed(bool done) {
    if (!awaiting_ || last_ != rule::count_action::follow)
      throw std::runtime_error("bucket_cycle.followed: not after count_next() said follow");
    awaiting_ = false;  // count_next() then says decided
    c_.followed(done);
    last_ = rule::count_action::decided;
  }
  void end_iteration() {
    counting_ = awaiting_ = false;
    c_.end_iteration();
  }
  bool committed(std::size_t b) const { return c_.committed(bucket(b)); }
  rule& get() noexcept { return c_; }
  const rule& get() const noexcept { return c_; }

 private:
  std::size_t bucket(std::size_t b) const {
    if (b >= c_.buckets())
      raise(ashl::invalid_argument("bucket_cycle.bucket", b, "must be below " + std::to_string(c_.buckets())));
    return b;
  }

  rule c_;
  // Where the driver stands in a count (the C++ rule asserts the same).
  bool counting_ = false, awaiting_ = false;
  rule::count_action last_ = rule::count_action::decided;
};

void bind_rules(py::module_& m) {
  using rule = ashl::adapt::bucket_cycle;
  py::class_<py_bucket_cycle> bc(
      m, "BucketCycle",
      "rules/bucket_cycle.hpp: the adapters' bucket cycle (full buckets, the leader's decision for all buckets, "
      "commits, skipped steps), the same rule adapt::torch_worker runs");
  py::enum_<rule::action>(bc, "Action")
      .value("none", rule::action::none)
      .value("add", rule::action::add)
      .value("count", rule::action::count)
      .value("commit", rule::action::commit)
      .value("commit_held", rule::action::commit_held);
  py::enum_<rule::count_action>(bc, "Count")
      .value("lead", rule::count_action::lead)
      .value("follow", rule::count_action::follow)
      .value("decided", rule::count_action::decided);
  bc.def(py::init<const std::vector<std::size_t>&>(), py::arg("slots"), "slots[b]: bucket b's hooked slots")
      .def("slot_ready", &py_bucket_cycle::slot_ready, py::arg("bucket"), py::arg("slot"),
           "a slot's gradient is in; true when that filled the bucket (its slots are cleared)")
      .def("taken", &py_bucket_cycle::taken, py::arg("bucket"))
      .def("take", &py_bucket_cycle::take, py::arg("bucket"), py::arg("finite"),
           "the bucket's part of this iteration is complete; then next() until Action.none")
      .def("next", &py_bucket_cycle::next)
      .def("count_next", &py_bucket_cycle::count_next)
      .def("led", &py_bucket_cycle::led, py::arg("done"), "the leader's iteration_done()")
      .def("followed", &py_bucket_cycle::followed, py::arg("done"), "this follower's iteration_done(plan, lead_done)")
      .def_property_readonly("lead_known", [](const py_bucket_cycle& c) { return c.get().lead_known(); })
      .def_property_readonly("lead_done", [](const py_bucket_cycle& c) { return c.get().lead_done(); })
      .def_property_readonly("decision", [](const py_bucket_cycle& c) { return c.get().decision(); })
      .def("skip", [](py_bucket_cycle& c) { c.get().skip(); }, "this iteration is skipped (non-finite)")
      .def_property_readonly("skipping", [](const py_bucket_cycle& c) { return c.get().skipping(); })
      .def("committed", &py_bucket_cycle::committed, py::arg("bucket"))
      .def_property_readonly("any_committed", [](const py_bucket_cycle& c) { return c.get().any_committed(); })
      .def("begin_step", [](py_bucket_cycle& c) { return c.get().begin_step(); },
           "false: the step is skipped whole (counted as skipped)")
      .def("end_step", [](py_bucket_cycle& c) { c.get().end_step(); })
      .def("end_iteration", &py_bucket_cycle::end_iteration);
  // The counts, settable for a checkpoint's (load_state_dict).
  for (const auto& [name, field] : {std::pair{"iterations", &rule::counts::iterations},
                                    std::pair{"commits", &rule::counts::commits},
                                    std::pair{"skipped", &rule::counts::skipped}})
    bc.def_property(
        name, [field](const py_bucket_cycle& c) { return c.get().totals().*field; },
        [field](py_bucket_cycle& c, std::uint64_t v) {
          auto t = c.get().totals();
          t.*field = v;
          c.get().restore(t);
        });

  namespace L = ashl::compress::layout;
  m.def(
      "topk_layout",
      [](std::size_t n, double ratio) {
        const ashl::compress::topk c{ratio};
        check(c.validate());
        if (n == 0 || n > L::sparse::max_elements)
          raise(ashl::invalid_argument("topk.n", n, "must be in [1, 2^32] (a sparse payload's u32 indices)"));
        const std::size_t k = c.k_for(n);
        std::array<std::byte, L::sparse::header_bytes> header{};
        const std::byte* idx = ashl::compress::detail::write_sparse_header(header.data(), n, k);
        return py::make_tuple(k, py::bytes(reinterpret_cast<const char*>(header.data()), header.size()),
                              static_cast<std::size_t>(idx - header.data()),
                              static_cast<std::size_t>(L::sparse_values_offset(k)),
                              static_cast<std::size_t>(L::sparse_payload_bytes(k, L::value_bytes(ashl::dtype::f32))));
      },
      py::arg("n"), py::arg("ratio"),
      "compress::topk's payload of n float32 elements at this ratio: (k, header bytes, indices offset, values "
      "offset, payload bytes)");
  m.def(
      "topk_encode",
      [](const py::array& x, double ratio) {
        const auto s = buffer_of(x, "x", false);
        const ashl::compress::topk c{ratio};
        check(c.validate());
        std::vector<std::byte> out(c.max_encoded_bytes(s.size(), ashl::dtype::f32));
        std::vector<std::byte> scratch(c.scratch_bytes(s.size(), ashl::dtype::f32));
        ashl::compress::codec_context ctx;
        ctx.scratch = scratch;
        const auto used = c.encode(ashl::host_view<const float>(s.data(), s.size()), out, ctx);
        if (!used) raise(used.error());
        return py::bytes(reinterpret_cast<const char*>(out.data()), *used);
      },
      py::arg("x"), py::arg("ratio"), "compress::topk's payload of x (float32) on the host");
}

}  // namespace
