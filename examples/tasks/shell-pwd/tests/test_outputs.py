from pathlib import Path

import os

def test_exists():
    assert Path("where.txt").is_file()

def test_absolute():
    assert Path("where.txt").read_text().startswith("/")

def test_value():
    assert Path("where.txt").read_text().strip() == os.getcwd()
