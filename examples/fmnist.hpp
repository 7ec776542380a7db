// examples/fmnist.hpp — Fashion-MNIST from the Debian package
// dataset-fashion-mnist (IDX files, gzip), read with zlib.
//
//   auto d = fmnist::load("/usr/share/datasets/fashion-mnist");
//   if (!d) { std::cerr << d.error().message() << '\n'; return 77; }
//   d->train.images[i * 784 + p];   // u8 pixel, d->train.labels[i] in 0..9
//
// Validates the IDX magic (0x803 images, 0x801 labels), the 28×28 shape, the
// counts (60000/10000) and that every label is < 10. A missing file is
// errc::not_found with a hint to install the package.
#pragma once

#include <ashl/core/status.hpp>

#include <zlib.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fmnist {

constexpr std::size_t pixels = 784;

struct split {
  std::size_t count = 0;
  std::vector<std::uint8_t> images;  // count × 784
  std::vector<std::uint8_t> labels;  // count
};

struct dataset {
  split train, test;
};

namespace detail {
inline ashl::result<std::vector<std::uint8_t>> read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f)
    return ashl::make_error(ashl::errc::not_found, "fmnist.file", path,
                            "cannot open; install the data set with `apt-get install dataset-fashion-mnist`");
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  for (;;) {
    const int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      gzclose(f);
      return ashl::make_error(ashl::errc::io_error, "fmnist.file", path, "gzip read failed");
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  gzclose(f);
  return out;
}
inline std::uint32_t be32(const std::vector<std::uint8_t>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) | (std::uint32_t{b[at + 2]} << 8) | b[at + 3];
}
inline ashl::status read_split(const std::string& dir, const char* prefix, std::size_t expect, split& s) {
  const std::string ip = dir + "/" + prefix + "-images-idx3-ubyte.gz", lp = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  auto img = read_gz(ip);
  if (!img) return img.error();
  auto lab = read_gz(lp);
  if (!lab) return lab.error();
  if (img->size() < 16) return ashl::malformed(ip + ".size", img->size(), "shorter than an IDX header");
  if (be32(*img, 0) != 0x803) return ashl::malformed(ip + ".magic", be32(*img, 0), "must be 2051 (0x803)");
  const std::uint32_t n = be32(*img, 4), rows = be32(*img, 8), cols = be32(*img, 12);
  if (n != expect) return ashl::malformed(ip + ".count", n, "unexpected image count");
  if (rows != 28 || cols != 28) return ashl::malformed(ip + ".rows", rows, "must be 28 x 28");
  if (img->size() != 16 + std::size_t{n} * pixels) return ashl::malformed(ip + ".size", img->size(), "does not match the header");
  if (lab->size() < 8) return ashl::malformed(lp + ".size", lab->size(), "shorter than an IDX header");
  if (be32(*lab, 0) != 0x801) return ashl::malformed(lp + ".magic", be32(*lab, 0), "must be 2049 (0x801)");
  if (be32(*lab, 4) != n) return ashl::malformed(lp + ".count", be32(*lab, 4), "must equal the image count");
  if (lab->size() != 8 + std::size_t{n}) return ashl::malformed(lp + ".size", lab->size(), "does not match the header");
  s.count = n;
  s.images.assign(img->begin() + 16, img->end());
  s.labels.assign(lab->begin() + 8, lab->end());
  for (std::size_t i = 0; i < n; ++i)
    if (s.labels[i] > 9) return ashl::malformed(lp + ".label[" + std::to_string(i) + "]", s.labels[i], "must be < 10");
  return {};
}
}  // namespace detail

inline ashl::result<dataset> load(const std::string& dir) {
  dataset d;
  ASHL_TRY(detail::read_split(dir, "train", 60000, d.train));
  ASHL_TRY(detail::read_split(dir, "t10k", 10000, d.test));
  return d;
}

}  // namespace fmnist
