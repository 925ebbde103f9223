"""Re-record every CPU results file the book reads (``make results``), one after the other.

Each file is recorded by its command in `specbook.bench.RECORDED_BY`, from the repository's root, with this
environment's Python; the ablations that ``--suite eagle3`` and ``--suite pard`` compare are trained first where
they are missing (they are not shipped: ``python -m specbook.train`` writes them under data/eagle3-ablation and
data/pard-ablation). Run it on a
quiet machine -- every file is a timing -- from a clean commit: each file records the commit and the CPU, and
tests/test_results.py checks that the engine has not changed since.

    python scripts/record_results.py [--only family.json,eagle3.json] [--dry-run]
"""

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

from specbook.bench import RECORDED_BY

ROOT = Path(__file__).resolve().parents[1]
ABLATIONS = {  # results file -> (the stage that trains its variants, {variant: its training options})
    "eagle3.json": ("eagle3", {"eagle3-no-ttt": "--eagle3-ttt 1", "eagle3-top-layer": "--eagle3-layers=-1",
                               "eagle3-vocab512": "--eagle3-vocab 512"}),
    "pard.json": ("pard", {"pard-no-cod": "--pard-ratio 1", "pard-2-layers": "--pard-layers 2",
                           "pard-unweighted": "--no-pard-reached", "pard-greedy-only": "--pard-corpus 0"}),
}


def commands(names) -> list[str]:
    """The shell commands that record ``names``, each file's missing variants trained first (after the corpus), each
    into data/<stage>-ablation/<variant>."""
    python = shlex.quote(sys.executable)
    training = []
    for name in names:
        stage, variants = ABLATIONS.get(name, (None, {}))
        for variant, options in variants.items():
            folder = f"data/{stage}-ablation/{variant}"
            if not (ROOT / folder / "config.json").exists():
                training.append(f"{python} -m specbook.train --stages {stage} {options} --{stage}-dir {folder}")
    out = [f"{python} -m specbook.train --stages corpus"] + training if training else []
    for name in names:
        command = RECORDED_BY[name]
        out.append(f"{python} {command.removeprefix('python ')}" if command.startswith("python ") else command)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help=f"comma-separated files, of {', '.join(RECORDED_BY)} (default: all)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args()
    names = list(RECORDED_BY) if args.only is None else args.only.split(",")
    unknown = [name for name in names if name not in RECORDED_BY]
    if unknown:
        parser.error(f"--only: {unknown} are not recorded files; choose from {', '.join(RECORDED_BY)}")
    for command in commands(names):
        print(f"$ {command}", flush=True)
        if args.dry_run:
            continue
        started = time.perf_counter()
        if subprocess.run(command, shell=True, cwd=ROOT).returncode:
            sys.exit(f"failed: {command}")
        print(f"  {(time.perf_counter() - started) / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
