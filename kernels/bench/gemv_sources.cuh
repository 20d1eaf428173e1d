// The GEMV's kernel families and its host planner as one translation unit, for the torch-free bench drivers
// (ab_time.cu, phase_timing.cu): one nvcc command builds a driver, with the drivers' -D flags and phase hooks
// (stamps.cuh, included before this file) reaching every kernel.
#pragma once

// The drivers time and check the A/B paths too (mul1 through the fp16 kernel, the integer kernel's x' kernel), which
// the product build leaves out (exl3_gemv.cu says why).
#ifndef EXL3_AB_PATHS
#define EXL3_AB_PATHS
#endif

#include "../csrc/exl3_gemv.cu"
#include "../csrc/exl3_gemv_i8.cu"  // with the fused MoE (exl3_moe.cuh)
#include "../csrc/exl3_plan.cu"
