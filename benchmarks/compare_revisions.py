"""Run benchmarks on another revision and on this checkout, side by side in one run.

    python benchmarks/compare_revisions.py e96d200 [--bench decisions,sim,xds,ttft,routing]
        [--rounds 2]

The other revision is checked out into a temporary git worktree and run with this checkout's
installed packages (a throw-away virtualenv whose path puts the worktree first, with
``envoy/`` linked as ``envoy_control`` as the editable install does, and a ``modelfleet``
command of its own), so only the code differs. Each round runs every benchmark on both sides,
alternating which goes first; the figures are printed as each benchmark prints them. This is
how a refactoring shows that it changed no figure beyond the machine's noise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCHES = {
    "decisions": ["benchmarks/bench_gateway_decisions.py", "--requests", "3000"],
    "sim": ["benchmarks/bench_sim_speed.py", "--seconds", "60"],
    "xds": ["benchmarks/bench_xds_convergence.py", "--changes", "20"],
    "ttft": ["benchmarks/bench_gateway_ttft.py", "--duration", "8"],
    "routing": ["benchmarks/bench_routing_ab.py", "--requests", "200"],
}
LAUNCHER = """#!{python}
import sys
from modelfleet.{module} import main
sys.exit(main())
"""


def other_python(worktree: Path, home: Path) -> Path:
    """A virtualenv in ``home`` that imports the worktree's code over this one's packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home)], check=True)
    links = worktree / ".compare-path"
    links.mkdir()
    (links / "envoy_control").symlink_to(worktree / "envoy")
    site = Path(subprocess.run([str(home / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    ours = sysconfig.get_paths()["purelib"]
    site.joinpath("compare.pth").write_text(f"{worktree}\n{links}\n{ours}\n")
    python = home / "bin" / "python"
    module = "cli.main" if (worktree / "modelfleet" / "cli").is_dir() else "cli"
    launcher = home / "bin" / "modelfleet"
    launcher.write_text(LAUNCHER.format(python=python, module=module))
    launcher.chmod(0o755)
    envoy = shutil.which("envoy", path=str(Path(sys.executable).parent))
    if envoy:
        (home / "bin" / "envoy").symlink_to(envoy)
    return python


def run(label: str, cwd: Path, python: Path, bench: list[str]) -> None:
    """Run one benchmark and print its output under ``label``."""
    print(f"--- {label}: {' '.join(bench)}", flush=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(python), *bench], cwd=cwd, env=env, capture_output=True, text=True)
    print((done.stdout + done.stderr).rstrip() or f"(exit {done.returncode}, no output)", flush=True)


def main() -> int:
    """Entry point; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("revision", help="the revision to compare with this checkout (e.g. a commit)")
    ap.add_argument("--bench", default=",".join(BENCHES), help="comma-separated: " + ", ".join(BENCHES))
    ap.add_argument("--rounds", type=int, default=2, help="runs of each benchmark per side")
    args = ap.parse_args()
    chosen = [b for b in args.bench.split(",") if b]
    unknown = set(chosen) - set(BENCHES)
    if unknown:
        ap.error(f"unknown benchmarks {sorted(unknown)}")
    with tempfile.TemporaryDirectory(prefix="modelfleet-compare-") as tmp:
        worktree = Path(tmp) / "worktree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(worktree),
                        args.revision], check=True)
        try:
            theirs = other_python(worktree, Path(tmp) / "venv")
            sides = [(args.revision, worktree, theirs), ("this checkout", REPO, Path(sys.executable))]
            for round_ in range(args.rounds):
                for name in chosen:
                    for label, cwd, python in (sides if round_ % 2 == 0 else sides[::-1]):
                        run(f"{name}, round {round_ + 1}, {label}", cwd, python, BENCHES[name])
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)],
                           check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
