"""Print the package's dependencies pinned at their declared floors, one ``name==version`` a line.

`make test-floors` installs these into a separate environment and runs the unit tests there, so
every lower bound in pyproject.toml is a version the package was tested with. ``--except NAME``
leaves a dependency out (torch: the floors environment keeps the pinned build of requirements.txt).
"""

import argparse
import re
import tomllib
from pathlib import Path


def floors(pyproject: Path) -> dict[str, str]:
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    pins = {}
    for dependency in dependencies:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][^,;\s]*)", dependency)
        if match is None:
            raise SystemExit(f"{pyproject}: {dependency!r} must read NAME>=FLOOR so that its floor can be tested")
        pins[match[1]] = match[2]
    return pins


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    parser.add_argument("--except", dest="excluded", action="append", default=[], metavar="NAME")
    args = parser.parse_args()
    for name, version in floors(args.pyproject).items():
        if name not in args.excluded:
            print(f"{name}=={version}")


if __name__ == "__main__":
    main()
