// `meshmoe distill DECK --teacher CKPT [--baseline CKPT]` (Switch section 4.2, docs/user-guide.md
// "Distillation"): trains the deck's model (the student, usually dense) with a trained teacher
// (usually a Switch MoE): the student starts from the teacher's non-expert weights (`train
// --init-from`), and each target token's loss mixes the ground truth and the teacher's
// probabilities, (1 - distill.alpha) CE(target) + distill.alpha CE(teacher). At the end it reports
// the validation loss of the teacher, the student and (--baseline, a dense model trained without
// the teacher) the share of the teacher's gain over the baseline that the student keeps (Switch
// Table 6's "percent of teacher performance preserved").
#pragma once
#include <string>

#include "deck/deck.hpp"
#include "mesh/mesh.hpp"
#include "run/startup.hpp"

namespace meshmoe {

struct DistillOptions {
  std::string teacher;   // checkpoint file, or a ckpt / run directory (its LATEST)
  std::string baseline;  // optional, the same
  bool allow_other_data = false;  // a teacher or baseline trained on other data than data.path: warn, go on
};

// The share of the teacher's gain the student keeps: (baseline - student) / (baseline - teacher)
// in validation loss (Switch Table 6: the quality gain, in negative log perplexity, of the student
// over the baseline as a fraction of the teacher's). NaN when the teacher is not better by more
// than kMinTeacherGain of the baseline's loss: a gain within the evaluations' noise would turn
// into any share at all (thousands of percent).
inline constexpr double kMinTeacherGain = 1e-3;
double preserved_fraction(double teacher_loss, double student_loss, double baseline_loss);

// Returns the process exit code as train_main does (`start`: the student's Startup::training). The
// teacher and the baseline run on the deck's mesh with their own decks (from their checkpoints),
// forward only (each its own Startup::forward_only); on a pipeline each in its own stage split over
// the same pipe ranks, its logits on the last stage beside the student's.
int distill_main(const Deck& deck, Mesh& mesh, const Startup& start, const std::string& version, const DistillOptions& opt);

}  // namespace meshmoe
