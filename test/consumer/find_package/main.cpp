// A consumer of ashl: checks that the headers and target are usable.
#include <ashl/core/core.hpp>

#include <cstdio>

int main() {
  const ashl::half h = ashl::half::from_float(1.0f);
  if (h.bits != 0x3c00) {
    std::puts("unexpected f16 bits for 1.0");
    return 1;
  }
  std::puts("consumer ok");
  return 0;
}
