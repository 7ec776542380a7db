// test/support/saved_state.hpp — the bytes an object's save() writes, for
// tests that compare states (a replay against the original, a backup
// against its primary, a restore against what was saved):
//
//   BOOST_TEST((test_support::saved(backup.core()) == test_support::saved(primary.core())));
#pragma once

#include <ashl/core/state_io.hpp>

#include <cstddef>
#include <vector>

namespace test_support {

std::vector<std::byte> saved(const auto& x) {
  std::vector<std::byte> bytes;
  ashl::state_writer w(bytes);
  x.save(w);
  return bytes;
}

}  // namespace test_support
