// Test helpers over src/run/memory.hpp: the memory plan against reality. measure_memory builds the
// real Transformer<float> of a rank's placement and measures it: the store sizes exactly, the
// optimizer state through state(), and the activations as heap growth (glibc mallinfo2: uordblks +
// hblkhd, i.e. in-use bytes of all arenas plus mmapped chunks) around the first forward and around
// the first backward of one micro-batch.
#pragma once
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "deck/config.hpp"
#include "mesh/comm.hpp"
#include "mesh/mesh.hpp"
#include "model/moe/router_equations.hpp"
#include "model/placement.hpp"
#include "model/shape_table.hpp"
#include "model/transformer.hpp"
#include "optim/optimizer.hpp"
#include "parallel/state_shards.hpp"
#include "run/memory.hpp"
#include "tensor/device_backend.hpp"

namespace meshmoe::test {

struct MemoryMeasured {
  size_t param_bytes = 0, grad_bytes = 0;  // ParamStore weights and gradients
  size_t optim_bytes = 0;                  // sum of the optimizer's state() tensors
  int64_t construct_heap = 0;              // heap growth of building the model (store included)
  int64_t forward_heap = 0;                // heap growth of the first forward of one micro-batch
  int64_t backward_heap = 0;               // heap growth of the first backward after it
};

// In-use heap bytes now (glibc mallinfo2: uordblks + hblkhd); where the Buffers live on a device
// (the deferred host device) the device arena's bytes in use instead, what the plan counts there
// (the heap then holds the host emulation's queued work and its GEMMs' scratch).
inline int64_t heap_in_use() {
  if (buffers_on_device()) return int64_t(device_backend().arena()->stats().in_use);
  const struct mallinfo2 mi = mallinfo2();
  return int64_t(mi.uordblks) + int64_t(mi.hblkhd);
}

// A Comm that moves nothing: lets measure_memory build and run a sharded layer on one process.
// Collectives leave the buffers as they are (an all-to-all copies its own blocks), so the values are
// wrong but every buffer has its real size.
class LocalStandInComm final : public Comm {
 public:
  LocalStandInComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override {}
  std::string name() const override { return "stand-in comm (measure_memory)"; }
  void all_reduce_raw(void*, size_t, DType, Op) override {}
  void broadcast_raw(void*, size_t, DType, int) override {}
  void all_gather_raw(const void* send, size_t n, void* recv, DType t) override {
    for (int r = 0; r < size_; ++r)
      std::memcpy(static_cast<char*>(recv) + r * n * dtype_size(t), send, n * dtype_size(t));
  }
  void reduce_scatter_raw(const void* send, void* recv, size_t n, DType t, Op) override {
    std::memcpy(recv, static_cast<const char*>(send) + rank_ * n * dtype_size(t), n * dtype_size(t));
  }
  void all_to_all_raw(const void* send, void* recv, size_t n, DType t) override {
    std::memcpy(recv, send, size_t(size_) * n * dtype_size(t));
  }
  void all_to_allv_raw(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                       DType t) override {
    size_t ns = 0, nr = 0;
    for (int r = 0; r < size_; ++r) ns += send_counts[r], nr += recv_counts[r];
    std::memcpy(recv, send, std::min(ns, nr) * dtype_size(t));
  }
  void permute_raw(const void*, size_t, int, void*, size_t, int, DType) override {}
  void send_raw(const void*, size_t, DType, int, int) override {}
  void recv_raw(void*, size_t, DType, int, int) override {}
  std::vector<size_t> exchange_counts(std::span<const size_t> send_counts) override {
    return {send_counts.begin(), send_counts.end()};
  }

 private:
  int rank_, size_;
};

// Builds the Transformer<float> (and optimizer) of the rank at (pipe_rank, data_rank, tensor_rank)
// of `mesh` on one process, with stand-in Comms (the values are wrong, the buffers are the real
// ones), and runs one training forward + backward on a dummy micro-batch of the plan's rows. Cheap
// only for test-size decks.
inline MemoryMeasured measure_memory(const Config& cfg, int vocab, const MeshShape& mesh, int pipe_rank, int data_rank,
                                     int tensor_rank) {
  // The start-up's sequence (docs/ARCHITECTURE.md "One run"), each piece once: the placement, its
  // shape table, the plan read from it, and the model built from the same table.
  Placement sh = placement_at(cfg, mesh, RankCoords{pipe_rank, data_rank, tensor_rank});
  const ShapeTable table(CheckedShapes(cfg, vocab, mesh, true), sh);
  const MemoryPlan plan = plan_memory(cfg, table, model_counts(cfg, table));
  MemoryMeasured m;
  LocalStandInComm tensor_comm(tensor_rank, mesh.tensor), expert_comm(sh.expert_rank(), sh.expert_parallel),
      replica_comm(data_rank / sh.expert_parallel, sh.replicas());
  sh.tensor = &tensor_comm;
  sh.expert_group = &expert_comm;
  sh.replica_group = &replica_comm;

  const int64_t h0 = heap_in_use();
  auto model = std::make_unique<Transformer<float>>(cfg, table, sh);
  m.construct_heap = heap_in_use() - h0;
  model->init(uint64_t(cfg.run.seed), cfg.model.init_scale);
  m.param_bytes = model->params().size() * sizeof(float) + model->params().weights16_bytes();
  m.grad_bytes = model->params().size() * sizeof(float);
  {
    const bool sharded = cfg.optim.shard_state && mesh.data > 1;
    auto opt = make_optimizer(cfg, model->params(),
                              sharded ? owned_entries(state_owners(model->params(), mesh.data), data_rank)
                                      : all_entries(model->params()));
    for (const StateTensor& s : opt->state()) m.optim_bytes += s.data->size() * sizeof(float);
  }

  // A dummy micro-batch of this rank's size; everything it needs exists before the measurement.
  const int rows = plan.rows, T = plan.seq_len, N = rows * T, M = int(cfg.model.d_model);
  std::vector<int32_t> inputs(N), targets(N);
  for (int n = 0; n < N; ++n) inputs[n] = int32_t((7919u * unsigned(n) + 13u) % unsigned(vocab)),
                              targets[n] = int32_t((104729u * unsigned(n) + 7u) % unsigned(vocab));
  std::vector<int32_t> segment(N, 0), position(N);  // one example per sequence
  for (int n = 0; n < N; ++n) position[n] = n % T;
  const size_t message = size_t(N) * M * size_t(model->stage_streams());  // between pipeline stages
  std::vector<float> mask(N, 1.0f), x_in(message), d_out(message);
  for (size_t i = 0; i < x_in.size(); ++i)
    x_in[i] = float(std::sin(0.37 * double(i))), d_out[i] = 1e-3f * float(std::cos(0.11 * double(i)));
  MicroBatch mb{rows, T, inputs.data(), targets.data(), mask.data(), segment.data(), position.data()};
  if (cfg.model.arch == ModelArch::EncDec)  // the encoder reads the same dummy tokens
    mb.enc_len = T, mb.enc_inputs = inputs.data(), mb.enc_segment = segment.data(), mb.enc_position = position.data();
  StepContext ctx;
  ctx.seed = uint64_t(cfg.run.seed);
  ctx.step = 1;
  ctx.training = true;
  ctx.token_offset = uint64_t(data_rank) * uint64_t(N);
  LossWeights w;
  w.ce = 1.0 / N;
  w.aux = balance_loss_weight(cfg.moe.balance, cfg.moe.aux_loss_coef, N, cfg.moe.group_size);
  w.z = z_loss_weight(cfg.moe.z_loss_coef, N);

  const int64_t f0 = heap_in_use();
  model->forward(ctx, mb, w, model->first_stage() ? nullptr : x_in.data());
  const int64_t f1 = heap_in_use();
  model->backward(ctx, w, model->last_stage() ? nullptr : d_out.data());
  const int64_t f2 = heap_in_use();
  m.forward_heap = f1 - f0;
  m.backward_heap = f2 - f1;
  return m;
}

}  // namespace meshmoe::test
