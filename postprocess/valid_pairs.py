#!/usr/bin/python3
"""The validation pairs of one language of a gettext dataset, as two text files: the sources
(what `meshmoe translate` reads) and the English references (what `meshmoe score` compares with).

    /usr/bin/python3 postprocess/valid_pairs.py data/gettext.h5 de SRC.txt REF.txt [--max N]

An example is `<lang> source SEP english EOS` (src/data/prep.hpp); byte-tokenized datasets only
(ids 0..255 are the text's bytes), written byte for byte as `meshmoe eval --write-text` writes
them (no replacement character for a byte that is not UTF-8). Newlines inside a string become
spaces, so that line i of both files is pair i. --max N writes the N pairs that `meshmoe eval --max-examples N` (and
eval.examples_per_language / eval.bleu_examples = N) score: those of the smallest hash
mix64(language << 32 | position), src/data/dataset.hpp's per_language_sample, in file order.
"""
import argparse
import sys

import h5py
import numpy as np

SEP, EOS, FIRST_LANG = 259, 258, 260
U64 = np.uint64


def mix64(x):
    """SplitMix64's finaliser on a uint64 array (src/core/hash.hpp), wrapping as C++ does."""
    with np.errstate(over="ignore"):
        z = x + U64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


def sample(examples, language, n):
    """The examples (indices, file order) of one language that per_language_sample keeps."""
    if n <= 0 or len(examples) <= n:
        return examples
    keys = mix64((U64(language) << U64(32)) | np.arange(len(examples), dtype=U64))
    return examples[np.sort(np.lexsort((np.arange(len(examples)), keys))[:n])]


def line(ids):
    """The bytes of a string as they are, as `meshmoe eval --write-text` writes them (a byte that is
    not valid UTF-8 stays that byte), newlines made spaces."""
    return bytes(int(t) for t in ids).replace(b"\n", b" ").replace(b"\r", b" ") + b"\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("lang")
    ap.add_argument("src")
    ap.add_argument("ref")
    ap.add_argument("--max", type=int, default=0, help="this many pairs, eval --max-examples's sample (0: all)")
    a = ap.parse_args()
    with h5py.File(a.dataset, "r") as f:
        if f.attrs["tokenizer"] != "bytes+specials+langtags":
            sys.exit("valid_pairs.py: only byte-tokenized datasets (this one: %s)" % f.attrs["tokenizer"])
        names = [n.decode() if isinstance(n, bytes) else n for n in f["languages/name"][()]]
        if a.lang not in names:
            sys.exit("valid_pairs.py: %s is not among the dataset's languages %s" % (a.lang, ", ".join(names)))
        li = names.index(a.lang)
        tokens = f["valid/tokens"][()]
        offsets = f["valid/doc_offsets"][()]
        lang = f["valid/lang"][()]
    n = 0
    with open(a.src, "wb") as src, open(a.ref, "wb") as ref:
        for e in sample(np.flatnonzero(lang == li), li, a.max):
            ex = tokens[offsets[e]:offsets[e + 1]]
            sep = int(np.flatnonzero(ex == SEP)[0])
            end = len(ex) - 1 if ex[-1] == EOS else len(ex)
            src.write(line(ex[1:sep]))
            ref.write(line(ex[sep + 1:end]))
            n += 1
    print("%d pairs of %s -> %s, %s" % (n, a.lang, a.src, a.ref))


if __name__ == "__main__":
    main()
