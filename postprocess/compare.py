#!/usr/bin/python3
"""Final metrics of several runs side by side, as a markdown table.

    /usr/bin/python3 postprocess/compare.py RUN... [-o FILE]

RUN is a run directory (holding metrics.h5) or a metrics.h5 file. Columns: final step, training loss
and validation loss at the last row where each was computed, aux loss of the last logged step, median
tokens/s and MFU over the logged steps, dropped-token fraction averaged over all MoE layers and logged
steps (n/a for a dense model), and the deck keys whose values differ between the runs (run.name,
run.out_dir and run.resume left out).
"""
import argparse

from common import Run, compare_table


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run directory or metrics.h5")
    ap.add_argument("-o", "--output", help="also write the table to this file")
    a = ap.parse_args()
    table = compare_table([Run(p) for p in a.runs])
    print(table)
    if a.output:
        with open(a.output, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
