#include "zero/comm/launcher_env.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <vector>

#include "zero/base/error.h"
#include "zero/comm/inproc_comm.h"
#include "zero/comm/process_watch.h"
#include "zero/comm/shared_memory_twin.h"
#include "zero/comm/shm_comm.h"

namespace zero {

namespace {

using Lookup = std::function<const char*(const char*)>;

// One launcher's variables: `required` must all be present once any of `triggers` is.
struct VariableSet {
  Launcher launcher;
  std::vector<const char*> triggers;
  std::vector<const char*> required;
  const char* how_to_launch;
};

const std::array<VariableSet, 3>& variable_sets() {
  static const std::array<VariableSet, 3> sets = {{
      {Launcher::Torchrun,
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
       {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"},
       "launch with torchrun (which sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
       "MASTER_ADDR and MASTER_PORT)"},
      {Launcher::OpenMpi,
       {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE"},
       {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE"},
       "launch with Open MPI's mpirun (which sets all four)"},
      {Launcher::Pmi,
       {"PMI_RANK", "PMI_SIZE"},
       {"PMI_RANK", "PMI_SIZE"},
       "launch with a PMI launcher such as MPICH's mpiexec (which sets both)"},
  }};
  return sets;
}

std::string join(const std::vector<std::string>& items) {
  return fmt::format("{}", fmt::join(items, ", "));
}

// Parses one integer variable into `out`; a problem is recorded if it is set but not an integer
// in [min, max] (`range` says what the bounds mean).
class Reader {
 public:
  explicit Reader(const Lookup& lookup) : lookup_(lookup) {}

  const char* get(const char* name) const { return lookup_(name); }

  std::optional<int> integer(const char* name, long long min, long long max,
                             const std::string& range) {
    const char* text = lookup_(name);
    if (text == nullptr) return std::nullopt;
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text, &end, 10);
    if (*text == '\0' || *end != '\0' || errno == ERANGE || v < INT_MIN || v > INT_MAX) {
      problems_.push_back(fmt::format("{}={} is not an integer", name, text));
      return std::nullopt;
    }
    if (v < min || v > max) {
      problems_.push_back(fmt::format("{}={} is out of range{}", name, text, range));
      return std::nullopt;
    }
    return static_cast<int>(v);
  }
  void problem(std::string text) { problems_.push_back(std::move(text)); }
  void throw_if_any(Launcher launcher) const {
    if (problems_.empty()) return;
    throw Error(fmt::format("launcher environment ({}): {}", launcher_name(launcher),
                            fmt::join(problems_, "; ")));
  }

 private:
  const Lookup& lookup_;
  std::vector<std::string> problems_;
};

// rank, world size, local rank and local world size from four variables (the last two
// optional when `local_optional`).
void read_ranks(Reader& r, LauncherEnv& env, const char* rank, const char* size,
                const char* local_rank, const char* local_size) {
  const std::optional<int> world = r.integer(size, 1, INT_MAX, " (at least 1)");
  const int w = world.value_or(INT_MAX);
  const std::optional<int> me =
      r.integer(rank, 0, w - 1, world ? fmt::format(" for {}={}", size, w) : std::string());
  const std::optional<int> local_world =
      r.integer(local_size, 1, w, world ? fmt::format(" (1 to {}={})", size, w) : " (at least 1)");
  const int lw = local_world.value_or(w);
  const std::optional<int> local_me =
      r.integer(local_rank, 0, lw - 1,
                local_world ? fmt::format(" for {}={}", local_size, lw) : std::string());
  env.world_size = world.value_or(1);
  env.rank = me.value_or(0);
  env.local_world_size = local_world.value_or(0);
  env.local_rank = local_me.value_or(0);
}

bool is_local_address(const std::string& addr) {
  if (addr == "localhost" || addr == "::1" || addr == "[::1]" || addr.rfind("127.", 0) == 0) {
    return true;
  }
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return false;
  const std::string name = host;
  const std::string short_name = name.substr(0, name.find('.'));
  return addr == name || addr == short_name;
}

std::uint64_t fnv1a(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// A name every rank started by the same launcher process derives alike: torchrun's workers (and
// mpirun's ranks on its own host) are all children of the launcher, whose pid and start time
// no other launch shares.
std::string launcher_segment_name(std::string_view launcher, std::string_view launch_key) {
  const comm_detail::ProcessId parent =
      comm_detail::process_with_pid(static_cast<std::int32_t>(::getppid()));
  return fmt::format("zero-{}-{:016x}-{}-{}", launcher, fnv1a(launch_key), ::getppid(),
                     parent.start_ticks);
}

std::unique_ptr<Communicator> single_rank(const CommOptions& options) {
  InProcWorld world(1, options);
  return world.comm(0);  // keeps the world's state alive
}

}  // namespace

std::string_view launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::None: return "none";
    case Launcher::Torchrun: return "torchrun";
    case Launcher::OpenMpi: return "mpirun";
    case Launcher::Pmi: return "pmi";
  }
  return "?";
}

bool LauncherEnv::single_host() const {
  if (world_size <= 1) return true;
  if (local_world_size > 0) return local_world_size == world_size;
  return launcher == Launcher::Torchrun && is_local_address(master_addr);
}

LauncherEnv read_launcher_env() {
  return read_launcher_env([](const char* name) { return std::getenv(name); });
}

LauncherEnv read_launcher_env(const Lookup& lookup) {
  Reader r(lookup);
  for (const VariableSet& set : variable_sets()) {
    std::vector<std::string> present;
    std::vector<std::string> triggered;
    for (const char* name : set.triggers) {
      if (const char* v = lookup(name)) triggered.push_back(fmt::format("{}={}", name, v));
    }
    if (triggered.empty()) continue;
    std::vector<std::string> missing;
    std::vector<std::string> trigger_names;
    for (const char* name : set.required) {
      if (const char* v = lookup(name)) {
        present.push_back(fmt::format("{}={}", name, v));
      } else {
        missing.push_back(name);
      }
    }
    for (const char* name : set.triggers) {
      if (lookup(name) != nullptr) trigger_names.push_back(name);
    }
    if (!missing.empty()) {
      // Name what is set (the triggers first), what is missing, and both ways out.
      std::vector<std::string> set_now = triggered;
      for (const std::string& p : present) {
        if (std::find(set_now.begin(), set_now.end(), p) == set_now.end()) set_now.push_back(p);
      }
      throw Error(fmt::format("{} {} set but {} {} not: {}, or unset {}", join(set_now),
                              set_now.size() == 1 ? "is" : "are", join(missing),
                              missing.size() == 1 ? "is" : "are", set.how_to_launch,
                              join(trigger_names)));
    }

    LauncherEnv env;
    env.launcher = set.launcher;
    switch (set.launcher) {
      case Launcher::Torchrun: {
        read_ranks(r, env, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
        env.master_addr = lookup("MASTER_ADDR");
        if (env.master_addr.empty()) r.problem("MASTER_ADDR is empty");
        env.master_port = r.integer("MASTER_PORT", 1, 65535, " (1 to 65535)").value_or(0);
        if (const char* id = lookup("TORCHELASTIC_RUN_ID")) env.run_id = id;
        break;
      }
      case Launcher::OpenMpi:
        read_ranks(r, env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                   "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE");
        if (const char* id = lookup("OMPI_MCA_ess_base_jobid")) env.run_id = id;
        break;
      case Launcher::Pmi:
        read_ranks(r, env, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS");
        break;
      case Launcher::None: break;
    }
    r.throw_if_any(set.launcher);
    return env;
  }
  return {};
}

std::unique_ptr<Communicator> make_env_communicator(const CommOptions& options) {
  const LauncherEnv env = read_launcher_env();
  if (env.launcher == Launcher::None || env.world_size == 1) return single_rank(options);
  const bool one_host = env.single_host();
  if (env.launcher == Launcher::Torchrun) {
    ZERO_CHECK(one_host,
               "torchrun started {} ranks on several hosts (LOCAL_WORLD_SIZE={}, MASTER_ADDR={}), "
               "but zero has no communicator between hosts for torchrun: run every rank on one "
               "host (shared memory), or launch with mpirun in a build with MPI",
               env.world_size,
               env.local_world_size > 0 ? std::to_string(env.local_world_size) : "unset",
               env.master_addr);
    const std::string key = fmt::format("{}:{}", env.master_port, env.run_id);
    return make_shm_communicator(launcher_segment_name("torchrun", key), env.rank, env.world_size,
                                 options);
  }
  const bool with_mpi = communicator_available("mpi");
  ZERO_CHECK(one_host || with_mpi,
             "{} started {} ranks on several hosts ({} on this one), but this build has no MPI "
             "to connect them (MPI was not found at configure time, or ZERO_WITH_MPI=OFF)",
             launcher_name(env.launcher), env.world_size, env.local_world_size);
  if (!with_mpi) {
    return make_shm_communicator(launcher_segment_name(launcher_name(env.launcher), env.run_id),
                                 env.rank, env.world_size, options);
  }
  auto mpi = make_communicator("mpi", options);
  if (!one_host) return mpi;
  // Over MPI: rank 0 makes a name with a random part and broadcasts it.
  const std::string name = comm_detail::agreed_segment_name(*mpi, "mpi");
  return make_shm_communicator(name, mpi->rank(), mpi->size(), options);
}

}  // namespace zero
