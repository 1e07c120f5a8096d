# meshmoe — see README.md. Targets: all run check check-all check-slurm bench clean. CUDA=0|1 (default 0:
# the host path; CUDA=1 adds the CUDA path, docs/gpu.md).
BUILD    ?= build
CXX      := mpicxx
OPT      ?= -O2 -march=x86-64-v2
# -g1: line tables (backtraces and profiles name the lines) at a fifth less compile time than -g.
CXXFLAGS ?= $(OPT) -g1
PKGS     := hdf5-openmpi openblas tomlplusplus sentencepiece
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
# -fno-math-errno: sqrt and friends do not set errno, so element-wise loops with a sqrt (AdamW)
# can become vector code; -fvect-cost-model=dynamic: -O2's default model ("very-cheap") vectorizes
# no loop whose trip count is unknown or whose arrays need a run-time overlap check, so AdamW's
# update stayed scalar (3.5x its vector time, bench/RESULTS.md "Optimizer phase"). Vector code runs the
# same IEEE operations per element; floating-point sums are not reordered (no -ffast-math).
ALL_CXXFLAGS = -std=c++20 -fno-math-errno -fvect-cost-model=dynamic -DOMPI_SKIP_MPICXX -Wall -Wextra -Wno-unused-parameter -MMD -MP -Isrc $(PKG_CFLAGS) $(CXXFLAGS)
LDLIBS   := $(PKG_LIBS) -lm

NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
CUDA ?= 0
ifeq ($(CUDA)$(NVCC),1)
  $(error CUDA=1 needs nvcc (on PATH or /usr/local/cuda/bin))
endif
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH  ?= -gencode arch=compute_90,code=sm_90
MPI_CFLAGS := $(shell pkg-config --cflags ompi-cxx 2>/dev/null)

# SRC_DIRS / TEST_SRC narrow a build to some parts (used while several people work on the tree).
SRC_DIRS ?= src
SRC      := $(shell find $(SRC_DIRS) -name '*.cpp' ! -path src/app/main.cpp | sort)
CU_SRC   :=
ifeq ($(CUDA),1)
  CU_SRC := $(shell find $(SRC_DIRS) -name '*.cu' | sort)
  ALL_CXXFLAGS += -DMESHMOE_CUDA=1 -I$(CUDA_HOME)/include
  LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas -lnccl
endif
# The fuzz targets (tests/fuzz/, each its own LLVMFuzzerTestOneInput) are built by `make fuzz`.
TEST_SRC ?= $(shell find tests -name '*.cpp' ! -path 'tests/fuzz/*' | sort)
OBJ      := $(SRC:%.cpp=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.cu.o)
TEST_OBJ := $(TEST_SRC:%.cpp=$(BUILD)/obj/%.o)
# Test-only code (oracles) lives under tests/ and is included as "oracle/...".
$(TEST_OBJ): ALL_CXXFLAGS += -Itests
VERSION  := $(shell git describe --always --dirty 2>/dev/null || echo unknown)

# The build directory records its configuration; another one (CUDA=1 after CUDA=0, other flags)
# recompiles everything instead of linking a mix of the two.
BUILD_CONFIG := $(BUILD)/config
CONFIG_LINE  := $(strip CUDA=$(CUDA) CXX=$(CXX) $(ALL_CXXFLAGS) NVCC=$(NVCC) $(CUDA_ARCH))
ifneq ($(CONFIG_LINE),$(strip $(shell cat $(BUILD_CONFIG) 2>/dev/null)))
  $(shell mkdir -p $(BUILD) && printf '%s\n' '$(CONFIG_LINE)' > $(BUILD_CONFIG))
endif
$(OBJ) $(TEST_OBJ) $(BUILD)/obj/src/app/main.o: $(BUILD_CONFIG)

.PHONY: all tests run check check-all check-slurm bench bench-gpu clean deps features deck-reference
# Compile jobs of the builds that run, check and check-all start (one per core).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
comma := ,
all: features $(BUILD)/meshmoe

features:
	@printf '%s MPI (mpicxx)\n' "$$(command -v mpicxx >/dev/null && echo ✓ || echo ✗)"
	@printf '%s parallel HDF5, OpenBLAS, toml++, SentencePiece\n' "$$(pkg-config --exists $(PKGS) && echo ✓ || echo ✗)"
	@printf '%s CUDA + cuBLAS + NCCL%s\n' "$$([ '$(CUDA)' = 1 ] && echo ✓ || echo ✗)" "$$([ '$(CUDA)' = 1 ] && echo " ($(NVCC))" || echo " (CUDA=0; make CUDA=1 builds it$(if $(NVCC),$(comma) nvcc at $(NVCC),$(comma) needs nvcc))")"

deps:
	@tools/install-deps.sh

$(BUILD)/lib.a: $(OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/meshmoe: $(BUILD)/obj/src/app/main.o $(BUILD)/lib.a
	$(CXX) -o $@ $^ $(LDLIBS)

$(BUILD)/meshmoe_tests: $(TEST_OBJ) $(BUILD)/lib.a
	$(CXX) -o $@ $^ $(LDLIBS)

tests: $(BUILD)/meshmoe $(BUILD)/meshmoe_tests

$(BUILD)/obj/src/app/main.o: ALL_CXXFLAGS += -DMESHMOE_VERSION='"$(VERSION)"'
# V=1 prints whole command lines.
Q := $(if $(V),,@)
$(BUILD)/obj/%.o: %.cpp
	@mkdir -p $(dir $@)
	@$(if $(V),,echo "  CXX   $<")
	$(Q)$(CXX) $(ALL_CXXFLAGS) -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	@$(if $(V),,echo "  NVCC  $<")
	$(Q)$(NVCC) -std=c++20 -O2 --expt-relaxed-constexpr -Werror all-warnings $(CUDA_ARCH) -DOMPI_SKIP_MPICXX -Isrc $(MPI_CFLAGS) -DMESHMOE_CUDA=1 -ccbin g++ -Xcompiler -fPIC -MMD -MP -c $< -o $@

run: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	tools/make-run.sh

# The quick tier (tests/TIERS.md): the host build, Catch on 1, 2 and 4 ranks, one script of each kind.
check: deps
	@$(MAKE) --no-print-directory -j$(JOBS) tests
	BUILD=$(BUILD) tests/run-tests.sh --tier check

# Everything (what CI runs): make check, the CUDA build where nvcc is found, every script, the
# floating-point comparisons again under a second OpenBLAS kernel, and the Slurm job scripts.
check-all:
	@tools/install-deps.sh --slurm
	BUILD=$(BUILD) JOBS=$(JOBS) tools/check-all.sh

# The job scripts on a real single-node Slurm started for the test (needs root).
check-slurm:
	@tools/install-deps.sh --slurm
	@$(MAKE) --no-print-directory -j$(JOBS) all
	tests/slurm/run.sh

bench: deps
	@$(MAKE) --no-print-directory -j$(JOBS) tests
	BUILD=$(BUILD) bench/speed.sh
	BUILD=$(BUILD) bench/run.sh

# On a GPU machine (docs/gpu.md): the CUDA path against the GPU's ceilings and PyTorch eager.
bench-gpu: deps
	BUILD=$(BUILD) bench/gpu.sh

# Regenerates the deck reference between the markers in docs/deck-reference.md from `meshmoe deck-doc`.
deck-reference: $(BUILD)/meshmoe
	tools/update-deck-reference.sh

# `make fuzz` (not in `make check`): libFuzzer + AddressSanitizer on the deck parser for FUZZ_TIME
# seconds, seeded from tests/decks/{good,bad} (libFuzzer's -seed=FUZZ_SEED, so a run repeats); a
# crashing input is saved under $(BUILD)/fuzz/ (crash-*). toml++ is compiled in (header-only) so its parser is instrumented too, with its
# internal assertions off as in the Debian library meshmoe links. FUZZ_SAN=fuzzer,address,undefined
# adds UBSan, which stops at once on known toml++ 3.3.0 bugs (tomlplusplus issues #294, #295:
# "[&", a non-ASCII character after a key), fixed upstream after 3.3.0.
.PHONY: fuzz
FUZZ_TIME ?= 60
FUZZ_CXX  ?= clang++
FUZZ_SAN  ?= fuzzer,address
FUZZ_SEED ?= 1
FUZZ_SRC  := tests/fuzz/deck_fuzz.cpp $(sort $(wildcard src/deck/*.cpp))
$(BUILD)/deck_fuzz: $(FUZZ_SRC) $(wildcard src/deck/*.hpp src/deck/*.def src/core/*.hpp src/tensor/compute_kinds.hpp)
	@tools/install-deps.sh --fuzz
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) -std=c++20 -g -O1 -fsanitize=$(FUZZ_SAN) -fno-sanitize-recover=all \
	  -DTOML_HEADER_ONLY=1 '-DTOML_ASSERT(expr)=static_cast<void>(0)' -DOMPI_SKIP_MPICXX -Isrc $(shell mpicxx --showme:compile 2>/dev/null) \
	  $(FUZZ_SRC) -o $@ $(shell mpicxx --showme:link 2>/dev/null)
# The readers of user-given HDF5 files (tests/fuzz/h5_readers_fuzz.cpp) for FUZZ_TIME seconds more:
# the checkpoint and dataset readers and the HDF5 layer instrumented, the rest of the program
# linked from $(BUILD)/lib.a; the valid files it mutates come from a 1-step run of a tiny deck; an
# input is up to 4 mutations (13 bytes) from the start.
H5FUZZ_SRC := tests/fuzz/h5_readers_fuzz.cpp tests/support/h5_mutate.cpp src/checkpoint/checkpoint_read.cpp src/checkpoint/checkpoint_init.cpp \
  src/checkpoint/checkpoint_format.cpp $(sort $(wildcard src/io/h5*.cpp)) src/data/dataset.cpp src/data/dataset_io.cpp src/data/tokenizer.cpp
$(BUILD)/h5_readers_fuzz: $(H5FUZZ_SRC) $(BUILD)/lib.a tests/support/h5_mutate.hpp
	@tools/install-deps.sh --fuzz
	$(FUZZ_CXX) -std=c++20 -g -O1 -fsanitize=$(FUZZ_SAN) -fno-sanitize-recover=all -DOMPI_SKIP_MPICXX -Isrc -Itests \
	  $(PKG_CFLAGS) $(H5FUZZ_SRC) $(BUILD)/lib.a -o $@ $(LDLIBS) $(shell mpicxx --showme:link 2>/dev/null)
$(BUILD)/fuzz/h5seed/run/ckpt/LATEST: $(BUILD)/meshmoe
	@rm -rf $(BUILD)/fuzz/h5seed && mkdir -p $(BUILD)/fuzz/h5seed
	$(BUILD)/meshmoe prep text -q --max-len 17 /usr/share/common-licenses/GPL-3 -o $(BUILD)/fuzz/h5seed/data.h5
	printf '[run]\nsteps = 1\nout_dir = "%s"\n[model]\nseq_len = 16\nd_model = 16\nnum_layers = 2\nnum_heads = 2\nd_ff = 32\n[moe]\nnum_experts = 4\nevery = 2\ngroup_size = 16\n[optim]\nbatch_size = 4\nwarmup_steps = 1\n[data]\npath = "%s"\n[eval]\nevery = 0\n' \
	  $(BUILD)/fuzz/h5seed/run $(BUILD)/fuzz/h5seed/data.h5 > $(BUILD)/fuzz/h5seed/deck.toml
	$(BUILD)/meshmoe train $(BUILD)/fuzz/h5seed/deck.toml > $(BUILD)/fuzz/h5seed/train.log  # one rank, no mpirun (as root too)
fuzz: $(BUILD)/deck_fuzz $(BUILD)/h5_readers_fuzz $(BUILD)/fuzz/h5seed/run/ckpt/LATEST
	@mkdir -p $(BUILD)/fuzz/corpus $(BUILD)/fuzz/h5corpus
	$(BUILD)/deck_fuzz -seed=$(FUZZ_SEED) -max_total_time=$(FUZZ_TIME) -timeout=10 -artifact_prefix=$(BUILD)/fuzz/ -print_final_stats=1 \
	  $(BUILD)/fuzz/corpus tests/decks/good tests/decks/bad
	MESHMOE_FUZZ_CKPT=$(BUILD)/fuzz/h5seed/run/ckpt/$$(cat $(BUILD)/fuzz/h5seed/run/ckpt/LATEST) \
	  MESHMOE_FUZZ_DATA=$(BUILD)/fuzz/h5seed/data.h5 $(BUILD)/h5_readers_fuzz -seed=$(FUZZ_SEED) -max_total_time=$(FUZZ_TIME) \
	  -timeout=10 -max_len=13 -len_control=0 -artifact_prefix=$(BUILD)/fuzz/h5- -print_final_stats=1 $(BUILD)/fuzz/h5corpus tests/fuzz/h5_seeds

clean:
	rm -rf $(BUILD)

-include $(OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(BUILD)/obj/src/app/main.d
