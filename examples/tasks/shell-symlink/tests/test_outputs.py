from pathlib import Path

import os

def test_exists():
    assert Path("link.txt").exists()

def test_is_symlink():
    assert Path("link.txt").is_symlink()

def test_points_to_target():
    assert os.readlink("link.txt") == "target.txt"

def test_content():
    assert Path("link.txt").read_text() == "target\n"
