// Where the tensors live and in which format the float GEMMs read their operands. The tensor layer
// owns these types; the deck names them (run.device, model.precision: deck/options.hpp).
// Header-only and free of other project headers: the CUDA code includes it.
#pragma once

namespace meshmoe {

enum class Device { Cpu, Cuda };      // run.device (tensor/device.hpp)
enum class Precision { Fp32, Bf16 };  // model.precision (tensor/blas.hpp)

}  // namespace meshmoe
