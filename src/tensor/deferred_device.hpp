// The deferred host device (docs/ARCHITECTURE.md "Device work and transfer points"): the host path
// run under a GPU's rules, so that a missing transfer point, a race on the GPU, shows without one.
// A device backend (tensor/device_backend.hpp) for the tests (test::DeferredHostDevice) and for
// runs of the executable with MESHMOE_TEST_DEFERRED_DEVICE (run/select_device.cpp,
// tests/scripts/deferred_device.sh):
//  - for_each_index, for_each_index_2d, for_each_row and the host GEMMs queue their work, and
//    device_synchronize() runs the queue in order;
//  - Buffers come from an arena of mapped pages that are inaccessible to the host while work is
//    queued (DeviceAccess::AfterWait: managed memory's rule), or always, but inside copy_to_host
//    and copy_from_host (Copies: cudaMalloc's rule), so a host access that breaks the rule stops
//    the run with SIGSEGV at that line; CopiesListed instead prints the call stack of each such
//    access once per place and goes on, so that one run lists them all.
#pragma once
#include <cstddef>

namespace meshmoe {

enum class DeviceAccess { AfterWait, Copies, CopiesListed };

// On: the deferred host device becomes the process's backend (from the host's; std::logic_error
// on the GPU); off: the host's again where it was on. Either way the work queued so far runs first.
void set_deferred_host_device(bool on, DeviceAccess access = DeviceAccess::AfterWait);

size_t deferred_host_work_queued();  // Tests only: the queue's length
size_t listed_host_accesses();       // Tests only, CopiesListed: the places printed so far

}  // namespace meshmoe
