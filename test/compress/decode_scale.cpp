// Every codec's decode_add with a scale other than 1 into an accumulator that
// is not zero: the result must be acc + scale x (decode into zeros), for
// every codec, input dtype and a size that has a partial bucket and a vector
// tail. Exactly (bit for bit) against acc + (decode into zeros at the same
// scale): a decoder adds once per element; to within a few ulps against
// acc + scale x (decode into zeros at scale 1): the scale multiplies every
// value (some decoders fold it into a per-bucket unit first).
#include <ashl/compress/compress.hpp>
#include <boost/test/unit_test.hpp>

#include "../support/codec_testing.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using namespace ashl;
using namespace codec_testing;

namespace {

template <class C>
void check_codec(const std::string& name, C codec) {
  const std::size_t n = 1000 + 37;  // buckets of 512 with a partial one; odd vector tails
  const auto xf = normal_values(n, 77);
  auto one = [&]<class T>(T) {
    const auto x = to_type<T>(xf);
    const compress::codec_context ctx{.seed = 5, .step = 3, .tensor = 1};
    C c = codec;  // stateful codecs: a fresh state per dtype
    std::vector<std::byte> out(c.max_encoded_bytes(n, dtype_of<T>));
    auto used = c.encode(host_view<const T>(x.data(), n), out, ctx);
    BOOST_REQUIRE_MESSAGE(used.has_value(), name + ": " + used.to_status().to_string());
    out.resize(*used);
    const dtype payload_type = std::is_same_v<typename C::codec_concept, compress::stateful_codec_tag> ? dtype::f32
                                                                                                          : dtype_of<T>;
    auto decode = [&](std::vector<float> acc, float scale) {
      BOOST_REQUIRE(c.decode_add(out, {n, payload_type}, host_view<float>(acc.data(), n), scale, ctx).ok());
      return acc;
    };
    std::vector<float> base(n);
    for (std::size_t i = 0; i < n; ++i) base[i] = 0.5f + 0.125f * static_cast<float>(i % 29) - 2.0f * xf[(i * 7) % n];
    const std::vector<float> zeros(n, 0.0f);
    const std::vector<float> unit = decode(zeros, 1.0f);
    bool some_nonzero = false;
    for (float v : unit) some_nonzero = some_nonzero || v != 0.0f;
    BOOST_CHECK_MESSAGE(some_nonzero, name + ": decodes to all zeros");
    for (const float scale : {-2.5f, 0.375f, 1e-3f, 0.0f}) {
      const std::vector<float> z = decode(zeros, scale);
      const std::vector<float> r = decode(base, scale);
      std::size_t exact_bad = 0, scaled_bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (r[i] != base[i] + z[i]) ++exact_bad;
        const double want = static_cast<double>(base[i]) + static_cast<double>(scale) * unit[i];
        // Two roundings of the scaled value (scale folded into a unit, the
        // product) and one of the sum, each within half an ulp of its magnitude.
        const double tol = 4.0 * 0x1p-24 * (std::fabs(static_cast<double>(scale) * unit[i]) + std::fabs(want)) + 1e-30;
        if (std::fabs(r[i] - want) > tol) ++scaled_bad;
      }
      BOOST_CHECK_MESSAGE(exact_bad == 0, name + " " + std::string(to_string(dtype_of<T>)) + " scale " +
                                              std::to_string(scale) + ": " + std::to_string(exact_bad) +
                                              " elements differ from acc + decode into zeros");
      BOOST_CHECK_MESSAGE(scaled_bad == 0, name + " " + std::string(to_string(dtype_of<T>)) + " scale " +
                                               std::to_string(scale) + ": " + std::to_string(scaled_bad) +
                                               " elements differ from acc + scale x decode");
    }
  };
  one(float{});
  one(half{});
  one(bfloat16{});
}

}  // namespace

BOOST_AUTO_TEST_CASE(dense_codecs) {
  check_codec("identity", compress::identity{});
  check_codec("fp16", compress::fp16{});
  check_codec("bf16", compress::bf16{});
}

BOOST_AUTO_TEST_CASE(sparse_codecs) {
  check_codec("topk", compress::topk{0.05});
  check_codec("topk_sampled", compress::topk_sampled{0.05});
  check_codec("threshold", compress::threshold{{.theta = 1.0f, .max_ratio = 0.5}});
  check_codec("randomk", compress::randomk{{.ratio = 0.1}});
  check_codec("randomk unbiased", compress::randomk{{.ratio = 0.1, .unbiased = true}});
}

BOOST_AUTO_TEST_CASE(quantizers) {
  check_codec("qsgd", compress::qsgd{});
  check_codec("qsgd 7 levels", compress::qsgd{{.levels = 7, .bucket = 100}});
  check_codec("terngrad", compress::terngrad{});
  check_codec("sign", compress::sign{});
  check_codec("natural", compress::natural{});
  check_codec("block", compress::block_quant{});
  check_codec("block8 B=128", compress::block_quant{{.bits = 8, .block = 128}});
  check_codec("block2 B=32 stochastic", compress::block_quant{{.bits = 2, .block = 32, .stochastic = true}});
}

BOOST_AUTO_TEST_CASE(stateful_codecs) {
  check_codec("error_feedback<sign>", compress::error_feedback<compress::sign>{compress::sign{}});
  check_codec("error_feedback<qsgd>", compress::error_feedback<compress::qsgd>{compress::qsgd{}});
  check_codec("error_feedback<block>", compress::error_feedback<compress::block_quant>{compress::block_quant{}});
  check_codec("dgc<topk>", compress::dgc<compress::topk>{compress::topk{0.05}});
  check_codec("dgc<threshold>", compress::dgc<compress::threshold>{compress::threshold{{.theta = 0.5f}}});
}
