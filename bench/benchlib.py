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
