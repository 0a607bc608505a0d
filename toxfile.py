"""tox plugin: let tox find every Python that pyenv installed.

pyenv's shims answer only for the selected version, so on a machine where
3.10 to 3.13 are installed through pyenv, tox would find just one of them.
This exposes each installed ``python3.X`` on PATH for tox's own discovery;
elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from tox.plugin import impl


@impl
def tox_add_core_config(core_conf: Any, state: Any) -> None:
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if not root.is_dir():
        return
    # A fixed place, kept after the run: environments that uv creates point
    # their python at the link they were made from.
    links = Path(tempfile.gettempdir()) / f"tox-pythons-{os.getuid()}"
    links.mkdir(exist_ok=True)
    for version in sorted(root.iterdir()):
        match = re.fullmatch(r"(3\.\d+)\.\d+", version.name)
        python = version / "bin" / f"python{match.group(1)}" if match else None
        if python is None or not python.exists():
            continue
        link = links / python.name
        if link.is_symlink() and not link.exists():
            link.unlink()  # to a version uninstalled since
        if not link.exists():
            with contextlib.suppress(FileExistsError):  # another run made it meanwhile
                link.symlink_to(python)
    os.environ["PATH"] = f"{links}{os.pathsep}{os.environ.get('PATH', '')}"
