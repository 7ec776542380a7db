// ashl/ashl.hpp — umbrella of the host-safe headers (no CUDA, no UCX, no
// third-party dependencies): core, wire, compress, sync, profile, transport
// (the concept and inproc), ps (server_core, server, worker, launch).
//
//   #include <ashl/ashl.hpp>
//   ashl::ps::policy_params pp;
//   pp.workers = 9;
//   auto policy = ashl::ps::make_policy("ssp", pp);     // result<sync::any_policy>
//
// The simulator (ashl/sim/*; only sim/cluster_spec_json.hpp needs
// nlohmann_json) and the CUDA codecs (ashl/compress/cuda/*.cuh, need nvcc)
// are included separately, as is transport/ucx.hpp (the ucx component).
// docs/design.md,
// "Layers".
#pragma once

#include <ashl/config.hpp>
#include <ashl/core/core.hpp>
#include <ashl/wire/crc32c.hpp>
#include <ashl/wire/ids.hpp>
#include <ashl/wire/message.hpp>
#include <ashl/compress/compress.hpp>
#include <ashl/sync/adsp.hpp>
#include <ashl/sync/any_policy.hpp>
#include <ashl/sync/ashl_schedule.hpp>
#include <ashl/sync/asp.hpp>
#include <ashl/sync/bsp.hpp>
#include <ashl/sync/concepts.hpp>
#include <ashl/sync/dlb.hpp>
#include <ashl/sync/dssp.hpp>
#include <ashl/sync/events.hpp>
#include <ashl/sync/local_sgd.hpp>
#include <ashl/sync/semi_async.hpp>
#include <ashl/sync/ssp.hpp>
#include <ashl/sync/staged.hpp>
#include <ashl/profile/capability.hpp>
#include <ashl/profile/estimators.hpp>
#include <ashl/profile/iteration_model.hpp>
#include <ashl/profile/measurement.hpp>
#include <ashl/profile/planner.hpp>
#include <ashl/profile/replan.hpp>
#include <ashl/profile/straggler.hpp>
#include <ashl/transport/concepts.hpp>
#include <ashl/transport/inproc.hpp>
#include <ashl/rules/commit_store.hpp>
#include <ashl/ps/incarnation.hpp>
#include <ashl/rules/optimizer.hpp>
#include <ashl/rules/planners.hpp>
#include <ashl/rules/policies.hpp>
#include <ashl/rules/server_core.hpp>
#include <ashl/rules/shards.hpp>
#include <ashl/rules/worker_cycle.hpp>
#include <ashl/ps/launch.hpp>
#include <ashl/ps/server.hpp>
#include <ashl/ps/worker.hpp>
#include <ashl/coll/concepts.hpp>
#include <ashl/coll/compressed.hpp>
#include <ashl/coll/driver.hpp>
#include <ashl/coll/hierarchical.hpp>
#include <ashl/ps/hierarchical_upper.hpp>
#include <ashl/coll/inproc.hpp>
#include <ashl/coll/shards.hpp>
// transport/ucx.hpp needs the ucx component (ashl::ucx), coll/mpi.hpp the mpi
// component, coll/nccl.hpp the nccl component, adapt/torch.hpp the torch
// component, and ps/device_worker.cuh CUDA: include them yourself.
