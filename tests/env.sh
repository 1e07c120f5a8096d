# Environment for running meshmoe's tests and examples under Open MPI on a small machine:
# root is allowed, more ranks than cores is allowed, one BLAS thread per rank.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mpi_yield_when_idle=1
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
# The Python with h5py, numpy and torch: Debian's here; MESHMOE_PYTHON elsewhere (the GPU machine's).
export PYTHON=${MESHMOE_PYTHON:-/usr/bin/python3}

# have_gpu: true when nvidia-smi lists a GPU (scripts that need one skip or stop otherwise).
have_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; }
