// Fuzz target: wire::decode on arbitrary bytes must never crash, read out of
// bounds or accept something it cannot reproduce. Whatever it accepts is
// encoded again and must come back byte for byte (the format has one
// encoding per message), and must decode again to the same header.
// Seed corpus: test/fuzz/corpus/wire_message/ (one valid message of every kind).
#include <ashl/wire/message.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace w = ashl::wire;
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  w::limits lim;
  lim.max_elements = std::uint64_t{1} << 20;
  lim.max_payload_bytes = std::uint64_t{1} << 20;
  lim.max_error_text = 256;
  auto m = w::decode(in, lim);
  if (!m) {
    if (m.error().message().empty()) std::abort();  // every refusal says why
    return 0;
  }
  if (m->payload.data() != in.data() + w::header_bytes) std::abort();  // a view, not a copy
  std::vector<std::byte> out(size);
  auto n = w::encode(*m, out, lim);
  if (!n || *n != size || std::memcmp(out.data(), data, size) != 0) std::abort();
  auto again = w::decode(out, lim);
  if (!again || !(again->header == m->header)) std::abort();
  return 0;
}
