"""`python -m gpuwatch ARGS`: runs the `gpuwatch` executable this package installed."""

import os
import sys
import sysconfig


def executable() -> str:
    """The gpuwatch executable installed with this package (the environment's scripts
    directory, else the user scheme's, else PATH)."""
    names = [sysconfig.get_path("scripts")]
    user_scheme = f"{os.name}_user"
    if user_scheme in sysconfig.get_scheme_names():
        names.append(sysconfig.get_path("scripts", scheme=user_scheme))
    for d in names:
        exe = os.path.join(d, "gpuwatch")
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            return exe
    for d in os.environ.get("PATH", "").split(os.pathsep):
        exe = os.path.join(d, "gpuwatch")
        if d and os.path.isfile(exe) and os.access(exe, os.X_OK):
            return exe
    sys.exit("gpuwatch: the executable is not installed beside this package")


if __name__ == "__main__":
    exe = executable()
    os.execv(exe, [exe, *sys.argv[1:]])
