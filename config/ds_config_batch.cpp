// The batch-size triad: train_batch_size = micro batch * accumulation steps * world size.
#include <fmt/format.h>

#include "config/ds_config_impl.h"

namespace zero::config {

using namespace detail;

// SPEC §1.4, with the world size supplied; without it, checks that some integer world size fits.
void Loader::resolve_batch(DsConfig& c, json& out) {
  const char* kTb = "train_batch_size";
  const char* kMb = "train_micro_batch_size_per_gpu";
  const char* kGa = "gradient_accumulation_steps";
  for (const char* k : {kTb, kMb, kGa}) {
    if (is_auto(out[k])) return;  // listed as to be supplied already
  }
  auto tb = c.train_batch_size;
  auto mb = c.train_micro_batch_size_per_gpu;
  auto ga = c.gradient_accumulation_steps;
  if (!tb && !mb) {
    to_supply(
        kTb,
        "train_batch_size or train_micro_batch_size_per_gpu to be supplied (DeepSpeed needs one)");
    return;
  }
  auto derive = [&](const char* key, std::int64_t value, std::string how) {
    out[key] = value;
    provenance[key] = {Source::Derived, std::move(how)};
  };

  if (!supplied.world_size) {
    if (tb && mb && ga) {
      const std::int64_t per_rank = *mb * *ga;
      if (*tb % per_rank != 0) {
        error(kTb,
              fmt::format("no integer world size W satisfies train_batch_size {} = "
                          "train_micro_batch_size_per_gpu {} * gradient_accumulation_steps {} * W",
                          *tb, *mb, *ga));
        return;
      }
      c.world_size = *tb / per_rank;
      add(Severity::Note, kTb,
          fmt::format("train_batch_size {} = {} * {} * W holds only for world size W = {}", *tb,
                      *mb, *ga, *c.world_size));
      return;
    }
    if (tb && mb && *tb % *mb != 0) {
      error(kTb,
            fmt::format(
                "train_batch_size {} is not a multiple of train_micro_batch_size_per_gpu {}, so "
                "{} * ((train_batch_size // {}) // W) * W != {} for every world size W",
                *tb, *mb, *mb, *mb, *tb));
      return;
    }
    if (tb && ga && !mb && *tb % *ga != 0) {
      error(kTb,
            fmt::format(
                "train_batch_size {} is not a multiple of gradient_accumulation_steps {}, so no "
                "world size W gives an integer micro batch",
                *tb, *ga));
      return;
    }
    to_supply("world_size", "the data-parallel world size, to resolve the batch sizes");
    return;
  }

  const std::int64_t w = *supplied.world_size;
  c.world_size = w;
  if (w <= 0) {
    error("world_size", fmt::format("must be positive, got {}", w));
    return;
  }
  if (tb && mb && ga) {
  } else if (tb && mb) {
    ga = (*tb / *mb) / w;
    derive(kGa, *ga,
           fmt::format("(train_batch_size // train_micro_batch_size_per_gpu) // world size {}", w));
  } else if (tb && ga) {
    mb = (*tb / w) / *ga;
    derive(kMb, *mb,
           fmt::format("(train_batch_size // world size {}) // gradient_accumulation_steps", w));
  } else if (mb && ga) {
    tb = *mb * *ga * w;
    derive(kTb, *tb, fmt::format("micro batch * accumulation * world size {}", w));
  } else if (tb) {
    ga = 1;
    mb = *tb / w;
    derive(kGa, 1, "only train_batch_size given");
    derive(kMb, *mb, fmt::format("train_batch_size // world size {}", w));
  } else {
    tb = *mb * w;
    ga = 1;
    derive(kTb, *tb, fmt::format("micro batch * world size {}", w));
    derive(kGa, 1, "only train_micro_batch_size_per_gpu given");
  }
  c.train_batch_size = tb;
  c.train_micro_batch_size_per_gpu = mb;
  c.gradient_accumulation_steps = ga;
  if (*tb <= 0 || *mb <= 0 || *ga <= 0) {
    error(
        kTb,
        fmt::format(
            "batch sizes must be positive: train_batch_size {}, train_micro_batch_size_per_gpu {}, "
            "gradient_accumulation_steps {} with world size {}",
            *tb, *mb, *ga, w));
    return;
  }
  if (*tb != *mb * *ga * w) {
    error(kTb, fmt::format("train_batch_size {} != train_micro_batch_size_per_gpu {} * "
                           "gradient_accumulation_steps "
                           "{} * world size {} = {}",
                           *tb, *mb, *ga, w, *mb * *ga * w));
  }
}

}  // namespace zero::config
