#!/usr/bin/python3
"""The validation pairs of one language of a gettext dataset, as two text files: the sources
(what `meshmoe translate` reads) and the English references (what `meshmoe score` compares with).

    /usr/bin/python3 postprocess/valid_pairs.py data/gettext.h5 de SRC.txt REF.txt [--max N]

An example is `<lang> source SEP english EOS` (src/data/prep.hpp); byte-tokenized datasets only
(ids 0..255 are the text's bytes). Newlines inside a string become spaces, so that line i of
both files is pair i.
"""
import argparse
import sys

import h5py
import numpy as np

SEP, EOS, FIRST_LANG = 259, 258, 260


def text(ids):
    return bytes(int(t) for t in ids).decode("utf-8", errors="replace").replace("\n", " ").replace("\r", " ")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("lang")
    ap.add_argument("src")
    ap.add_argument("ref")
    ap.add_argument("--max", type=int, default=0, help="at most this many pairs (0: all)")
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
    with open(a.src, "w", encoding="utf-8") as src, open(a.ref, "w", encoding="utf-8") as ref:
        for e in np.flatnonzero(lang == li):
            ex = tokens[offsets[e]:offsets[e + 1]]
            sep = int(np.flatnonzero(ex == SEP)[0])
            end = len(ex) - 1 if ex[-1] == EOS else len(ex)
            src.write(text(ex[1:sep]) + "\n")
            ref.write(text(ex[sep + 1:end]) + "\n")
            n += 1
            if a.max and n == a.max:
                break
    print("%d pairs of %s -> %s, %s" % (n, a.lang, a.src, a.ref))


if __name__ == "__main__":
    main()
