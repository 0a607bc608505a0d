"""tox plugin: let tox find every Python that pyenv installed.

pyenv's shims answer only for the selected version, so on a machine where
3.10 to 3.13 are installed through pyenv, tox would find just one of them.
This exposes each installed ``python3.X`` on PATH for tox's own discovery;
elsewhere it does nothing.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tox.plugin import impl


@impl
def tox_add_core_config(core_conf: Any, state: Any) -> None:
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if not root.is_dir():
        return
    links = Path(tempfile.mkdtemp(prefix="tox-pythons-"))
    atexit.register(shutil.rmtree, links, ignore_errors=True)
    for version in sorted(root.iterdir()):
        match = re.fullmatch(r"(3\.\d+)\.\d+", version.name)
        python = version / "bin" / f"python{match.group(1)}" if match else None
        if python is not None and python.exists() and not (links / python.name).exists():
            (links / python.name).symlink_to(python)
    os.environ["PATH"] = f"{links}{os.pathsep}{os.environ.get('PATH', '')}"
