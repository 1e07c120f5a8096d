// meshmoe: command line and wiring. Subcommands: train, distill, plan, prep, deck-doc, bench-comm, bench-gemm,
// ckpt, export, score, generate, translate, eval; --version.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "data/prep.hpp"
#include "app/decode_cli.hpp"
#include "app/decode_deck.hpp"
#include "app/eval_cli.hpp"
#include "app/prep_cli.hpp"
#include "deck/deck.hpp"
#include "mesh/agree.hpp"
#include "mesh/mesh.hpp"
#include "app/bench_comm.hpp"
#include "app/score_cli.hpp"
#include "tensor/gemm_rate.hpp"
#include "tensor/device.hpp"
#include "tensor/host_threads.hpp"
#include "app/checkpoint_cli.hpp"
#include "app/export_cli.hpp"
#include "train/distill.hpp"
#include "checkpoint/checkpoint.hpp"
#include "run/run_checkpoints.hpp"
#include "run/signals.hpp"
#include "run/node_placement.hpp"
#include "run/run_directory.hpp"
#include "run/startup.hpp"
#include "train/trainer.hpp"

#ifndef MESHMOE_VERSION
#define MESHMOE_VERSION "unknown"
#endif

namespace meshmoe {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// The lines of `text` ("a\nb\n" -> {a, b}).
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1)
    lines.push_back(text.substr(start, end - start));
  if (start < text.size()) lines.push_back(text.substr(start));
  return lines;
}

// "optim.lr" for the line "lr = 0.001" under "[optim]" of an effective deck.
std::string deck_key_of_line(const std::vector<std::string>& lines, size_t i) {
  if (i >= lines.size()) return "the end of the deck";
  const std::string& line = lines[i];
  if (!line.empty() && line[0] == '[') return "section " + line;
  std::string section;
  for (size_t j = i; j-- > 0;)
    if (!lines[j].empty() && lines[j][0] == '[') {
      section = lines[j].substr(1, lines[j].find(']') - 1) + ".";
      break;
    }
  const size_t eq = line.find(" =");
  return "key " + section + (eq == std::string::npos ? line : line.substr(0, eq));
}

// Reads the deck on rank 0 and broadcasts it; every rank applies its --set options, and the ranks
// must then hold the same effective deck (docs/user-guide.md "Faults on a cluster": a mixed launch).
Deck load_agreed_deck(const std::string& path, const std::vector<std::string>& overrides) {
  Deck deck = load_deck(path, overrides, MPI_COMM_WORLD);
  agree_on_lines("effective deck", lines_of(deck.effective_toml), deck_key_of_line, MPI_COMM_WORLD);
  return deck;
}

// Reads the deck (load_agreed_deck), checks the launch and builds the mesh.
struct Setup {
  Deck deck;
  Mesh mesh;
};
Setup setup(Deck deck) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  check_world_size(deck.cfg, world);
  Mesh mesh(MPI_COMM_WORLD, int(deck.cfg.mesh.pipe), int(deck.cfg.mesh.data), int(deck.cfg.mesh.tensor));
  ShmSettings shm;
  shm.enabled = deck.cfg.run.shm_collectives;
  mesh.set_shm(shm);
  return Setup{std::move(deck), std::move(mesh)};
}
Setup setup(const std::string& path, const std::vector<std::string>& overrides) {
  return setup(load_agreed_deck(path, overrides));
}

// A decoding command's deck (app/decode_deck.hpp: the checkpoint's model, the mesh of the ranks
// launched), agreed by every rank, and its mesh.
Setup decoding_setup(const std::string& checkpoint, const std::string& path, const std::vector<std::string>& overrides) {
  Deck deck = decoding_deck(checkpoint, path, overrides, MPI_COMM_WORLD);
  agree_on_lines("effective deck", lines_of(deck.effective_toml), deck_key_of_line, MPI_COMM_WORLD);
  return setup(std::move(deck));
}

// The nodes `plan` places the mesh on: --ranks-per-node, else Slurm's SLURM_NTASKS_PER_NODE, else
// `otherwise` (src/run/node_placement.hpp).
NodeMap planned_nodes(int world, int ranks_per_node, const NodeMap& otherwise) {
  const int slurm = slurm_ranks_per_node();
  return ranks_per_node > 0 ? nodes_in_blocks(world, ranks_per_node, "--ranks-per-node " + std::to_string(ranks_per_node))
         : slurm > 0        ? nodes_in_blocks(world, slurm, "SLURM_NTASKS_PER_NODE " + std::to_string(slurm))
                            : otherwise;
}

// Rank 0: the placement on `nodes` with the bytes each axis sends across them.
void print_placement(const Config& cfg, const MeshShape& shape, const Startup& start, const NodeMap& nodes) {
  if (world_rank() != 0 || start.vocab() <= 0) return;
  std::vector<MemoryPlan> stages;
  for (int p = 0; p < shape.pipe; ++p) stages.push_back(plan_memory(cfg, start.vocab(), shape, p, 0, 0));
  const int P = placement_at(cfg, shape, RankCoords{0, 0, 0}).expert_parallel;
  std::cout << placement_report(shape, nodes, node_crossings(shape, nodes, stages, P)) << std::flush;
}

// `plan` in one process for a mesh of any size (docs/user-guide.md "Planning in one process"): the same mesh text,
// memory table and placement as under mpirun with the mesh's ranks, from the deck and the shape
// alone; the nodes are blocks of --ranks-per-node (else SLURM_NTASKS_PER_NODE) ranks named
// "node N", or one node, and with a node size the memory check takes this machine's memory (or
// run.max_memory) as a node's.
int plan_in_one_process(const Deck& deck, const MeshShape& shape, int ranks_per_node) {
  const int world = shape.size();
  const NodeMap nodes = planned_nodes(world, ranks_per_node, nodes_in_blocks(world, world, "one node (give --ranks-per-node)"));
  std::vector<std::string> hosts;
  for (int r = 0; r < world; ++r) hosts.push_back(nodes.names[size_t(nodes.node_of[size_t(r)])]);
  std::cout << describe_planned_mesh(shape, hosts) << std::flush;
  const Startup start = Startup::stages(deck.cfg, shape, MPI_COMM_WORLD);
  NodeShare node;  // per_rank 0: not checked
  if (nodes.nodes() > 1 || ranks_per_node > 0 || slurm_ranks_per_node() > 0) {
    node = node_share(deck.cfg.run.max_memory, MPI_COMM_SELF);
    const int per_node = int(nodes.ranks_of(0).size());
    node.per_rank /= per_node;
    node.ranks = per_node;
    if (deck.cfg.run.max_memory.empty()) node.source += ", this machine's as a planned node's";
  }
  std::cout << start.memory_report(MPI_COMM_WORLD, &node) << std::flush;
  std::cout << "nodes seen by MPI: none: planned in one process for " << world << " ranks\n" << std::flush;
  print_placement(deck.cfg, shape, start, nodes);
  return kExitOk;
}

int cmd_plan(const std::string& path, const std::vector<std::string>& overrides, int ranks_per_node) {
  Deck deck = load_agreed_deck(path, overrides);
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const MeshShape shape{int(deck.cfg.mesh.pipe), int(deck.cfg.mesh.data), int(deck.cfg.mesh.tensor)};
  if (world == 1 && shape.size() > 1) return plan_in_one_process(deck, shape, ranks_per_node);
  Setup s = setup(std::move(deck));
  const std::string text = s.mesh.describe();
  if (world_rank() == 0) std::cout << text << std::flush;
  // The nodes: as MPI sees them, and the placement planned for (--ranks-per-node, else Slurm's
  // SLURM_NTASKS_PER_NODE, else MPI's), with the bytes each axis sends across them (src/run/node_placement.hpp).
  const NodeMap seen = nodes_seen_by_mpi(MPI_COMM_WORLD);
  const NodeMap nodes = planned_nodes(s.mesh.shape().size(), ranks_per_node, seen);
  // Memory and cost per rank, one column per pipeline stage, each stage's pieces once (src/run/startup.hpp).
  const Startup start = Startup::stages(s.deck.cfg, s.mesh);
  const std::string memory = start.memory_report(s.mesh.world());
  if (world_rank() == 0) std::cout << memory << std::flush;
  if (world_rank() == 0) std::cout << describe_nodes(seen, "nodes seen by MPI") << std::flush;
  print_placement(s.deck.cfg, s.mesh.shape(), start, nodes);
  return kExitOk;
}

// The first line of train and distill: the deck, its overrides and where its effective deck goes
// (RUN/deck.toml, written before the first step); with --verbose the effective deck itself.
void print_deck_summary(const Deck& deck, const std::vector<std::string>& overrides, bool verbose) {
  std::string sets;
  for (const std::string& o : overrides) sets += " " + o;
  std::cout << "# deck " << deck.path << (overrides.empty() ? "" : " with --set") << sets << "; its effective deck (every key) goes to "
            << run_directory(deck.cfg) << "/deck.toml" << (verbose ? "" : " (--verbose prints it here)") << "\n";
  if (verbose) std::cout << "# effective deck (" << deck.path << ")\n" << deck.effective_toml;
  std::cout << std::flush;
}

// train, or with a teacher, distill (src/train/distill.hpp).
int cmd_train(const std::string& path, const std::vector<std::string>& overrides, const TrainOptions& opt, bool verbose,
              const DistillOptions* distill = nullptr) {
  Setup s = setup(path, overrides);
  // The placement, shape table and memory plan, each once, and the memory check: exit 2 before
  // anything is allocated (src/run/startup.hpp).
  const Startup start = Startup::training(s.deck.cfg, s.mesh);
  if (world_rank() == 0) print_deck_summary(s.deck, overrides, verbose);
  if (distill) return distill_main(s.deck, s.mesh, start, MESHMOE_VERSION, *distill);
  return train_main(s.deck, s.mesh, start, MESHMOE_VERSION, opt);
}

constexpr const char* kDecodingDeck =
    "Input deck (TOML), optional: the model comes from the checkpoint's stored deck; the deck's data, eval and decoding "
    "keys apply, a model key that disagrees with the checkpoint is refused (exit 2), its [mesh] is not used (the mesh: "
    "--set mesh.*, else all ranks on data)";

constexpr const char* kAllowOtherData =
    "Use a checkpoint trained on other data than data.path (exit 2 otherwise): its tokens are read with this data's "
    "tokenizer and its per-language counts by index into this data's language table";

// The checkpoint a decoding command (generate, translate, eval) names was trained on data.path's
// data (run/run_checkpoints.hpp), checked before its model is loaded.
void check_decoding_data(const std::string& checkpoint, const Deck& deck, bool allow_other_data) {
  const std::string file = resolve_named_checkpoint(checkpoint, "--checkpoint", MPI_COMM_WORLD);
  check_checkpoint_data("--checkpoint", file, deck.cfg.data.path, allow_other_data, MPI_COMM_WORLD);
}

int run(int argc, char** argv) {
  // The first collective of every command: every rank runs the same command line (subcommand,
  // deck, --set and every other option), so that a mixed launch (train beside plan, another
  // optim.lr on one rank) stops at once with exit 2 instead of training apart or waiting forever
  // in a collective the other command never makes.
  agree_on_lines("command line", std::vector<std::string>(argv + 1, argv + argc),
                 [](const std::vector<std::string>&, size_t i) { return "argument " + std::to_string(i + 1); },
                 MPI_COMM_WORLD);
  CLI::App app{"meshmoe: sharded Mixture-of-Experts Transformer training (GShard, Switch, Pipeline-MoE)"};
  app.set_version_flag("--version", std::string("meshmoe ") + MESHMOE_VERSION +
                                        (cuda_compiled() ? " (host: OpenBLAS + MPI; CUDA: cuBLAS + NCCL)"
                                                         : " (host: OpenBLAS + MPI; built without CUDA)"));
  app.require_subcommand(1);

  std::string deck_path;
  std::vector<std::string> overrides;
  auto* train = app.add_subcommand("train", "Train the model described by an input deck");
  train->add_option("deck", deck_path, "Input deck (TOML)")->required();
  train->add_option("--set", overrides, "Override a deck key: section.key=value (repeatable)");
  bool verbose = false;
  constexpr const char* kVerbose = "Print the effective deck (every key, after --set) at start; it is always written to "
                                   "the run directory's deck.toml";
  train->add_flag("-v,--verbose", verbose, kVerbose);
  TrainOptions train_opt;
  auto* init_from_opt = train->add_option("--init-from", train_opt.init_from,
                    "Fresh start only: copy every parameter whose name and shape match from this checkpoint (file, or a "
                    "ckpt / run directory: its LATEST; of any model, any mesh) or safetensors file (meshmoe export); the "
                    "others keep their initialisation. Refused (exit 2) when a tensor has another shape or nothing matches");
  train->add_flag("--init-partial", train_opt.init.partial,
                  "With --init-from: copy what matches even when some tensors have another shape or none matches, and "
                  "list what stays at its initialisation")
      ->needs(init_from_opt);
  auto* upcycle_flag = train->add_flag("--upcycle", train_opt.init.upcycle,
                  "With --init-from a dense model: sparse upcycling (Komatsuzaki et al. 2023): each expert of MoE block i "
                  "starts as the dense feed-forward of block i, the router freshly initialised")
                          ->needs(init_from_opt);
  train->add_option("--upcycle-noise", train_opt.init.upcycle_noise,
                    "With --upcycle: multiply each expert weight by 1 + eps (2u - 1), u uniform in [0, 1) from Philox "
                    "(run.seed, block, element): the same on every mesh (default 0: exact copies)")
      ->check(CLI::Range(0.0, 1.0))
      ->needs(upcycle_flag);
  DistillOptions distill_opt;
  auto* distill = app.add_subcommand("distill", "Train the deck's model with a trained teacher (Switch 4.2): init from its "
                                                "non-expert weights, loss mixing its probabilities (distill.alpha)");
  distill->add_option("deck", deck_path, "Input deck (TOML) of the student")->required();
  distill->add_option("--set", overrides, "Override a deck key: section.key=value (repeatable)");
  distill->add_option("--teacher", distill_opt.teacher, "Teacher checkpoint file, or a ckpt / run directory (its LATEST)")
      ->required();
  distill->add_option("--baseline", distill_opt.baseline,
                      "Checkpoint (file, or a ckpt / run directory: its LATEST) of a model trained without the teacher: report "
                      "the share of the teacher's gain kept");
  distill->add_flag("--allow-other-data", distill_opt.allow_other_data, kAllowOtherData);
  distill->add_flag("-v,--verbose", verbose, kVerbose);
  auto* plan = app.add_subcommand("plan", "Print the device mesh and the plan of a deck without training (as one process: "
                                          "a mesh of any size, without its ranks)");
  plan->add_option("deck", deck_path, "Input deck (TOML)")->required();
  plan->add_option("--set", overrides, "Override a deck key: section.key=value (repeatable)");
  bool ranks_only = false;
  plan->add_flag("--ranks", ranks_only, "Only print the number of ranks the deck's mesh needs (for job scripts)");
  int ranks_per_node = 0;
  plan->add_option("--ranks-per-node", ranks_per_node,
                   "Ranks per node to place the mesh on, in blocks of consecutive ranks (default: SLURM_NTASKS_PER_NODE, "
                   "else the nodes MPI sees): print which axes cross nodes and the bytes they send across")
      ->check(CLI::Range(1, 1 << 20));
  auto* deck_doc = app.add_subcommand("deck-doc", "Print the reference of every deck key as markdown");

  auto* prep = app.add_subcommand("prep", "Turn text sources into a dataset file (HDF5)");
  prep->require_subcommand(1);
  PrepGettextOptions gettext_opt;
  auto* prep_gettext = prep->add_subcommand("gettext", "English msgid -> translation pairs from every gettext catalog");
  prep_gettext->add_option("-o,--output", gettext_opt.output, "Dataset file to write")->required();
  prep_gettext->add_option("--root", gettext_opt.root, "Locale tree scanned as ROOT/<lang>/LC_MESSAGES/*.mo")
      ->capture_default_str();
  prep_gettext->add_option("--max-len", gettext_opt.max_len, "Drop pairs whose example is longer (tokens)")
      ->capture_default_str();
  prep_gettext->add_option("--valid-percent", gettext_opt.valid_percent, "Percent of English strings held out")
      ->capture_default_str();
  prep_gettext->add_option("--min-pairs", gettext_opt.min_pairs, "Drop languages with fewer pairs")->capture_default_str();
  prep_gettext->add_option("--languages", gettext_opt.languages, "Keep only these languages (comma-separated)")
      ->delimiter(',');
  prep_gettext->add_option("--tokenizer", gettext_opt.tokenizer, "Text tokens: bytes, or spm (SentencePiece trained on the train split)")
      ->capture_default_str();
  prep_gettext->add_option("--spm-pieces", gettext_opt.spm_pieces, "SentencePiece vocabulary size (--tokenizer spm)")
      ->capture_default_str();
  prep_gettext->add_option("--spm-sample", gettext_opt.spm_sample,
                           "Train the SentencePiece vocabulary on a fixed sample of this many train texts (0: all); "
                           "every pair is encoded with it")
      ->capture_default_str();
  prep_gettext->add_option("--threads", gettext_opt.threads,
                           "Threads encoding the pairs (default 0: OPENBLAS_NUM_THREADS, or 1); the file does not depend on it");
  prep_gettext->add_option("--direction", gettext_opt.direction,
                           "xx-en: translation (source, tagged with its language) to English (target); en-xx: English "
                           "to the translation, the tag naming the target language")
      ->capture_default_str();
  prep_gettext->add_flag("-q,--quiet", gettext_opt.quiet, "No progress lines");
  PrepTextOptions text_opt;
  auto* prep_text = prep->add_subcommand("text", "One example per line (or paragraph) of UTF-8 text files");
  prep_text->add_option("files", text_opt.files, "Text files")->required();
  prep_text->add_option("-o,--output", text_opt.output, "Dataset file to write")->required();
  prep_text->add_option("--max-len", text_opt.max_len, "Cut longer lines into pieces of this many tokens")
      ->capture_default_str();
  prep_text->add_option("--valid-percent", text_opt.valid_percent, "Percent of lines held out")->capture_default_str();
  prep_text->add_flag("--paragraphs", text_opt.paragraphs, "One example per blank-line separated paragraph");
  prep_text->add_option("--tokenizer", text_opt.tokenizer, "Text tokens: bytes, or spm (SentencePiece trained on the train split)")
      ->capture_default_str();
  prep_text->add_option("--spm-pieces", text_opt.spm_pieces, "SentencePiece vocabulary size (--tokenizer spm)")
      ->capture_default_str();
  prep_text->add_option("--spm-sample", text_opt.spm_sample,
                        "Train the SentencePiece vocabulary on a fixed sample of this many train lines (0: all)")
      ->capture_default_str();
  prep_text->add_flag("-q,--quiet", text_opt.quiet, "No progress lines");

  BenchCommOptions bench_opt;
  auto* bench = app.add_subcommand("bench-comm", "Time all_reduce, all_to_all, all_gather, permute against message size");
  bench->add_option("--sizes", bench_opt.sizes, "Bytes per rank, comma-separated, K/M/G suffixes (default 1K,4K,...,16M)");
  bench->add_option("--ops", bench_opt.ops, "Ops to time, comma-separated (default all_reduce,all_to_all,all_gather,permute)");
  bench->add_option("--mesh", bench_opt.mesh, "Mesh PxDxT (default: all ranks along --axis)");
  bench->add_option("--axis", bench_opt.axis, "Axis to time along: data, tensor or pipe")->capture_default_str();
  bench->add_option("--iters", bench_opt.iters, "Timed calls per size, at most 1000000 (default 0: adaptive, >= 0.05 s or 100 calls)");
  bench->add_option("-o,--output", bench_opt.output, "HDF5 file written by rank 0 (through a temporary file and a rename; replaces only an earlier bench-comm result)")->capture_default_str();
  bench->add_flag("-q,--quiet", bench_opt.quiet, "No table on stdout");
  bench->add_option("--max-memory", bench_opt.max_memory, "Memory per node the buffers may use, e.g. 8G (default: cgroup limit or MemAvailable)");
  bench->add_option("--shm", bench_opt.shm, "on: all_reduce of >= 256 KiB through a shared-memory window when the group is on one node (run.shm_collectives); resident: with its buffer in node-shared memory, as the trainer's gradients; off: MPI's")
      ->capture_default_str();
  bench->add_option("--device", bench_opt.device, "cpu: host buffers through MPI; cuda: one GPU per rank, device buffers through NCCL")
      ->capture_default_str();

  CkptCliOptions ckpt_opt;
  ExportCliOptions export_opt;
  auto* export_cmd = app.add_subcommand("export", "Write a checkpoint's parameters in logical shapes as a safetensors file, "
                                           "with its deck and tokenizer (docs/export.md)");
  export_cmd->add_option("checkpoint", export_opt.checkpoint, "Checkpoint file, or a ckpt / run directory (its LATEST)")->required();
  export_cmd->add_option("-o,--output", export_opt.output, "The safetensors file to write (through a temporary file beside it and a rename; never an input)")->required();
  export_cmd->add_option("--data", export_opt.data,
                  "Dataset whose tokenizer goes into the metadata (default: the data.path the checkpoint was trained on)");
  export_cmd->add_option("--layout", export_opt.layout,
                         "meshmoe: meshmoe's tensor names and shapes; hf: the Hugging Face Mixtral checkpoint's "
                         "(MixtralForCausalLM), with -o DIR writing DIR/model.safetensors and DIR/config.json")
      ->check(CLI::IsMember({"meshmoe", "hf"}))
      ->capture_default_str();
  export_cmd->add_option("--config", export_opt.config, "With --layout hf: write the MixtralConfig config.json here");
  BenchGemmOptions gemm_opt;
  auto* bench_gemm = app.add_subcommand("bench-gemm", "Measure the fp32 sgemm ceiling (GFLOP/s) that MFU and make bench compare against");
  bench_gemm->add_option("--threads", gemm_opt.threads, "BLAS threads per rank (default 0: OPENBLAS_NUM_THREADS, or 1)");
  bench_gemm->add_option("--sizes", gemm_opt.sizes, "Matrix sizes n, comma-separated")->capture_default_str();
  bench_gemm->add_option("--seconds", gemm_opt.seconds, "Time spent per size, in (0, 3600] (the best call counts)")->capture_default_str();
  auto* ckpt = app.add_subcommand("ckpt", "Inspect a checkpoint (file, ckpt directory or run directory)");
  ckpt->require_subcommand(1);
  for (const char* action : {"info", "verify"}) {
    auto* sub = ckpt->add_subcommand(action, std::string(action) == "info" ? "Print what a checkpoint holds"
                                                                          : "Check a checkpoint: exit 0 good, 1 bad");
    sub->add_option("path", ckpt_opt.path, "step_*.h5, or a directory whose (ckpt/)LATEST names one")->required();
    sub->callback([&ckpt_opt, action] { ckpt_opt.action = action; });
  }

  ScoreCliOptions score_opt;
  auto* score = app.add_subcommand("score", "Corpus BLEU (SacreBLEU's 13a) and chrF of translations, one per line, against references");
  score->add_option("--hyp", score_opt.hyp, "Translations, one sentence per line (UTF-8)")->required();
  score->add_option("--ref", score_opt.ref, "References, line by line with --hyp")->required();
  score->add_flag("--json", score_opt.json, "One JSON line: full-precision scores and their n-gram statistics");
  score->add_flag("--print-tokens", score_opt.print_tokens, "Print the translations as BLEU's 13a tokenisation splits them");

  GenerateCliOptions gen_opt;
  auto* gen = app.add_subcommand("generate", "Continue prompts with a checkpoint's decoder LM: greedy or sampled");
  gen->add_option("deck", deck_path, kDecodingDeck);
  gen->add_option("--set", overrides, "Override a deck key: section.key=value (repeatable)");
  gen->add_option("--checkpoint", gen_opt.checkpoint, "Checkpoint file, or a ckpt / run directory (its LATEST)")->required();
  gen->add_option("--prompt", gen_opt.prompts, "Text to continue (repeatable: one output line each)")->required();
  gen->add_option("--lang", gen_opt.lang, "Language tag before the prompt (default: the dataset's only language)");
  gen->add_option("--max-new", gen_opt.sampling.max_new, "Tokens generated at most")->capture_default_str();
  gen->add_option("--temperature", gen_opt.sampling.temperature, "Sampling temperature; 0: greedy")->capture_default_str();
  gen->add_option("--top-k", gen_opt.sampling.top_k, "Sample among the k most likely tokens; 0: all")->capture_default_str();
  gen->add_option("--top-p", gen_opt.sampling.top_p, "Sample among the most likely tokens of probability >= p")->capture_default_str();
  gen->add_option("--seed", gen_opt.sampling.seed, "Seed of the samples")->capture_default_str();

  TranslateCliOptions tr_opt;
  auto* tr = app.add_subcommand("translate", "Translate sentences into English with a checkpoint: greedy or flat beam search");
  tr->add_option("deck", deck_path, kDecodingDeck);
  tr->add_option("--set", overrides, "Override a deck key: section.key=value (repeatable)");
  tr->add_option("--checkpoint", tr_opt.checkpoint, "Checkpoint file, or a ckpt / run directory (its LATEST)")->required();
  tr->add_option("--input", tr_opt.input, "Source sentences, one per line (default: stdin)");
  tr->add_option("--lang", tr_opt.lang, "Language tag: the source language with xx-en data, the target language with en-xx data (default: the dataset's only language)");
  tr->add_option("--beam", tr_opt.beam.beam, "Beam width; 1: greedy")->capture_default_str();
  tr->add_option("--alpha", tr_opt.beam.alpha, "Length normalisation ((5+|Y|)/6)^alpha")->capture_default_str();
  tr->add_option("--max-len", tr_opt.beam.max_len, "Output tokens at most, EOS included")->capture_default_str();
  tr->add_option("--batch", tr_opt.batch, "Sources decoded together; the data ranks share the batches out")->capture_default_str();
  bool allow_other_data = false;  // translate and generate
  tr->add_flag("--allow-other-data", allow_other_data, kAllowOtherData);
  gen->add_flag("--allow-other-data", allow_other_data, kAllowOtherData);

  EvalCliOptions ev_opt;
  auto* ev = app.add_subcommand("eval", "Validation loss, BLEU and chrF per language of a checkpoint, into an HDF5 file");
  ev->add_option("deck", deck_path, kDecodingDeck);
  ev->add_option("--set", overrides, "Override a deck key: section.key=value (repeatable)");
  ev->add_option("--checkpoint", ev_opt.checkpoint, "Checkpoint file, or a ckpt / run directory (its LATEST)")->required();
  ev->add_option("--beam", ev_opt.beam.beam, "Beam width; 1: greedy")->capture_default_str();
  ev->add_option("--alpha", ev_opt.beam.alpha, "Length normalisation ((5+|Y|)/6)^alpha")->capture_default_str();
  ev->add_option("--max-len", ev_opt.beam.max_len, "Output tokens at most, EOS included")->capture_default_str();
  ev->add_option("--batch", ev_opt.batch, "Sources decoded together; the data ranks share the batches out")->capture_default_str();
  ev->add_option("--max-examples", ev_opt.max_examples, "Validation pairs translated per language (a fixed hashed sample, as eval.examples_per_language takes); 0: all")
      ->capture_default_str();
  ev->add_option("--langs", ev_opt.langs, "Languages to translate, comma-separated (default: all)")->delimiter(',');
  ev->add_option("-o,--output", ev_opt.output, "HDF5 file to write (default: eval-<step>.h5 in the checkpoint's run directory)");
  ev->add_option("--write-text", ev_opt.write_text, "Directory for each language's <lang>.src, .ref and .hyp lines (made if missing, its parent never; an existing file replaced only when it holds text)");
  ev->add_flag("--allow-other-data", ev_opt.allow_other_data, kAllowOtherData);

  // A mistyped subcommand gets a suggestion rather than CLI11's "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-') {
    const std::string given = argv[1];
    std::string best;
    size_t best_d = std::string::npos;
    for (const auto* sub : app.get_subcommands({})) {
      const std::string& name = sub->get_name();
      if (name == given) {
        best.clear();
        best_d = 0;
        break;
      }
      // Edit distance, small strings: the classic dynamic programme.
      std::vector<size_t> row(name.size() + 1);
      for (size_t j = 0; j <= name.size(); ++j) row[j] = j;
      for (size_t i = 1; i <= given.size(); ++i) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= name.size(); ++j) {
          const size_t up = row[j];
          row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (given[i - 1] == name[j - 1] ? 0 : 1)});
          diag = up;
        }
      }
      if (row[name.size()] < best_d) best_d = row[name.size()], best = name;
    }
    if (best_d != 0)
      throw InputError("unknown command '" + given + "'" + (best_d <= 3 ? "; did you mean '" + best + "'?" : "") +
                       " (meshmoe --help lists the commands)");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
    return rc == 0 ? kExitOk : kExitInputError;
  }
  if (*deck_doc) {
    if (world_rank() == 0) std::cout << deck_reference_markdown();
    return kExitOk;
  }
  if (*bench) return bench_comm_main(bench_opt);
  if (*bench_gemm) return bench_gemm_main(gemm_opt);
  if (*ckpt) return ckpt_main(ckpt_opt);
  if (*export_cmd) return export_main(export_opt, MESHMOE_VERSION);
  if (*score) return score_main(score_opt);
  if (*prep_gettext) return prep_gettext_main(gettext_opt);
  if (*prep_text) return prep_text_main(text_opt);
  if (*plan && ranks_only) {
    const Deck deck = load_agreed_deck(deck_path, overrides);
    if (world_rank() == 0) std::cout << deck.cfg.mesh.pipe * deck.cfg.mesh.data * deck.cfg.mesh.tensor << "\n";
    // A job's placement (--ranks-per-node, or Slurm's): warn when a tensor group spans nodes (docs/cluster.md).
    const int per_node = ranks_per_node > 0 ? ranks_per_node : slurm_ranks_per_node();
    const MeshShape shape{int(deck.cfg.mesh.pipe), int(deck.cfg.mesh.data), int(deck.cfg.mesh.tensor)};
    if (world_rank() == 0 && per_node > 0 &&
        groups_spanning_nodes(shape, nodes_in_blocks(shape.size(), per_node, ""), Axis::Tensor) > 0)
      std::cerr << "meshmoe: warning: with " << per_node << " ranks per node the tensor axis (mesh.tensor = "
                << shape.tensor << ") spans nodes: its all-reduces go over the network; use a multiple of "
                << shape.tensor << " ranks per node\n";
    return kExitOk;
  }
  if (*plan) return cmd_plan(deck_path, overrides, ranks_per_node);
  if (*train) return cmd_train(deck_path, overrides, train_opt, verbose);
  if (*distill) return cmd_train(deck_path, overrides, {}, verbose, &distill_opt);
  if (*gen) {
    Setup s = decoding_setup(gen_opt.checkpoint, deck_path, overrides);
    check_decoding_data(gen_opt.checkpoint, s.deck, allow_other_data);
    return generate_main(s.deck, s.mesh, gen_opt);
  }
  if (*tr) {
    Setup s = decoding_setup(tr_opt.checkpoint, deck_path, overrides);
    check_decoding_data(tr_opt.checkpoint, s.deck, allow_other_data);
    return translate_main(s.deck, s.mesh, tr_opt);
  }
  if (*ev) {
    Setup s = decoding_setup(ev_opt.checkpoint, deck_path, overrides);
    check_decoding_data(ev_opt.checkpoint, s.deck, ev_opt.allow_other_data);
    return eval_main(s.deck, s.mesh, ev_opt, MESHMOE_VERSION);
  }
  return kExitInputError;
}

}  // namespace
}  // namespace meshmoe

int main(int argc, char** argv) {
  meshmoe::ensure_openblas_thread_timeout(argv);
  // A stop request (Slurm's USR1 before the time limit, scancel's TERM, ^C, a lost terminal) can
  // come at any moment, also while MPI starts and the data loads: the handlers only set a flag that
  // the training loop reads, so they go in first (src/train/signals.hpp).
  if (argc > 1 && (std::string(argv[1]) == "train" || std::string(argv[1]) == "distill"))
    meshmoe::install_stop_signal_handlers();
  MPI_Init(&argc, &argv);
  int rc = meshmoe::kExitFailure;
  try {
    rc = meshmoe::run(argc, argv);
  } catch (const meshmoe::InputError& e) {
    // Every rank reaches an InputError together (the verdict was broadcast): rank 0 speaks.
    if (meshmoe::world_rank() == 0)
      for (const auto& m : e.messages()) std::fprintf(stderr, "meshmoe: error: %s\n", m.c_str());
    rc = meshmoe::kExitInputError;
  } catch (const meshmoe::AgreedFailure& e) {
    if (meshmoe::world_rank() == 0) std::fprintf(stderr, "meshmoe: error: %s\n", e.what());
    rc = meshmoe::kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshmoe: rank %d: fatal: %s\n", meshmoe::world_rank(), e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, meshmoe::kExitFailure);
  }
  MPI_Finalize();
  return rc;
}
