// Entry points of `meshmoe prep gettext|text` for src/main.cpp. Call them on every rank of
// MPI_COMM_WORLD: rank 0 does the work and writes the file, the others wait; an InputError
// (bad option, missing root, ...) is raised on every rank together. Return an exit code.
#pragma once
#include "data/prep.hpp"

namespace meshmoe {

int prep_gettext_main(const PrepGettextOptions& opt);
int prep_text_main(const PrepTextOptions& opt);

}  // namespace meshmoe
