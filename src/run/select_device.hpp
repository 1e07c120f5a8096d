// run.device for the whole job, and run.threads against the cores a rank may use.
#pragma once
#include <mpi.h>

#include <string>

#include "deck/options.hpp"

namespace meshmoe {

// Puts this process on run.device: the device backend (tensor/device_backend.hpp) chosen once,
// before the model allocates anything: the host's, the GPU's, or with MESHMOE_TEST_DEFERRED_DEVICE
// (tests only) the deferred host device. With "cuda" each rank binds to a GPU of its node
// (node-local rank modulo the GPUs it sees). Collective
// over `world`: when any rank cannot, every rank throws InputError with the first failing rank's
// reason and host, so no rank is left waiting in a later collective. Sets the precision of the
// model's GEMMs (model.precision, tensor/blas.hpp) too. Returns a line for the log.
std::string select_device(Device device, Precision precision, MPI_Comm world);

// More threads than allowed cores share them: the run is as slow as with fewer threads, and the
// sgemm peak MFU is measured against is too (every rank checks; rank 0 says it once). Collective.
void warn_threads_over_cores(int threads, MPI_Comm world);

}  // namespace meshmoe
