"""Philox 4x32-10 (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3") in numpy,
written from the paper's round function, with meshmoe's keying (src/core/philox.hpp):
  counter = (index lo, index hi, step, (layer << 8) | purpose), key = (seed lo ^ (draw << 24), seed hi)
Vectorised over arrays of indices. Self-check against the paper's known-answer vectors: run this file.
"""
import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK32 = np.uint64(0xFFFFFFFF)

# RngPurpose values (src/core/philox.hpp)
INIT, JITTER, SECOND_EXPERT, DROPOUT, EXPERT_DROPOUT, DATA_SHUFFLE, TEST = 1, 2, 3, 4, 5, 6, 255


def philox4x32_10(ctr, key):
    """ctr: 4 arrays (broadcastable) of uint32 values, key: 2 ints. Returns 4 uint64 arrays < 2^32."""
    c = [np.asarray(x, dtype=np.uint64) & MASK32 for x in ctr]
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    for _ in range(10):
        p0 = M0 * c[0]  # < 2^64: exact in uint64
        p1 = M1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & MASK32,
             (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1), p0 & MASK32]
        k0 = (k0 + W0) & 0xFFFFFFFF
        k1 = (k1 + W1) & 0xFFFFFFFF
    return c


class Rng:
    """The stream of one purpose in one layer at one step (meshmoe::Rng)."""

    def __init__(self, seed, step, layer, purpose):
        self.seed, self.step, self.layer, self.purpose = int(seed), int(step), int(layer), int(purpose)

    def bits(self, index, draw=0):
        index = np.asarray(index, dtype=np.uint64)
        ctr = (index & MASK32, index >> np.uint64(32), np.uint64(self.step),
               np.uint64(((self.layer << 8) | self.purpose) & 0xFFFFFFFF))
        key = ((self.seed & 0xFFFFFFFF) ^ ((draw << 24) & 0xFFFFFFFF), self.seed >> 32)
        return philox4x32_10(ctr, key)

    def uniform_double(self, index, lane=0, draw=0):
        """Uniform in [0, 1) from the top 24 bits of word `lane` (float64 array)."""
        return (self.bits(index, draw)[lane] >> np.uint64(8)).astype(np.float64) / 16777216.0


def _self_check():
    # Known-answer tests of Random123 (kat_vectors) for philox4x32 with 10 rounds.
    kat = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for ctr, key, want in kat:
        got = tuple(int(x) for x in philox4x32_10([np.uint64(v) for v in ctr], key))
        assert got == want, (ctr, key, [hex(g) for g in got])
    print("philox4x32-10 known-answer tests: ok")


if __name__ == "__main__":
    _self_check()
