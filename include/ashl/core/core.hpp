// ashl/core/core.hpp — umbrella for the core vocabulary.
#pragma once

#include <ashl/core/bucket.hpp>
#include <ashl/core/bytes.hpp>
#include <ashl/core/clock.hpp>
#include <ashl/core/dtype.hpp>
#include <ashl/core/memory_space.hpp>
#include <ashl/core/philox.hpp>
#include <ashl/core/plan.hpp>
#include <ashl/core/state_io.hpp>
#include <ashl/core/status.hpp>
#include <ashl/core/tensor_view.hpp>
