"""The client installs alone: a fresh venv gets httpx and nothing of the server."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.support import LiveServer

ROOT = Path(__file__).resolve().parents[1]
# httpx and what httpx itself needs; anything else means a server dependency leaked in
CLIENT_CLOSURE = {
    "anyio",
    "certifi",
    "exceptiongroup",
    "h11",
    "httpcore",
    "httpx",
    "idna",
    "lightpath",
    "pip",
    "setuptools",
    "sniffio",
    "typing-extensions",
    "typing_extensions",
}
SERVER_ONLY = ("fastapi", "uvicorn", "sqlalchemy", "pydantic", "numpy", "redis", "typer")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_fresh_venv_gets_the_client_and_no_server_dependency(
    tmp_path: Path, server: LiveServer
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("app", "lightpath_client"):
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    install = subprocess.run(
        [str(bin_dir / "pip"), "install", "--quiet", str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    listed = subprocess.run(
        [str(bin_dir / "pip"), "list", "--format=freeze"], capture_output=True, text=True
    ).stdout
    installed = {line.split("==")[0].lower() for line in listed.splitlines() if "==" in line}
    assert installed <= CLIENT_CLOSURE, installed - CLIENT_CLOSURE
    assert "httpx" in installed and not installed & set(SERVER_ONLY)

    python = str(bin_dir / "python")
    imported = subprocess.run(
        [python, "-c", "import lightpath_client, sys; print(sorted(sys.modules))"],
        capture_output=True,
        text=True,
    )
    assert imported.returncode == 0, imported.stderr
    assert not any(f"'{name}'" in imported.stdout for name in SERVER_ONLY)

    lightpath = str(bin_dir / "lightpath")
    with server.client() as c:
        c.post("/v1/jobs", json={"job_id": "from-venv", "parallelism": {"dp": 1, "pp": 1}})
    jobs = subprocess.run(
        [lightpath, "jobs", "--server", server.url], capture_output=True, text=True, timeout=60
    )
    assert jobs.returncode == 0 and "from-venv" in jobs.stdout, jobs.stderr
    serve = subprocess.run([lightpath, "serve"], capture_output=True, text=True, timeout=60)
    assert serve.returncode == 2 and "lightpath[server]" in serve.stderr
    assert sys.executable != python
