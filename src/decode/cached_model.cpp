#include "decode/cached_model.hpp"

#include <string>

#include "core/error.hpp"
#include "model/embedding_bodies.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

template <typename T>
CachedModel<T>::CachedModel(Transformer<T>& model) : model_(model) {
  if (!model.first_stage() || !model.last_stage())
    throw InputError("decoding runs the whole model on every rank: a pipeline mesh (mesh.pipe > 1) is not supported");
  caches_.resize(model.blocks().size());
}

template <typename T>
void CachedModel<T>::reset(int streams, int capacity) {
  auto& blocks = model_.blocks();
  for (size_t b = 0; b < blocks.size(); ++b) caches_[b].reset(streams, capacity, model_.shape().d_model, blocks[b].attn);
}

template <typename T>
const Buffer<T>& CachedModel<T>::step(const int32_t* tokens, const CachedTokens& tok) {
  const int n = tok.n, M = model_.shape().d_model, V = model_.shape().vocab;
  const size_t nM = size_t(n) * M;
  StepContext ctx;
  ctx.training = false;
  ctx.moe_group_size = n;
  tokens_.assign(tokens, tokens + n);
  positions_.assign(tok.position, tok.position + n);
  for (int i = 0; i < n; ++i) {
    if (tokens_[i] < 0 || tokens_[i] >= V)
      throw Error("decoding: token id " + std::to_string(tokens_[i]) + " outside the vocabulary [0, " + std::to_string(V) + ")");
    if (positions_[i] < 0 || positions_[i] >= model_.shape().seq_len)
      throw Error("decoding: position " + std::to_string(positions_[i]) + " beyond model.seq_len = " +
                  std::to_string(model_.shape().seq_len));
  }
  x_.resize(nM);
  h_.resize(nM);
  f_.resize(nM);
  // x [n, M] = wte[token] + wpe[position] (the embedding's forward, at the tokens' own positions)
  const Embedding<T>& emb = model_.embedding();
  for_each_index_2d(n, M, EmbeddingForwardElement<T>{emb.wte.w, emb.wpe.w, tokens_.data(), positions_.data(), x_.data(), M});
  size_t b = 0;
  for (auto& block : model_.blocks()) {
    block.ln1.forward(ctx, x_.data(), h_.data(), n);
    caches_[b++].forward(block.attn, tok, h_.data(), f_.data());
    add_into(x_.data(), f_.data(), nM);
    block.ln2.forward(ctx, x_.data(), h_.data(), n);
    if (block.moe)
      block.moe->forward(ctx, h_.data(), f_.data(), n);
    else
      block.mlp->forward(ctx, h_.data(), f_.data(), n);
    add_into(x_.data(), f_.data(), nM);
  }
  model_.final_norm().forward(ctx, x_.data(), h_.data(), n);
  logits_.resize(size_t(n) * V);
  model_.output_head().forward(ctx, h_.data(), logits_.data(), n);
  if (agree_logits) agree_logits(logits_.data(), logits_.size());
  return logits_;
}

template <typename T>
const Buffer<T>& CachedModel<T>::prefill(const std::vector<std::vector<int32_t>>& prompts, std::vector<int>& last_row) {
  std::vector<int32_t> tokens, stream, position;
  last_row.clear();
  for (size_t b = 0; b < prompts.size(); ++b) {
    if (prompts[b].empty()) throw std::logic_error("CachedModel::prefill: an empty prompt");
    for (size_t t = 0; t < prompts[b].size(); ++t) {
      tokens.push_back(prompts[b][t]);
      stream.push_back(int32_t(b));
      position.push_back(int32_t(t));
    }
    last_row.push_back(int(tokens.size()) - 1);
  }
  return step(tokens.data(), CachedTokens{int(tokens.size()), stream.data(), position.data()});
}

template class CachedModel<float>;
template class CachedModel<double>;

}  // namespace meshmoe
