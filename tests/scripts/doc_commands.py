#!/usr/bin/python3
"""Runs every command the manual shows (tests/scripts/doc_commands.sh).

    doc_commands.py REPO MESHMOE SANDBOX

Finds, in the fenced code blocks of README.md, docs/user-guide.md and the other docs/*.md, every command line (a `\\`-continued
line joined) that starts with build/meshmoe, meshmoe, mpirun, make, sbatch, /usr/bin/python3,
postprocess/*.py, tools/*.sh, jobscripts/*, tests/*.sh or bench/*, and every ```python block. Each
one is then, in the order of the files (README first) and of the lines:
  - a synopsis (`meshmoe SUBCOMMAND ...` without a path, the Command line section's block):
    `build/meshmoe SUBCOMMAND --help` must list every --option the synopsis names (and
    `meshmoe --version` runs);
  - skipped, when it matches SKIP (each with its reason: GPU, Slurm, the build itself);
  - or run verbatim in SANDBOX, a directory laid out as the repository (build/, inputs/,
    postprocess/, tools/, ... linked; data/ and runs/ its own), shrunk where SHRINK says (a
    training of a few steps, a few examples scored), after the PREREQUISITES of the few commands
    that use a run the manual trains elsewhere (the Slurm job's runs). It must exit 0.
A command that appears twice is run once. The counts must add up: found = run + skipped, so that
an example added to the manual is either run here or skipped with a reason.
"""
import os
import re
import shlex
import subprocess
import sys
import time

REPO, MESHMOE, SANDBOX = sys.argv[1:4]
PY = "/usr/bin/python3"

COMMAND = re.compile(r"^(?:[A-Z_]+=\S*\s+)*(?:build/meshmoe|meshmoe|mpirun|make|sbatch|/usr/bin/python3|"
                     r"postprocess/\S+\.py|tools/\S+\.sh|jobscripts/\S+|tests/\S+\.sh|bench/\S+)(?:\s|$)")

# (pattern, reason): commands not run here, and why.
SKIP = [
    (r"^make(\s|$)", "make builds meshmoe and runs the test tiers; every command here runs on that build, and this "
                     "test runs inside make check-all"),
    (r"run\.device=cuda", "GPU: tests/scripts/gpu_train.sh runs training on a GPU"),
    (r"^(jobscripts/|sbatch\s)", "Slurm: tests/slurm/run.sh runs the job scripts on a real Slurm"),
    (r"^tools/gpu-bundle\.sh", "GPU: tests/scripts/gpu_bundle.sh builds and runs the bundle"),
    (r"--spm-pieces 32000", "GPU: the real-size GPU decks' data (a 32k SentencePiece vocabulary, minutes); "
                            "tests/scripts/prep_spm.sh tests prep --tokenizer spm"),
    (r"tools/gpu-session\.sh", "GPU: tests/scripts/gpu_record.sh runs the GPU session's dry run"),
    (r"^tests/run-tests\.sh", "the test runner itself (the tests it names run in check-all)"),
]

# Shrinking: (pattern, what to append to or replace in the command). A training runs 4 steps, an
# evaluation scores one example per language (the commands as printed in the log show it).
TRAIN_SHRINK = (" --set run.steps=4 --set run.log_every=2 --set eval.every=4 --set eval.batches=1"
                " --set eval.examples_per_language=1 --set checkpoint.every=0")
def add_args(cmd, extra):
    """`cmd` with `extra` before its first redirection or pipe."""
    m = re.search(r"\s[>|]", cmd)
    return cmd + extra if not m else cmd[:m.start()] + extra + cmd[m.start():]


SHRINK = [
    (r"build/meshmoe (train|distill) ", lambda c: add_args(c, TRAIN_SHRINK)),
    (r"build/meshmoe eval ", lambda c: re.sub(r"--max-examples \d+", "--max-examples 2 --langs de,fr", c)),
    (r"build/meshmoe translate ", lambda c: add_args(c, " --max-len 16")),
    (r"build/meshmoe generate ", lambda c: add_args(c, " --max-new 8")),
]

# Runs that commands name but the manual makes elsewhere (GShard's experiment is a Slurm job):
# made first, shrunk as above.
M = "build/meshmoe"
PREREQUISITES = [
    (r"bleu_report\.py runs/m4-switch-tiny runs/m4-dense-tiny",
     [f"{M} train inputs/m4-dense-tiny.toml" + TRAIN_SHRINK,
      f"{M} eval inputs/m4-dense-tiny.toml --checkpoint runs/m4-dense-tiny --max-examples 2 --langs de,fr",
      f"test -n \"$(ls runs/m4-switch-tiny/eval-*.h5)\""]),
    (r"--checkpoint runs/m4-encdec-gshard", [f"{M} train inputs/m4-encdec-gshard.toml" + TRAIN_SHRINK]),
]

# Files the commands read that the manual leaves to the reader: a few German sentences to translate.
FIXTURES = {"src.txt": "Datei 3 kopiert\nOrdner 7 entfernt\n"}


def logical_lines(lines):
    """Joins `\\`-continued lines; yields (first line number, text)."""
    i = 0
    while i < len(lines):
        start, text = i, lines[i].rstrip("\n")
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1].rstrip() + " " + lines[i].strip()
        yield start + 1, text
        i += 1


def strip_comment(line):
    """The line without a trailing ` # comment` (outside quotes)."""
    quote = None
    for k, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k].rstrip()
    return line.rstrip()


def find_commands():
    # README and the user guide first: the other pages use the runs and data they make.
    first = ["README.md", "docs/user-guide.md"]
    files = first + sorted(p for p in (os.path.join("docs", f) for f in os.listdir(os.path.join(REPO, "docs")))
                           if p.endswith(".md") and p not in first)
    found = []  # (where, kind, text, extra lines for a synopsis)
    for rel in files:
        lines = open(os.path.join(REPO, rel), encoding="utf-8").read().split("\n")
        k = 0
        while k < len(lines):
            m = re.match(r"^```(\S*)", lines[k])
            if not m:
                k += 1
                continue
            info, begin = m.group(1), k + 1
            end = begin
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            block = lines[begin:end]
            if info == "python":
                found.append((f"{rel}:{begin}", "python", "\n".join(block), []))
            elif info != "toml":
                entries = list(logical_lines(block))
                for j, (n, text) in enumerate(entries):
                    cmd = strip_comment(text.strip())
                    if not COMMAND.match(cmd):
                        continue
                    if cmd.startswith("meshmoe "):
                        part = re.split(r"\s{3,}", text.strip())[0]
                        more = []
                        for _, t in entries[j + 1:]:
                            if not t.startswith(" ") or t.strip().startswith("meshmoe "):
                                break
                            if t.strip().startswith("["):
                                more.append(re.split(r"\s{3,}", t.strip())[0])
                        found.append((f"{rel}:{begin + n}", "synopsis", part, more))
                    else:
                        found.append((f"{rel}:{begin + n}", "shell", cmd, []))
            k = end + 1
    return found


def setup_sandbox():
    os.makedirs(SANDBOX, exist_ok=True)
    for name in ("inputs", "postprocess", "tools", "jobscripts", "tests", "bench"):
        link = os.path.join(SANDBOX, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(REPO, name), link)
    os.makedirs(os.path.join(SANDBOX, "build"), exist_ok=True)
    exe = os.path.join(SANDBOX, "build", "meshmoe")
    if not os.path.lexists(exe):
        os.symlink(os.path.abspath(MESHMOE), exe)
    os.makedirs(os.path.join(SANDBOX, "data"), exist_ok=True)
    for name, text in FIXTURES.items():
        with open(os.path.join(SANDBOX, name), "w") as f:
            f.write(text)


def shell(cmd, timeout=600):
    """Runs `cmd` with bash in the sandbox; (exit code, seconds, output tail)."""
    t = time.time()
    p = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], cwd=SANDBOX, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout)
    out = p.stdout.decode("utf-8", "replace")
    with open(os.path.join(SANDBOX, "commands.log"), "a") as log:
        log.write(f"$ {cmd}\n{out}\n[exit {p.returncode}]\n\n")
    return p.returncode, time.time() - t, "\n".join(out.splitlines()[-12:])


def check_synopsis(part, more):
    words = part.split()[1:]
    sub = []
    for w in words:
        if w.startswith("-") or w.startswith("[") or not re.match(r"^[a-z][a-z-]*$", w):
            break
        sub.append(w)
    if not sub:
        return shell(f"build/meshmoe {' '.join(words)}")
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", " ".join([part] + more)))
    rc, secs, out = shell(f"build/meshmoe {' '.join(sub)} --help")
    if rc == 0:
        help_text = open(os.path.join(SANDBOX, "commands.log")).read().rsplit("$ ", 1)[1]
        missing = sorted(o for o in options if o not in help_text)
        if missing:
            return 1, secs, f"options of the synopsis not in `meshmoe {' '.join(sub)} --help`: {', '.join(missing)}"
    return rc, secs, out


def main():
    setup_sandbox()
    found = find_commands()
    ran, skipped, failed, done = 0, 0, 0, {}
    for where, kind, text, more in found:
        if kind == "shell":
            reason = next((why for pat, why in SKIP if re.search(pat, text)), None)
            if reason:
                skipped += 1
                print(f"skip {where}: {text}\n     ({reason})")
                continue
        key = (kind, text, tuple(more))
        if key in done:
            ran += 1
            print(f"{'ok  ' if done[key] == 0 else 'FAIL'} {where}: {text.splitlines()[0]} (run above)")
            failed += done[key] != 0
            continue
        if kind == "synopsis":
            rc, secs, out = check_synopsis(text, more)
            shown = text
        elif kind == "python":
            snippet = text.replace("runs/NAME/", "runs/m4-switch-tiny/")
            with open(os.path.join(SANDBOX, "snippet.py"), "w") as f:
                f.write(snippet)
            rc, secs, out = shell(f"{PY} snippet.py")
            shown = f"python snippet ({len(text.splitlines())} lines, runs/NAME = runs/m4-switch-tiny)"
        else:
            cmd = text
            for pat, change in SHRINK:
                if re.search(pat, cmd):
                    cmd = change(cmd)
            for pat, cmds in PREREQUISITES:
                if re.search(pat, cmd):
                    for pre in cmds:
                        prc, _, pout = shell(pre)
                        if prc != 0:
                            print(f"FAIL {where}: prerequisite `{pre}` exited {prc}:\n{pout}")
                            failed += 1
            rc, secs, out = shell(cmd)
            shown = cmd if cmd == text else f"{text}\n     (run as: {cmd})"
        done[key] = rc
        ran += 1
        if rc == 0:
            print(f"ok   {where}: {shown} ({secs:.1f} s)")
        else:
            failed += 1
            print(f"FAIL {where}: {shown}\n     exit {rc}:\n{out}")
    print(f"doc_commands: {len(found)} commands found in README.md and docs/*.md: {ran} run ({failed} failed), "
          f"{skipped} skipped")
    if len(found) != ran + skipped:
        print("FAIL: the counts do not add up")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
