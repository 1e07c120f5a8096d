#!/usr/bin/python3
"""Reads the files written by the hidden Catch case "[.h5-export]" (4 ranks, uneven row blocks,
one empty) with h5py and compares them EXACTLY with the arrays rebuilt here by numpy from the same
formulas (tests/unit/test_h5.cpp: fval, ival, uneven_rows). Exits non-zero on any mismatch.
Usage: h5_readback.py DIR NP"""
import sys

import h5py
import numpy as np

directory, np_ranks = sys.argv[1], int(sys.argv[2])
errors = []


def expect(cond, what):
    if not cond:
        errors.append(what)


# Rank q holds 2q+1 rows, except rank 1 (when np > 1), which holds none.
rows = sum(0 if (np_ranks > 1 and q == 1) else 2 * q + 1 for q in range(np_ranks))
i = np.arange(rows, dtype=np.float32)[:, None]
j = np.arange(64, dtype=np.float32)[None, :]
x_expected = i * np.float32(64) + j + np.float32(0.25)  # float32 arithmetic, as in C++
ids_expected = (np.int64(1) << np.int64(60)) + np.arange(rows, dtype=np.int64) * np.int64(1000003) - np.int64(7)

for name, fletcher in (("sharded.h5", False), ("sharded_fletcher32.h5", True)):
    with h5py.File(f"{directory}/{name}", "r") as f:
        x, ids = f["data/x"], f["data/ids"]
        expect(x.dtype == np.dtype("<f4"), f"{name}: data/x dtype {x.dtype}")
        expect(ids.dtype == np.dtype("<i8"), f"{name}: data/ids dtype {ids.dtype}")
        expect(x.shape == (rows, 64), f"{name}: data/x shape {x.shape}")
        expect(np.array_equal(x[()], x_expected), f"{name}: data/x values differ")
        expect(np.array_equal(ids[()], ids_expected), f"{name}: data/ids values differ")
        expect(int(f.attrs["writer_ranks"]) == np_ranks, f"{name}: writer_ranks {f.attrs.get('writer_ranks')}")
        expect(x.attrs["units"] == "1", f"{name}: units {x.attrs.get('units')!r}")
        expect(x.attrs["formula"] == "x[i,j] = 64 i + j + 0.25", f"{name}: formula {x.attrs.get('formula')!r}")
        expect(f["deck"][()] == b"[model]\nd_model = 64\n", f"{name}: deck {f['deck'][()]!r}")
        expect(x.fletcher32 == fletcher and ids.fletcher32 == fletcher, f"{name}: fletcher32 flags")
        if fletcher:
            expect(x.chunks == (3, 16), f"{name}: chunks {x.chunks}")

for e in errors:
    print("MISMATCH:", e)
print(f"h5_readback: {rows} rows, {len(errors)} mismatches")
sys.exit(1 if errors else 0)
