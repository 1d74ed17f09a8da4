"""The layering rule of docs/architecture.md holds: ``lint-imports`` (import-linter) checks the contracts written in
pyproject.toml against the code, and a contract breaks when a module imports one above it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    # From the checkout's own directory: import-linter reads pyproject.toml there and imports nothing it analyses.
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(cwd), "NO_COLOR": "1", "COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_every_contract_is_kept() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    """The proxy core importing a policy (what proxy/body_override.py did with the upload guard's sniffer)."""
    for name in ("gateway", "sandbox"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    gate = tmp_path / "gateway" / "proxy" / "gate.py"
    gate.write_text(gate.read_text() + "\nfrom ..policies.legacy_upload_guard import multipart_sniffer  # noqa\n")
    result = _lint(tmp_path)
    assert result.returncode == 1
    assert "BROKEN" in result.stdout and "gateway.proxy.gate -> gateway.policies.legacy_upload_guard" in result.stdout
