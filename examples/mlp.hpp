// examples/mlp.hpp — a tiny training interface and a 784-256-10 ReLU MLP.
//
//   mlp net;                                   // parameters in one flat buffer
//   std::vector<float> p = net.init(seed);     // size net.size()
//   std::vector<float> g(net.size());
//   float loss = net.forward_backward(p, x, labels, 64, g);   // mean loss, g = ∇
//   auto [acc, l] = net.evaluate(p, images, labels, n);
//
// The interface a framework adapter replaces: a model is its flat parameter
// buffer plus forward/backward on a batch (x: batch × 784 floats in [0, 1]).
// Layout: W1 (784×256, row-major, input-major), b1 (256), W2 (256×10), b2 (10).
// The GEMMs are blocked so the inner loops are contiguous and vectorize:
// forward X·W1 updates 8 output rows per pass over a row of W1; the weight
// gradient X^T·dH walks W1's rows once, skipping zero pixels (about half of
// Fashion-MNIST). Single-threaded and deterministic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

class mlp {
 public:
  static constexpr std::size_t in = 784, hidden = 256, out = 10;
  static constexpr std::size_t w1 = 0, b1 = in * hidden, w2 = b1 + hidden, b2 = w2 + hidden * out;
  static constexpr std::size_t count = b2 + out;

  [[nodiscard]] static constexpr std::size_t size() noexcept { return count; }

  // He-uniform init from a splitmix stream.
  [[nodiscard]] static std::vector<float> init(std::uint64_t seed) {
    std::vector<float> p(count, 0.0f);
    std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    auto u = [&] {
      s += 0x9E3779B97F4A7C15ull;
      std::uint64_t z = s;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      return static_cast<float>(static_cast<double>(z >> 11) * 0x1p-53 * 2.0 - 1.0);
    };
    const float a1 = std::sqrt(6.0f / in), a2 = std::sqrt(6.0f / hidden);
    for (std::size_t i = 0; i < in * hidden; ++i) p[w1 + i] = a1 * u();
    for (std::size_t i = 0; i < hidden * out; ++i) p[w2 + i] = a2 * u();
    return p;
  }

  // Mean cross-entropy of the batch; g receives the gradient (overwritten).
  float forward_backward(const std::vector<float>& p, const float* x, const std::uint8_t* y, std::size_t n,
                         std::vector<float>& g) {
    forward(p, x, n);
    std::fill(g.begin(), g.end(), 0.0f);
    float loss = 0.0f;
    dz_.assign(n * out, 0.0f);
    for (std::size_t i = 0; i < n; ++i) {
      float* z = &z_[i * out];
      float m = z[0];
      for (std::size_t k = 1; k < out; ++k) m = std::max(m, z[k]);
      float sum = 0.0f;
      for (std::size_t k = 0; k < out; ++k) sum += std::exp(z[k] - m);
      loss += std::log(sum) + m - z[y[i]];
      const float inv_n = 1.0f / static_cast<float>(n);
      for (std::size_t k = 0; k < out; ++k) dz_[i * out + k] = std::exp(z[k] - m) / sum * inv_n;
      dz_[i * out + y[i]] -= inv_n;
    }
    // layer 2: dW2 = H^T dZ, db2 = Σ dZ, dH = dZ W2^T ⊙ relu'
    dh_.assign(n * hidden, 0.0f);
    for (std::size_t i = 0; i < n; ++i) {
      const float* h = &h_[i * hidden];
      const float* dz = &dz_[i * out];
      for (std::size_t j = 0; j < hidden; ++j) {
        if (h[j] == 0.0f) continue;
        float* gw = &g[w2 + j * out];
        const float* w = &p[w2 + j * out];
        float acc = 0.0f;
        for (std::size_t k = 0; k < out; ++k) {
          gw[k] += h[j] * dz[k];
          acc += w[k] * dz[k];
        }
        dh_[i * hidden + j] = acc;
      }
      for (std::size_t k = 0; k < out; ++k) g[b2 + k] += dz[k];
    }
    // layer 1: dW1 = X^T dH (row r of W1 gets Σ_i x[i][r] · dH[i]), db1 = Σ dH
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < hidden; ++j) g[b1 + j] += dh_[i * hidden + j];
    xt_.resize(in * n);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t r = 0; r < in; ++r) xt_[r * n + i] = x[i * in + r];
    for (std::size_t r = 0; r < in; ++r) {
      float* __restrict gw = &g[w1 + r * hidden];
      const float* xr = &xt_[r * n];
      for (std::size_t i = 0; i < n; ++i) {
        const float a = xr[i];
        if (a == 0.0f) continue;
        const float* __restrict d = &dh_[i * hidden];
        for (std::size_t j = 0; j < hidden; ++j) gw[j] += a * d[j];
      }
    }
    return loss / static_cast<float>(n);
  }

  // (accuracy, mean loss) over n samples of u8 images.
  std::pair<double, double> evaluate(std::span<const float> p, const std::uint8_t* images, const std::uint8_t* labels,
                                     std::size_t n) {
    constexpr std::size_t chunk = 256;
    std::vector<float> x(chunk * in);
    std::size_t right = 0;
    double loss = 0.0;
    for (std::size_t s = 0; s < n; s += chunk) {
      const std::size_t m = std::min(chunk, n - s);
      to_float(images + s * in, m, x.data());
      forward(p, x.data(), m);
      for (std::size_t i = 0; i < m; ++i) {
        const float* z = &z_[i * out];
        std::size_t best = 0;
        float mx = z[0];
        for (std::size_t k = 1; k < out; ++k)
          if (z[k] > mx) mx = z[k], best = k;
        double sum = 0.0;
        for (std::size_t k = 0; k < out; ++k) sum += std::exp(double(z[k] - mx));
        loss += std::log(sum) + mx - z[labels[s + i]];
        right += best == labels[s + i];
      }
    }
    return {static_cast<double>(right) / static_cast<double>(n), loss / static_cast<double>(n)};
  }

  static void to_float(const std::uint8_t* img, std::size_t n, float* x) {
    for (std::size_t i = 0; i < n * in; ++i) x[i] = static_cast<float>(img[i]) * (1.0f / 255.0f);
  }

 private:
  void forward(std::span<const float> p, const float* x, std::size_t n) {
    h_.assign(n * hidden, 0.0f);
    constexpr std::size_t rb = 8;
    for (std::size_t i0 = 0; i0 < n; i0 += rb) {
      const std::size_t ie = std::min(n, i0 + rb);
      for (std::size_t r = 0; r < in; ++r) {
        const float* __restrict w = &p[w1 + r * hidden];
        for (std::size_t i = i0; i < ie; ++i) {
          const float a = x[i * in + r];
          if (a == 0.0f) continue;
          float* __restrict h = &h_[i * hidden];
          for (std::size_t j = 0; j < hidden; ++j) h[j] += a * w[j];
        }
      }
    }
    z_.assign(n * out, 0.0f);
    for (std::size_t i = 0; i < n; ++i) {
      float* h = &h_[i * hidden];
      for (std::size_t j = 0; j < hidden; ++j) h[j] = std::max(0.0f, h[j] + p[b1 + j]);
      float* z = &z_[i * out];
      for (std::size_t k = 0; k < out; ++k) z[k] = p[b2 + k];
      for (std::size_t j = 0; j < hidden; ++j) {
        if (h[j] == 0.0f) continue;
        const float* w = &p[w2 + j * out];
        for (std::size_t k = 0; k < out; ++k) z[k] += h[j] * w[k];
      }
    }
  }

  std::vector<float> h_, z_, dz_, dh_, xt_;
};
