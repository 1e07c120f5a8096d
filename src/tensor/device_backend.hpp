// The device backend (docs/ARCHITECTURE.md "Device work and transfer points"): one table that says
// where Buffers live, where loops and GEMMs run, and how device work is queued, waited for and
// copied. There are three, and the process uses one, chosen once at start-up by select_device
// (run/select_device.cpp; the tests switch around a case):
//  - the host: Buffers on the heap, loops and GEMMs run at once on the host (OpenBLAS);
//  - cuda (tensor/cuda_device.cu): Buffers in the GPU's arena, loops are kernels and GEMMs cuBLAS,
//    all queued on the rank's stream;
//  - the deferred host device (tensor/deferred_device.hpp, tests and MESHMOE_TEST_DEFERRED_DEVICE
//    runs): the host path under a GPU's rules, its work queued until device_synchronize and its
//    Buffers' pages closed to the host.
// Code above asks the table (current_device, buffers_on_device, run_host_work in device.hpp)
// instead of testing flags of its own.
#pragma once
#include <cstddef>
#include <functional>

#include "tensor/arena.hpp"
#include "tensor/compute_kinds.hpp"

namespace meshmoe {

struct DeviceBackend {
  const char* name;
  Device device;           // Cuda: launches are kernels and GEMMs cuBLAS; Cpu: host loops and OpenBLAS
  bool buffers_on_device;  // Buffers are device memory, which the host reaches only through the copies
  // Host loops and GEMMs queued until device_synchronize() instead of run now (null: run now).
  void (*queue_host_work)(std::function<void()> work);
  // Where Buffers come from (null: the host heap, 64-byte aligned, or the tests' host arena).
  Arena* (*arena)();
  // Called as device work is queued (null: nothing to do).
  void (*work_queued)();
  // The device's side of Buffers, in order with the queued work (device.cpp calls before_device_work
  // before each of the first three and device_synchronize before copy_to_host); on the host plain
  // memset and memcpy.
  void (*zero)(void* p, size_t bytes);
  void (*copy)(void* dst, const void* src, size_t bytes);                // Buffer to Buffer
  void (*copy_from_host)(void* device, const void* host, size_t bytes);  // from the host's bytes as they are now
  void (*copy_to_host)(void* host, const void* device, size_t bytes);
  // Waits for (or runs) the work queued so far.
  void (*wait)();
  // Device graphs (tensor/device_graph.hpp; all null where the work runs at once): the work queued
  // from begin_capture on is recorded instead; end_capture returns the recording (the backend's
  // graph), cancel_capture drops it, launch_graph queues it again, destroy_graph frees it.
  void (*begin_capture)();
  void* (*end_capture)();
  void (*cancel_capture)();
  void (*launch_graph)(void* graph);
  void (*destroy_graph)(void* graph);
};

extern const DeviceBackend kHostBackend;  // tensor/device.cpp
const DeviceBackend* cuda_backend();      // null in a build without CUDA (make CUDA=0)

// The process's backend: the host's until select_device chooses (a constant initialiser, so
// Buffers made during static initialisation find it too).
inline const DeviceBackend* g_device_backend = &kHostBackend;
inline const DeviceBackend& device_backend() { return *g_device_backend; }

// Makes `b` the process's backend, after the work queued on the one before has run. Buffers
// remember where they came from, so a Buffer made under one backend is still freed correctly under
// another; touching its elements is another matter (device memory's rules).
void set_device_backend(const DeviceBackend& b);

// For the backends: an arena of device memory over `chunks`, made once and never destroyed
// (Buffers may outlive static destruction order, and the CUDA context goes at exit). Its blocks
// carry no header (the host must not write device memory): buffer_free asks the device arenas
// whether a block is theirs.
Arena* make_device_arena(Arena::Backend chunks, size_t chunk_bytes);

}  // namespace meshmoe
