#include "model/moe/token_dispatcher.hpp"

namespace meshmoe {

// The one choice of dispatcher, from where the placement puts the experts.
template <typename T>
typename TokenDispatcher<T>::Impl TokenDispatcher<T>::choose(const Placement& place, int E, int M) {
  if (place.expert_parallel_data()) return Impl(std::in_place_type<AllToAllDispatcher<T>>, place, E, M);
  if (place.expert_parallel_tensor()) return Impl(std::in_place_type<IndexSelectDispatcher<T>>, place, E, M);
  return Impl(std::in_place_type<LocalDispatcher<T>>, E, M);
}

template <typename T>
TokenDispatcher<T>::TokenDispatcher(const Placement& place, int E, int M) : impl_(choose(place, E, M)) {}

template <typename T>
std::string_view TokenDispatcher<T>::name() const {
  constexpr std::string_view names[] = {"local", "all-to-all", "index-select"};
  return names[impl_.index()];
}

template class TokenDispatcher<float>;
template class TokenDispatcher<double>;

}  // namespace meshmoe
