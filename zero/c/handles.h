// The structs behind the C ABI's opaque handles (zero/zero_c.h). Internal to zero/c.
#pragma once

#include <memory>
#include <string>

#include "config/ds_config.h"
#include "zero/comm/communicator.h"
#include "zero/comm/hierarchical_comm.h"
#include "zero/comm/node_topology.h"
#include "zero/device/device.h"
#include "zero/engine.h"

struct zero_comm {
  std::unique_ptr<zero::Communicator> comm;
  const char* backend = "inproc";  // static storage: what zero_comm_backend reports
};

struct zero_engine {
  // Declaration order is destruction order reversed: the engine goes first, then what it uses.
  // `own_comm` is set when the caller passed no communicator (one rank in this process).
  // `device_comm` carries the engine's collectives on a GPU (NCCL over the host communicator).
  std::unique_ptr<zero::Communicator> own_comm;
  std::unique_ptr<zero::Device> device;
  std::unique_ptr<zero::Communicator> device_comm;
  // On the CPU the engine's collectives go through a HierarchicalComm over the caller's
  // communicator: nodes from ZERO_RANKS_PER_NODE or the launcher's local world, and the bytes
  // each rank sends inside and across nodes, counted from `traffic_base` (zero_engine_timings_json).
  // On a GPU, one over `device_comm` where make_device_nodes asks for two levels; null otherwise.
  std::unique_ptr<zero::HierarchicalComm> nodes;
  zero::NodeTraffic traffic_base;
  std::unique_ptr<zero::config::DsConfig> config;
  std::unique_ptr<zero::Engine> engine;
  std::size_t num_groups = 1;
};
