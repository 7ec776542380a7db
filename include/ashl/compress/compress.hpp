// ashl/compress/compress.hpp — umbrella for the CPU codecs and their registry.
//
//   #include <ashl/compress/compress.hpp>
//   ashl::compress::topk c{0.01};
//   auto s = ashl::compress::decode_add(ashl::codec_id::topk, payload, info, acc, 1.0f, ctx);
//
// docs/algorithms.md §4; docs/wire-format.md, "Codec payloads".
#pragma once

#include <ashl/compress/block.hpp>
#include <ashl/compress/cast.hpp>
#include <ashl/compress/concepts.hpp>
#include <ashl/compress/dgc.hpp>
#include <ashl/compress/error_feedback.hpp>
#include <ashl/compress/identity.hpp>
#include <ashl/compress/natural.hpp>
#include <ashl/compress/qsgd.hpp>
#include <ashl/compress/randomk.hpp>
#include <ashl/compress/registry.hpp>
#include <ashl/compress/sign.hpp>
#include <ashl/compress/terngrad.hpp>
#include <ashl/compress/threshold.hpp>
#include <ashl/compress/topk.hpp>
#include <ashl/compress/topk_sampled.hpp>
