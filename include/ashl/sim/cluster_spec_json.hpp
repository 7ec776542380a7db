// ashl/sim/cluster_spec_json.hpp — a cluster_spec from JSON text or a file
// (needs nlohmann_json; a spec built in code needs only sim/cluster_spec.hpp).
//
//   auto spec = ashl::sim::parse_cluster_spec(R"({
//     "reference": {"seconds_per_iteration": 0.01, "batch": 64},
//     "model_bytes": 814120,
//     "servers": [{"bandwidth_gbps": 10, "latency_us": 5}],
//     "workers": [{"count": 3, "compute_multiplier": 2, "bandwidth_gbps": 0.65,
//                  "jitter": {"kind": "lognormal", "sigma": 0.1}}],
//     "changes": [{"at": 30, "worker": 1, "kind": "slowdown", "factor": 2},
//                 {"at": 60, "worker": 2, "kind": "die"}],
//     "stragglers": {"probability": 0.1, "factor": 5}
//   })");
//   if (!spec) std::cerr << spec.error().message();  // "workers[0].bandwidth_gbps = -1: must be > 0"
//
// A worker gives "seconds_per_iteration" (at the reference batch) or
// "compute_multiplier" of the reference (2 = twice as slow); its compression
// time is "compress_seconds", or the reference's scaled like its compute.
// Bandwidths in gigabits per second, latencies in microseconds; a server
// without bandwidth_gbps has an unlimited link. "count" repeats an entry
// (worker ids are assigned in order). "max_workers" (optional, 0 or absent:
// the number of workers) bounds the ids that may join; a change's kind is
// slowdown, die, join or leave. A bad field is reported by its JSON
// path (the entry, not the expanded worker index) and its value.
// docs/sim.md "Cluster spec".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/status.hpp>
#include <ashl/sim/cluster_spec.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

ASHL_NAMESPACE_BEGIN
namespace sim {

namespace detail {

using json = nlohmann::json;

// "<field> = <value as JSON>: <why>" for a value of the wrong type.
inline status bad_json(const std::string& field, const json& v, std::string_view why) {
  return status(errc::invalid_argument, field + " = " + v.dump() + ": " + std::string(why));
}

// Reads an optional number; a present non-number is an error naming the path.
inline status read_number(const json& o, const std::string& path, const char* key, double& out, bool required = false) {
  const auto it = o.find(key);
  if (it == o.end()) {
    if (required) return invalid_argument(path + key, "missing", "required");
    return {};
  }
  if (!it->is_number()) return bad_json(path + key, *it, "must be a number");
  out = it->get<double>();
  return {};
}
inline status read_count(const json& o, const std::string& path, const char* key, std::uint64_t& out,
                         std::uint64_t min_value) {
  const auto it = o.find(key);
  if (it == o.end()) return {};
  if (!it->is_number_integer()) return bad_json(path + key, *it, "must be an integer");
  const auto v = it->get<std::int64_t>();
  if (v < static_cast<std::int64_t>(min_value))
    return invalid_argument(path + key, v, min_value == 0 ? "must be >= 0" : "must be >= 1");
  out = static_cast<std::uint64_t>(v);
  return {};
}
inline status read_jitter(const json& o, const std::string& path, const char* key, jitter_spec& out) {
  const auto it = o.find(key);
  if (it == o.end()) return {};
  const std::string f = path + key;
  if (!it->is_object()) return bad_json(f, *it, "must be an object");
  const auto k = it->find("kind");
  if (k == it->end() || !k->is_string()) return invalid_argument(f + ".kind", "missing", "none, uniform or lognormal");
  const auto kind = k->get<std::string>();
  if (kind == "none") {
    out = {};
  } else if (kind == "uniform") {
    out.kind = jitter_kind::uniform;
    ASHL_TRY(read_number(*it, f + ".", "a", out.param, true));
  } else if (kind == "lognormal") {
    out.kind = jitter_kind::lognormal;
    ASHL_TRY(read_number(*it, f + ".", "sigma", out.param, true));
  } else {
    return invalid_argument(f + ".kind", kind, "must be none, uniform or lognormal");
  }
  return {};
}
// Rewrites "workers[k]" of validate() into the JSON entry that produced it.
inline status remap_worker_error(status s, const std::vector<std::size_t>& entry_of) {
  const std::string& m = s.message();
  if (m.rfind("workers[", 0) != 0) return s;
  const auto close = m.find(']');
  const std::size_t k = std::stoul(m.substr(8, close - 8));
  if (k >= entry_of.size()) return s;
  return status(s.code(), "workers[" + std::to_string(entry_of[k]) + "]" + m.substr(close + 1));
}

}  // namespace detail

inline result<cluster_spec> parse_cluster_spec(std::string_view text) {
  using detail::json;
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return malformed("cluster_spec", "json", "does not parse as JSON");
  if (!j.is_object()) return malformed("cluster_spec", j.type_name(), "must be a JSON object");
  cluster_spec s;
  s.servers.clear();
  if (auto r = j.find("reference"); r != j.end()) {
    if (!r->is_object()) return detail::bad_json("reference", *r, "must be an object");
    ASHL_TRY(detail::read_number(*r, "reference.", "seconds_per_iteration", s.reference_seconds_per_iteration));
    std::uint64_t b = s.reference_batch;
    ASHL_TRY(detail::read_count(*r, "reference.", "batch", b, 1));
    s.reference_batch = static_cast<std::uint32_t>(b);
    ASHL_TRY(detail::read_number(*r, "reference.", "compress_seconds", s.reference_compress_seconds));
    if (!(s.reference_compress_seconds >= 0.0) || !std::isfinite(s.reference_compress_seconds))
      return invalid_argument("reference.compress_seconds", s.reference_compress_seconds, "must be finite and >= 0");
    if (!(s.reference_seconds_per_iteration > 0.0) || !std::isfinite(s.reference_seconds_per_iteration))
      return invalid_argument("reference.seconds_per_iteration", s.reference_seconds_per_iteration, "must be > 0");
  }
  ASHL_TRY(detail::read_count(j, "", "model_bytes", s.model_bytes, 0));
  ASHL_TRY(detail::read_count(j, "", "header_bytes", s.header_bytes, 0));
  ASHL_TRY(detail::read_count(j, "", "reply_part_bytes", s.reply_part_bytes, 0));
  ASHL_TRY(detail::read_count(j, "", "commit_part_bytes", s.commit_part_bytes, 0));
  ASHL_TRY(detail::read_count(j, "", "seed", s.seed, 0));
  ASHL_TRY(detail::read_number(j, "", "failure_timeout_s", s.failure_timeout_s));
  {
    std::uint64_t mw = 0;
    ASHL_TRY(detail::read_count(j, "", "max_workers", mw, 0));
    if (mw > ps::max_workers)
      return out_of_range("max_workers", mw, "must be at most " + std::to_string(ps::max_workers) + " (ps::max_workers)");
    s.max_workers = static_cast<std::uint32_t>(mw);
  }

  if (auto sv = j.find("servers"); sv != j.end()) {
    if (!sv->is_array()) return detail::bad_json("servers", *sv, "must be an array");
    for (std::size_t i = 0; i < sv->size(); ++i) {
      const json& e = (*sv)[i];
      const std::string p = "servers[" + std::to_string(i) + "].";
      if (!e.is_object()) return detail::bad_json(p.substr(0, p.size() - 1), e, "must be an object");
      server_spec srv;
      double gbps = std::numeric_limits<double>::infinity(), lat_us = 0.0;
      ASHL_TRY(detail::read_number(e, p, "bandwidth_gbps", gbps));
      ASHL_TRY(detail::read_number(e, p, "latency_us", lat_us));
      if (!(gbps > 0.0)) return invalid_argument(p + "bandwidth_gbps", gbps, "must be > 0");
      if (!(lat_us >= 0.0)) return invalid_argument(p + "latency_us", lat_us, "must be >= 0");
      srv.bandwidth_bytes_per_s = gbps_to_bytes_per_s(gbps);
      srv.latency_s = lat_us * 1e-6;
      s.servers.push_back(srv);
    }
  } else {
    s.servers.push_back({});
  }

  const auto wv = j.find("workers");
  if (wv == j.end() || !wv->is_array()) return invalid_argument("workers", "missing", "must be an array of workers");
  std::vector<std::size_t> entry_of;
  for (std::size_t i = 0; i < wv->size(); ++i) {
    const json& e = (*wv)[i];
    const std::string p = "workers[" + std::to_string(i) + "].";
    if (!e.is_object()) return detail::bad_json(p.substr(0, p.size() - 1), e, "must be an object");
    worker_spec w;
    const bool has_spi = e.contains("seconds_per_iteration"), has_mul = e.contains("compute_multiplier");
    if (has_spi && has_mul)
      return detail::bad_json(p + "compute_multiplier", e["compute_multiplier"],
                              "give seconds_per_iteration or compute_multiplier, not both");
    double mul = 1.0;
    ASHL_TRY(detail::read_number(e, p, "compute_multiplier", mul));
    if (!(mul > 0.0) || !std::isfinite(mul)) return invalid_argument(p + "compute_multiplier", mul, "must be > 0");
    w.seconds_per_iteration = s.reference_seconds_per_iteration * mul;
    ASHL_TRY(detail::read_number(e, p, "seconds_per_iteration", w.seconds_per_iteration));
    if (!(w.seconds_per_iteration > 0.0))
      return invalid_argument(p + "seconds_per_iteration", w.seconds_per_iteration, "must be > 0");
    // A codec runs on the worker's processor: it scales like its compute.
    w.compress_seconds =
        s.reference_compress_seconds * w.seconds_per_iteration / s.reference_seconds_per_iteration;
    ASHL_TRY(detail::read_number(e, p, "compress_seconds", w.compress_seconds));
    std::uint64_t batch = s.reference_batch, count = 1;
    ASHL_TRY(detail::read_count(e, p, "batch", batch, 1));
    ASHL_TRY(detail::read_count(e, p, "count", count, 1));
    if (count > (1u << 20)) return invalid_argument(p + "count", count, "must be <= 1048576");
    w.batch = static_cast<std::uint32_t>(batch);
    double gbps = std::numeric_limits<double>::infinity(), lat_us = 0.0;
    ASHL_TRY(detail::read_number(e, p, "bandwidth_gbps", gbps));
    ASHL_TRY(detail::read_number(e, p, "latency_us", lat_us));
    if (!(gbps > 0.0)) return invalid_argument(p + "bandwidth_gbps", gbps, "must be > 0");
    if (!(lat_us >= 0.0) || !std::isfinite(lat_us)) return invalid_argument(p + "latency_us", lat_us, "must be >= 0");
    w.bandwidth_bytes_per_s = gbps_to_bytes_per_s(gbps);
    w.latency_s = lat_us * 1e-6;
    ASHL_TRY(detail::read_jitter(e, p, "jitter", w.compute_jitter));
    ASHL_TRY(detail::read_jitter(e, p, "comm_jitter", w.comm_jitter));
    if (const auto pv = e.find("push"); pv != e.end()) {
      if (!pv->is_boolean()) return detail::bad_json(p + "push", *pv, "must be true or false");
      w.push = pv->get<bool>();
    }
    for (std::uint64_t k = 0; k < count; ++k) {
      s.workers.push_back(w);
      entry_of.push_back(i);
    }
  }

  if (auto cv = j.find("changes"); cv != j.end()) {
    if (!cv->is_array()) return detail::bad_json("changes", *cv, "must be an array");
    for (std::size_t i = 0; i < cv->size(); ++i) {
      const json& e = (*cv)[i];
      const std::string p = "changes[" + std::to_string(i) + "].";
      if (!e.is_object()) return detail::bad_json(p.substr(0, p.size() - 1), e, "must be an object");
      scheduled_change c;
      ASHL_TRY(detail::read_number(e, p, "at", c.at, true));
      std::uint64_t w = 0;
      if (!e.contains("worker")) return invalid_argument(p + "worker", "missing", "required");
      ASHL_TRY(detail::read_count(e, p, "worker", w, 0));
      if (w > std::numeric_limits<std::uint32_t>::max()) return out_of_range(p + "worker", w, "too large");
      c.worker = static_cast<std::uint32_t>(w);
      const auto k = e.find("kind");
      if (k == e.end() || !k->is_string()) return invalid_argument(p + "kind", "missing", "slowdown, die, join or leave");
      const auto kind = k->get<std::string>();
      if (kind == "slowdown") {
        c.kind = change_kind::slowdown;
        ASHL_TRY(detail::read_number(e, p, "factor", c.factor, true));
      } else if (kind == "die") {
        c.kind = change_kind::die;
      } else if (kind == "join") {
        c.kind = change_kind::join;
      } else if (kind == "leave") {
        c.kind = change_kind::leave;
      } else {
        return invalid_argument(p + "kind", kind, "must be slowdown, die, join or leave");
      }
      s.changes.push_back(c);
    }
  }
  if (auto sv = j.find("stragglers"); sv != j.end()) {
    if (!sv->is_object()) return detail::bad_json("stragglers", *sv, "must be an object");
    ASHL_TRY(detail::read_number(*sv, "stragglers.", "probability", s.stragglers.probability));
    ASHL_TRY(detail::read_number(*sv, "stragglers.", "factor", s.stragglers.factor));
  }
  if (status v = validate(s); !v.ok()) return detail::remap_worker_error(std::move(v), entry_of);
  return s;
}

inline result<cluster_spec> load_cluster_spec(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(errc::not_found, "cluster_spec.path", path, "cannot open");
  std::ostringstream os;
  os << in.rdbuf();
  return parse_cluster_spec(os.str());
}

}  // namespace sim
ASHL_NAMESPACE_END
