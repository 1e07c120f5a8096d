#!/usr/bin/env bash
# postprocess/report.py's figures on made-up metrics files (tests/postprocess/check_report_figures.py):
# gaps where a value is missing, legends only for what ran, a readable per-language figure, the
# root attributes as arrays and as the older comma-joined text. No meshmoe run needed.
set -euo pipefail
cd "$(dirname "$0")/../.."
MPLBACKEND=Agg /usr/bin/python3 tests/postprocess/check_report_figures.py
