"""Inductor's cache persists under pooljobs' folder, keyed by torch version and device,
unless the user chose one."""

from __future__ import annotations

import torch

from states.compiling import cache_dir, persist_caches


def test_cache_goes_under_pooljobs_folder_keyed_by_torch_and_device(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLJOBS_CACHE", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    folder = persist_caches(torch.device("cpu"))
    assert folder == cache_dir(torch.device("cpu")) and folder.is_dir()
    assert folder.parent == tmp_path / "inductor" and torch.__version__.split("+")[0] in folder.name
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder)


def test_a_cache_the_user_chose_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLJOBS_CACHE", str(tmp_path / "ours"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "theirs"))
    assert persist_caches(torch.device("cpu")) == tmp_path / "theirs"
    assert not (tmp_path / "ours").exists()
