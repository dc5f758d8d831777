// The memory roofline of an optimizer step: the same loads and stores per element as
// optimizer_step_cpu (same dtypes, same tiling, same OpenMP split), with one add per array in
// place of the update. Its speed is what optimizer_step_cpu could reach if arithmetic were free.
#pragma once

#include "kernels/isa.h"
#include "kernels/optimizer.h"

namespace zero::kernels {

// Overwrites the arrays of `tensors` (values become meaningless). `state_count` as returned by
// optimizer_state_count(). Same argument checks as optimizer_step_cpu.
void traffic_probe_cpu(const OptimizerTensors& tensors, int state_count, const CpuExec& exec = {});

// Bytes the step moves per element: reads and writes of master and states, gradient reads, and
// the param_out write.
std::size_t optimizer_bytes_per_elem(const OptimizerTensors& tensors, int state_count);

}  // namespace zero::kernels
