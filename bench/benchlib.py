"""What the bench scripts read from a run's metrics.h5 alike."""
import tomllib

import h5py


def run_deck(f: h5py.File) -> dict:
    """The effective deck the run stored in metrics.h5 (root dataset `deck`), parsed."""
    return tomllib.loads(bytes(f["deck"][()]).decode())


def step_tokens(f: h5py.File) -> int:
    """Tokens of one optimizer step: optim.batch_size x model.seq_len of the run's deck."""
    deck = run_deck(f)
    return int(deck["optim"]["batch_size"]) * int(deck["model"]["seq_len"])


# Dense bf16 tensor-core peak of the GPUs measured so far, TFLOP/s (NVIDIA's SXM datasheets, without
# sparsity): the "spec peak" MFU is counted against.
SPEC_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0}


def spec_bf16_tflops(gpu_name: str):
    """The datasheet's dense bf16 peak of a GPU named gpu_name, None when not listed."""
    return next((v for k, v in SPEC_BF16_TFLOPS.items() if k in gpu_name), None)
