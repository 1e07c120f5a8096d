// What a step's gradients need between the backward and the update (DESIGN.md "The mesh"): the
// gradients of parameters replicated over the data axis are summed over it, and the global norm
// counts every unique parameter element once, whatever the mesh.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

#include "mesh/mesh.hpp"
#include "model/transformer.hpp"

namespace meshmoe {

class GradientSync {
 public:
  // Plans the all-reduces and the norm's entries from the model's parameter table.
  GradientSync(Transformer<float>& model, Mesh& mesh);

  // Sums the gradients of data-replicated parameters over the data axis (all but experts split
  // over data): contiguous runs of them in the flat buffer, one all-reduce per run.
  void reduce_over_data();

  // The global gradient norm: each rank sums the squares of the elements it is responsible for
  // (a replicated parameter on one rank of its replicas: coordinate 0 of every axis it is not
  // split over; the tied copy on the last stage not at all), then one world all-reduce.
  double global_norm();

 private:
  Transformer<float>& model_;
  Mesh& mesh_;
  std::vector<std::pair<size_t, size_t>> data_replicated_ranges_;  // (flat offset, size)
  std::vector<size_t> norm_entries_;
};

}  // namespace meshmoe
