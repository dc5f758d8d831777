// zero_checkpoint_*: a checkpoint's consolidated fp32 tensors, as zero_to_fp32 writes them, read
// in memory (zero/zero_c.h). Zero and DeepSpeed checkpoints alike, through CheckpointSource.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "zero/c/status.h"
#include "zero/checkpoint/source.h"

struct zero_checkpoint {
  // One output tensor: a parameter under its own name or under one of its tied names.
  struct Entry {
    std::size_t param = 0;
    std::string name;
  };
  std::unique_ptr<zero::ckpt::CheckpointSource> source;
  std::vector<Entry> entries;
};

namespace {

using zero::c_abi::guarded;

const zero_checkpoint& checked(const zero_checkpoint* ckpt) {
  ZERO_C_REQUIRE(ckpt != nullptr && ckpt->source != nullptr, "ckpt is null");
  return *ckpt;
}

const zero_checkpoint::Entry& entry(const zero_checkpoint& ckpt, std::size_t i) {
  ZERO_C_REQUIRE(i < ckpt.entries.size(), "tensor {} does not exist (the checkpoint has {})", i,
                 ckpt.entries.size());
  return ckpt.entries[i];
}

}  // namespace

extern "C" {

int zero_checkpoint_open(const char* dir, const char* tag, zero_checkpoint** out) {
  return guarded("zero_checkpoint_open", [&] {
    ZERO_C_REQUIRE(out != nullptr, "out is null");
    ZERO_C_REQUIRE(dir != nullptr, "dir is null");
    auto handle = std::make_unique<zero_checkpoint>();
    handle->source = zero::ckpt::CheckpointSource::open(dir, tag != nullptr ? tag : "");
    handle->source->verify(0, 1);
    const std::vector<zero::ckpt::SourceParam>& params = handle->source->params();
    for (std::size_t p = 0; p < params.size(); ++p) {
      handle->entries.push_back({p, params[p].name});
      for (const std::string& alias : params[p].aliases) handle->entries.push_back({p, alias});
    }
    *out = handle.release();
  });
}

int zero_checkpoint_close(zero_checkpoint* ckpt) {
  delete ckpt;
  return ZERO_OK;
}

int zero_checkpoint_num_tensors(const zero_checkpoint* ckpt, size_t* n) {
  return guarded("zero_checkpoint_num_tensors", [&] {
    ZERO_C_REQUIRE(n != nullptr, "n is null");
    *n = checked(ckpt).entries.size();
  });
}

int zero_checkpoint_tensor(const zero_checkpoint* ckpt, size_t i, const char** name, int64_t* shape,
                           size_t max_ndim, size_t* ndim) {
  return guarded("zero_checkpoint_tensor", [&] {
    const zero_checkpoint& c = checked(ckpt);
    const zero_checkpoint::Entry& e = entry(c, i);
    ZERO_C_REQUIRE(name != nullptr && ndim != nullptr, "name and ndim must not be null");
    const std::vector<std::int64_t>& dims = c.source->params()[e.param].shape;
    ZERO_C_REQUIRE(dims.size() <= max_ndim && (shape != nullptr || dims.empty()),
                   "tensor {} ('{}') has {} dimensions; max_ndim is {}", i, e.name, dims.size(),
                   max_ndim);
    for (std::size_t d = 0; d < dims.size(); ++d) shape[d] = dims[d];
    *ndim = dims.size();
    *name = e.name.c_str();
  });
}

int zero_checkpoint_read_fp32(zero_checkpoint* ckpt, size_t i, float* out, size_t numel) {
  return guarded("zero_checkpoint_read_fp32", [&] {
    const zero_checkpoint& c = checked(ckpt);
    const zero_checkpoint::Entry& e = entry(c, i);
    const zero::ckpt::SourceParam& p = c.source->params()[e.param];
    ZERO_C_REQUIRE(numel == p.numel, "tensor {} ('{}') has {} elements, but numel is {}", i, e.name,
                   p.numel, numel);
    ZERO_C_REQUIRE(out != nullptr || numel == 0, "out is null");
    if (numel == 0) return;
    if (p.trainable) {
      c.source->read(e.param, "master", 0, numel, out);
      return;
    }
    const std::vector<float> values = c.source->read_frozen(e.param);
    std::memcpy(out, values.data(), numel * sizeof(float));
  });
}

int zero_checkpoint_tensor_dtype(const zero_checkpoint* ckpt, size_t i, int* dtype) {
  return guarded("zero_checkpoint_tensor_dtype", [&] {
    const zero_checkpoint& c = checked(ckpt);
    ZERO_C_REQUIRE(dtype != nullptr, "dtype is null");
    *dtype = zero::c_abi::c_dtype_of(c.source->params()[entry(c, i).param].stored_dtype());
  });
}

}  // extern "C"
