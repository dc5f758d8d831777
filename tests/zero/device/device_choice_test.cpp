// Which device make_device picks and the errors it gives, for machines this one is not (pure
// logic), and make_device itself on this machine.
#include "zero/device/device_choice.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "zero/base/cuda_error.h"
#include "zero/base/error.h"
#include "zero/device/device.h"

#if ZERO_TEST_HAVE_CUDA
#include "kernels/cuda_device_count.h"
#endif

using zero::choose_device;
using zero::CudaAvailability;

namespace {

CudaAvailability gpu_machine(int devices) {
  CudaAvailability c;
  c.built = true;
  c.device_count = devices;
  c.driver_version = 13000;
  c.runtime_version = 13000;
  c.visible_devices = "<unset>";
  return c;
}

CudaAvailability no_gpu_machine() {
  CudaAvailability c = gpu_machine(0);
  c.error = "cudaErrorNoDevice (no CUDA-capable device is detected)";
  return c;
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace

TEST_CASE("auto picks CUDA when a usable GPU is visible and the CPU otherwise") {
  REQUIRE(choose_device("auto", nullptr, gpu_machine(2)).kind == "cuda");
  REQUIRE(choose_device("auto", nullptr, gpu_machine(2)).reason == "auto: 2 CUDA devices visible");
  REQUIRE(choose_device("auto", nullptr, no_gpu_machine()).kind == "cpu");
  REQUIRE(choose_device("auto", nullptr, CudaAvailability{}).kind == "cpu");
  REQUIRE(choose_device("auto", "auto", gpu_machine(1)).kind == "cuda");
}

TEST_CASE("ZERO_DEVICE decides auto, and an explicit request wins over it") {
  REQUIRE(choose_device("auto", "cpu", gpu_machine(8)).kind == "cpu");
  REQUIRE(choose_device("auto", "cpu", gpu_machine(8)).reason == "ZERO_DEVICE=cpu");
  REQUIRE(choose_device("auto", "cuda", gpu_machine(1)).reason == "ZERO_DEVICE=cuda");
  REQUIRE(choose_device("cpu", "cuda", no_gpu_machine()).kind == "cpu");
  REQUIRE_THROWS_WITH(choose_device("auto", "gpu", gpu_machine(1)),
                      Catch::Contains("ZERO_DEVICE=gpu") && Catch::Contains("cpu, cuda or auto"));
  REQUIRE_THROWS_WITH(choose_device("tpu", nullptr, gpu_machine(1)),
                      Catch::Contains("unknown device kind \"tpu\""));
}

TEST_CASE("asking for CUDA where it cannot run names who asked and what was found") {
  SECTION("no GPU") {
    REQUIRE_THROWS_WITH(
        choose_device("auto", "cuda", no_gpu_machine()),
        Catch::Contains("ZERO_DEVICE=cuda asks for a CUDA device") &&
            Catch::Contains("no CUDA device is visible") && Catch::Contains("cudaErrorNoDevice") &&
            Catch::Contains("CUDA_VISIBLE_DEVICES=<unset>") && Catch::Contains("ZERO_DEVICE=cpu"));
  }
  SECTION("a build without CUDA") {
    REQUIRE_THROWS_WITH(choose_device("cuda", nullptr, CudaAvailability{}),
                        Catch::Contains("the caller asks") && Catch::Contains("no CUDA support"));
  }
  SECTION("no driver") {
    CudaAvailability c = no_gpu_machine();
    c.driver_version = 0;
    REQUIRE_THROWS_WITH(
        choose_device("cuda", nullptr, c),
        Catch::Contains("no NVIDIA driver is installed") && Catch::Contains("runtime is 13.0"));
  }
  SECTION("a driver older than the toolkit") {
    CudaAvailability c = gpu_machine(4);
    c.driver_version = 12020;
    REQUIRE_THROWS_WITH(choose_device("auto", "cuda", c),
                        Catch::Contains("supports CUDA up to 12.2") &&
                            Catch::Contains("links the CUDA 13.0 runtime") &&
                            Catch::Contains("update the driver"));
    REQUIRE(choose_device("auto", nullptr, c).kind == "cpu");  // auto falls back, with the reason
    REQUIRE_THAT(choose_device("auto", nullptr, c).reason, Catch::Contains("12.2"));
  }
}

TEST_CASE("a device budget beyond the GPU's free memory is refused before anything is allocated") {
  const zero::CudaMemoryInfo info{std::size_t{6} << 30, std::size_t{80} << 30};
  zero::check_device_budget(0, std::nullopt, info);
  zero::check_device_budget(0, std::size_t{6} << 30, info);
  REQUIRE_THROWS_WITH(
      zero::check_device_budget(3, std::size_t{10} << 30, info),
      Catch::Contains("GPU 3") && Catch::Contains("10.0 GiB") && Catch::Contains("6.0 GiB free"));
}

TEST_CASE("a CUDA error names the call, the file and line, and the library's words") {
  const std::string message =
      zero::cuda_error_message("cudaMalloc(&p, bytes)", "/src/zero/zero/device/cuda_device.cpp", 42,
                               "cudaErrorMemoryAllocation", "out of memory");
  REQUIRE(message ==
          "cudaMalloc(&p, bytes) failed at zero/device/cuda_device.cpp:42: "
          "cudaErrorMemoryAllocation (out of memory)");
  REQUIRE_THROWS_AS(zero::throw_cuda_error("cudaFree(p)", "x.cpp", 1, "e", "t"), zero::CudaError);
}

TEST_CASE("on this machine ZERO_DEVICE=cuda without a GPU fails before any allocation") {
#if ZERO_TEST_HAVE_CUDA
  if (zero::kernels::cuda_device_count() > 0) {
    WARN("a GPU is visible: the no-GPU error cannot be produced here");
    return;
  }
  // Without a driver the runtime cannot count devices; with one, it counts none.
  const std::vector<std::string> found = {"no NVIDIA driver is installed",
                                          "no CUDA device is visible"};
#else
  const std::vector<std::string> found = {"no CUDA support"};
#endif
  ScopedEnv env("ZERO_DEVICE", "cuda");
  for (const auto& [kind, asker] :
       {std::pair{"auto", "ZERO_DEVICE=cuda asks"}, std::pair{"cuda", "the caller asks"}}) {
    INFO("make_device(\"" << kind << "\")");
    std::string message;
    try {
      zero::make_device(kind, 0);
    } catch (const zero::Error& e) {
      message = e.what();
    }
    INFO(message);
    REQUIRE(message.find(asker) != std::string::npos);
    REQUIRE(std::any_of(found.begin(), found.end(), [&](const std::string& f) {
      return message.find(f) != std::string::npos;
    }));
  }
  REQUIRE(zero::make_device("cpu", 0)->name() == "cpu");
  ScopedEnv cpu("ZERO_DEVICE", "cpu");
  REQUIRE(zero::make_device("auto", 0)->name() == "cpu");
}
