#!/usr/bin/env bash
# `meshmoe score` against independent implementations on random corpora (seeded): the 13a
# tokenisation against SacreBLEU's four regular expressions run by Python's re (line by line,
# exact); corpus BLEU against NLTK's corpus_bleu on those tokens (where the definitions coincide:
# every n-gram order has a match, so no smoothing, and every line has 4-grams; 1e-12 relative); chrF's statistics per order
# against NLTK's chrF precision/recall counts (exact) and the score from them (1e-12). A changed
# line of the corpus must change the scores (the comparison can fail). Also: files of different
# lengths exit 2. Needs /usr/bin/python3 with nltk (Debian python3-nltk).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
test_dir score_vs_nltk
PY=/usr/bin/python3

$PY - "$T" <<'PY'
import random, sys
random.seed(7)
words = ["the", "cat", "sat", "on", "mat", "dog", "barks", "file", "open", "save", "3.14", "1,000", "2-3", "e-mail",
         "don't", "x/y", "(note)", "[tag]", "{a}", "$5", "100%", "caf\u00e9", "na\u00efve", "\u4e2d\u6587",
         "stra\u00dfe", "&amp;", "&lt;b&gt;", "&quot;q&quot;", "end.", "a,b", ".5", "5.", "-", "!", "?", "--"]
spaces = [" ", " ", " ", "  ", "\t", "\u00a0"]
def sentence(n):
    return "".join(random.choice(words) + random.choice(spaces) for _ in range(n)).strip()
def edit(s):
    toks = s.split(" ")
    for _ in range(random.randint(0, 3)):
        i = random.randrange(len(toks))
        toks[i] = random.choice(words)
    if random.random() < 0.3: toks.append(random.choice(words))
    if random.random() < 0.3 and len(toks) > 2: del toks[random.randrange(len(toks))]
    return " ".join(toks)
refs = [sentence(random.randint(5, 25)) for _ in range(300)]
hyps = [edit(r) for r in refs]
open(sys.argv[1] + "/ref.txt", "w").write("\n".join(refs) + "\n")
open(sys.argv[1] + "/hyp.txt", "w").write("\n".join(hyps) + "\n")
# The changed corpus: one hypothesis line different.
hyps[17] = "completely different words here"
open(sys.argv[1] + "/hyp2.txt", "w").write("\n".join(hyps) + "\n")
PY

"$M" score --hyp "$T/hyp.txt" --ref "$T/ref.txt" --print-tokens >"$T/tokens.txt"
"$M" score --hyp "$T/hyp.txt" --ref "$T/ref.txt" --json >"$T/score.json"
"$M" score --hyp "$T/hyp2.txt" --ref "$T/ref.txt" --json >"$T/score2.json"
"$M" score --hyp "$T/hyp.txt" --ref "$T/ref.txt" | tee "$T/summary.txt"
grep -q '^BLEU = [0-9.]* ' "$T/summary.txt" || fail "no BLEU line"
grep -q '^chrF2 = [0-9.]* ' "$T/summary.txt" || fail "no chrF2 line"

$PY - "$T" <<'PY' || fail "scores differ from the Python/NLTK oracle"
import json, math, re, sys
from collections import Counter
from nltk.translate.bleu_score import corpus_bleu
from nltk.translate.chrf_score import chrf_precision_recall_fscore_support
from nltk.util import ngrams
T = sys.argv[1]
read = lambda name: open(f"{T}/{name}", encoding="utf-8").read().split("\n")[:-1]
refs, hyps, hyps2 = read("ref.txt"), read("hyp.txt"), read("hyp2.txt")

RULES = [(re.compile(r'([\{-\~\[-\` -\&\(-\+\:-\@\/])'), r' \1 '), (re.compile(r'([^0-9])([\.,])'), r'\1 \2 '),
         (re.compile(r'([\.,])([^0-9])'), r' \1 \2'), (re.compile(r'([0-9])(-)'), r'\1 \2 ')]
def tok13a(line):
    line = line.replace('<skipped>', '').replace('-\n', '').replace('\n', ' ')
    for a, b in (('&quot;', '"'), ('&amp;', '&'), ('&lt;', '<'), ('&gt;', '>')):
        line = line.replace(a, b)
    line = f" {line} "
    for r, s in RULES:
        line = r.sub(s, line)
    return line.split()

ok = True
ours = read("tokens.txt")
bad = [i for i, h in enumerate(hyps) if " ".join(tok13a(h)) != ours[i]]
print(f"13a tokens: {len(hyps) - len(bad)}/{len(hyps)} lines equal")
for i in bad[:5]:
    print(f"  line {i}: python {' '.join(tok13a(hyps[i]))!r}\n          meshmoe {ours[i]!r}")
ok &= not bad

def check(name, got, want, tol=1e-12):
    global ok
    good = abs(got - want) <= tol * max(1.0, abs(want))
    print(f"{name}: meshmoe {got!r} oracle {want!r} {'ok' if good else 'DIFFERENT'}")
    ok &= good

def oracle(hyps):
    h_tok, r_tok = [tok13a(h) for h in hyps], [tok13a(r) for r in refs]
    # NLTK equals SacreBLEU only when every order has a match (no smoothing) and every translation
    # has 4-grams (NLTK counts at least one n-gram per sentence): make sure.
    assert min(len(h) for h in h_tok) >= 4, "a translation of fewer than 4 tokens"
    for n in range(1, 5):
        m = sum(sum((Counter(ngrams(h, n)) & Counter(ngrams(r, n))).values()) for h, r in zip(h_tok, r_tok))
        assert m > 0, f"order {n} has no match: the corpus does not test what it should"
    bleu = 100 * corpus_bleu([[r] for r in r_tok], h_tok)
    stats = []
    for n in range(1, 7):
        hyp_n = ref_n = match_n = 0
        for h, r in zip(hyps, refs):
            hs, rs = "".join(h.split()), "".join(r.split())
            _, _, _, tp = chrf_precision_recall_fscore_support(rs, hs, n, beta=2.0)
            hyp_n += len(list(ngrams(hs, n)))
            ref_n += len(list(ngrams(rs, n)))
            match_n += tp
        stats.append((hyp_n, ref_n, match_n))
    eff = [(h, r, m) for h, r, m in stats if h > 0 and r > 0]
    p = sum(m / h for h, r, m in eff) / len(eff)
    rc = sum(m / r for h, r, m in eff) / len(eff)
    chrf = 100 * 5 * p * rc / (4 * p + rc)
    return bleu, stats, chrf

for name, hy, js in (("corpus", hyps, "score.json"), ("changed corpus", hyps2, "score2.json")):
    got = json.load(open(f"{T}/{js}"))
    bleu, stats, chrf = oracle(hy)
    check(f"{name} BLEU", got["bleu"], bleu)
    check(f"{name} chrF2", got["chrf"], chrf)
    same = [list(s) for s in stats] == [list(x) for x in zip(got["chrf_hyp"], got["chrf_ref"], got["chrf_matches"])]
    print(f"{name} chrF statistics per order {'equal' if same else 'DIFFERENT'}: {stats}")
    ok &= same
a, b = json.load(open(f"{T}/score.json")), json.load(open(f"{T}/score2.json"))
if a["bleu"] == b["bleu"] or a["chrf"] == b["chrf"]:
    print("a changed line did not change the scores"); ok = False
sys.exit(0 if ok else 1)
PY

head -5 "$T/ref.txt" >"$T/short.txt"
set +e
"$M" score --hyp "$T/short.txt" --ref "$T/ref.txt" >"$T/err.txt" 2>&1; rc=$?
set -e
[ $rc -eq 2 ] || fail "files of different lengths: exit $rc, want 2"
grep -q "has 5 lines but" "$T/err.txt" || { cat "$T/err.txt"; fail "no line-count message"; }
echo "score_vs_nltk: ok"
