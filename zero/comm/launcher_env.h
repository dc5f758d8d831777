// Which launcher started this process, read from its environment, and the communicator that
// fits it.
//
//   torchrun (torch.distributed.run): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//     MASTER_ADDR, MASTER_PORT, and TORCHELASTIC_RUN_ID;
//   Open MPI's mpirun: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE;
//   MPICH's Hydra (and other PMI launchers): PMI_RANK, PMI_SIZE, and MPI_LOCALRANKID,
//     MPI_LOCALNRANKS.
//
// If several launchers' variables are present, torchrun's win, then Open MPI's.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "zero/comm/communicator.h"

namespace zero {

enum class Launcher { None, Torchrun, OpenMpi, Pmi };
std::string_view launcher_name(Launcher launcher);  // "none", "torchrun", "mpirun", "pmi"

struct LauncherEnv {
  Launcher launcher = Launcher::None;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 0;  // 0: the launcher did not say
  std::string master_addr;   // torchrun only
  int master_port = 0;       // torchrun only
  std::string run_id;        // TORCHELASTIC_RUN_ID, empty if unset

  // Whether every rank runs on this host: the local world is the whole world or, when the
  // launcher did not give the local world, (torchrun) MASTER_ADDR names this host (localhost,
  // a 127.x address, ::1, or this host's name).
  bool single_host() const;
};

// Reads the launcher's variables. With none set, a LauncherEnv for one rank (Launcher::None).
// Throws zero::Error, naming every problem at once, when only part of a launcher's required set
// is present ("RANK=1 is set but WORLD_SIZE, MASTER_PORT are not: launch with torchrun ... or
// unset RANK"), and for values that do not parse or are out of range ("RANK=4 is out of range
// for WORLD_SIZE=4").
LauncherEnv read_launcher_env();
// The same from `lookup` (a getenv) instead of the process environment.
LauncherEnv read_launcher_env(const std::function<const char*(const char*)>& lookup);

// The communicator for how this process was launched, decided from read_launcher_env() before
// any communication (every error is thrown before a collective):
//   * no launcher, or a world of one: a single-rank communicator (InProcWorld(1)'s rank 0);
//   * torchrun on one host: ShmComm over a segment every rank names identically and that is
//     unique per launch: from MASTER_PORT, TORCHELASTIC_RUN_ID and the launcher process (the
//     parent of every worker: its pid and start time);
//   * torchrun across hosts: zero::Error (zero has no TCP communicator);
//   * mpirun (or a PMI launcher) on one host: ShmComm, named by rank 0 and broadcast over MPI in
//     a build with MPI, else derived from the launcher process as for torchrun;
//   * mpirun across hosts: MpiComm, or zero::Error in a build without MPI.
// Collective over every rank of the launch.
std::unique_ptr<Communicator> make_env_communicator(const CommOptions& options = {});

}  // namespace zero
